"""split: the three forms of edges against list slicing, what a segment is, peeling, validation."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from seqloader.sequences.base import SliceView, source_indices
from strategies import check_against_oracle


@given(st.lists(st.integers(), max_size=20), st.data())
def test_boundaries_match_list_slices(xs, data):
    n = len(xs)
    edges = sorted(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=6)))
    cuts = [0, *edges, n]
    expected = [xs[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    check_against_oracle(sl.split(xs, edges), expected)
    check_against_oracle(sl.split(xs, np.array(edges, dtype=np.uint16)), expected)
    assert [list(s) for s in sl.split(sl.smap(abs, xs), edges)] == [[abs(x) for x in e] for e in expected]


@given(st.lists(st.integers(), max_size=20), st.data())
def test_pairs_match_list_slices(xs, data):
    n = len(xs)
    starts = data.draw(st.lists(st.integers(0, n), max_size=6))
    pairs = [(a, data.draw(st.integers(a, n))) for a in starts]
    edges = pairs if pairs else np.zeros((0, 2), dtype=int)
    check_against_oracle(sl.split(xs, edges), [xs[a:b] for a, b in pairs])
    assert [sl.split(xs, edges).segment_range(k) for k in range(len(pairs))] == [range(a, b) for a, b in pairs]


@pytest.mark.parametrize("n, cuts", [(0, 0), (0, 3), (1, 0), (12, 0), (12, 1), (12, 2), (12, 3), (12, 5), (12, 11)])
def test_an_int_is_a_number_of_cuts_into_equal_parts(n, cuts):
    xs = list(range(n))
    step = n // (cuts + 1)
    check_against_oracle(sl.split(xs, cuts), [xs[i * step:(i + 1) * step] for i in range(cuts + 1)])
    assert len(sl.split(xs, np.int64(cuts))) == cuts + 1


def test_a_segment_is_the_parents_own_slice_or_a_lazy_view():
    arr = np.arange(10)
    seg = sl.split(arr, [3])[0]
    assert isinstance(seg, np.ndarray) and np.shares_memory(seg, arr) and seg.tolist() == [0, 1, 2]
    assert sl.split(list(range(5)), [2])[1] == [2, 3, 4]
    assert sl.split("abcd", 1)[1] == "cd" and sl.split(range(10), [4])[1] == range(4, 10)

    class Dataset:  # int-only __getitem__, like many torch datasets
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if not isinstance(i, int):
                raise TypeError("ints only")
            return i * 10

    seg = sl.split(Dataset(), [(1, 4)])[0]
    assert isinstance(seg, SliceView) and list(seg) == [10, 20, 30]


def test_segments_of_lazy_sequences_are_views_that_source_indices_peels():
    data = list(range(100, 120))
    segs = sl.split(sl.shuffle(data, seed=3), [5, 12])
    seg = segs[1]
    assert isinstance(seg, SliceView)
    base, pos = source_indices(seg, np.arange(len(seg)))
    assert base is data and [data[j] for j in pos] == list(seg) == list(sl.shuffle(data, seed=3))[5:12]
    assert isinstance(sl.split(sl.shuffle(data, 3)[2:], 1)[0], SliceView)  # a view of a view folds


def test_nothing_is_read_until_a_segments_items_are():
    reads = []
    segs = sl.split(sl.smap(lambda i: reads.append(i) or i, range(10)), [(2, 8)])
    seg = segs[0]
    assert reads == [] and seg[-1] == 7 and reads == [7]


@pytest.mark.parametrize("edges, exc, msg", [
    ([6, 4], ValueError, "split: boundaries must be non-decreasing (edges[1] = 4 < edges[0] = 6)"),
    ([11], IndexError, "split: edges[0] = 11 out of range [0, 10] (the boundaries of len(seq) = 10 items)"),
    ([2, -1], IndexError, "split: edges[1] = -1 out of range [0, 10]"),
    ([(3, 2)], IndexError, "split: edges[0] = (3, 2) is not a segment of len(seq) = 10 items (need 0 <= start <= stop <= 10)"),
    ([(0, 2), (5, 11)], IndexError, "split: edges[1] = (5, 11) is not a segment"),
    ([(-1, 2)], IndexError, "split: edges[0] = (-1, 2) is not a segment"),
    (3, ValueError, "split: edges=3 cuts make 4 equal parts, which must divide len(seq) = 10 (remainder 2)"),
    (-1, ValueError, "split: edges must be a non-negative int (got -1)"),
    ([], ValueError, "split: edges is empty, which is ambiguous"),
    ((), ValueError, "split: edges is empty, which is ambiguous"),
    (True, TypeError, "split: edges must be an int, a 1-D list of boundaries or a list of (start, stop) pairs (got bool True)"),
    (2.0, TypeError, "split: edges must be an int, a 1-D list of boundaries or a list of (start, stop) pairs (got float)"),
    ("12", TypeError, "split: edges must be an int, a 1-D list of boundaries"),
    ([1.5], TypeError, "split: edges must hold ints (got dtype float64)"),
    ([[0, 1], [2]], TypeError, "split: edges must be an int, a 1-D list of boundaries or a list of (start, stop) pairs (got a ragged list)"),
    ([(0, 1, 2)], ValueError, "split: edges must be an int, a 1-D list of boundaries or a list of (start, stop) pairs (got shape (1, 3))"),
    ([2**70], TypeError, "split: edges must hold ints below 2**63"),
])
def test_split_validates_edges_at_construction(edges, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.split(list(range(10)), edges)


def test_split_rejects_a_non_sequence_and_has_a_repr():
    with pytest.raises(TypeError, match=re.escape("split: seq must be a sequence")):
        sl.split(5, 1)
    assert repr(sl.split(range(10), 1)) == "split(2 equal parts, len=2)"
    assert repr(sl.split(range(10), [3, 4])) == "split(2 boundaries, len=3)"
    assert repr(sl.split(range(10), [(3, 4)])) == "split(pairs, len=1)"
    with pytest.raises(IndexError, match=re.escape("split(pairs, len=1): index 1 out of range [-1, 1)")):
        sl.split(range(10), [(3, 4)])[1]
