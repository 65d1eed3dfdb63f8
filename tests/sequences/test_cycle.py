"""cycle: seqtools' meaning (limit counts items), finite only; an IndexMap; and repeat kept as it was."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from seqloader.sequences.base import IndexMap, source_indices
from strategies import check_against_oracle


@given(st.lists(st.integers(), min_size=1, max_size=10), st.integers(0, 40))
def test_cycle_matches_itertools_cycle_cut_at_limit(xs, limit):
    check_against_oracle(sl.cycle(xs, limit), [xs[i % len(xs)] for i in range(limit)])


@given(st.lists(st.integers(), max_size=8), st.integers(0, 4))
def test_repeat_counts_copies_and_cycle_counts_items(xs, times):
    assert list(sl.repeat(xs, times)) == xs * times
    if xs:
        assert list(sl.cycle(xs, len(xs) * times)) == list(sl.repeat(xs, times))


def test_seqtools_repeat_ports_to_repeat_of_a_one_item_list():
    # seqtools.repeat(value, times) is [value] * times; seqloader.repeat tiles a sequence.
    assert list(sl.repeat([[1, 2]], 3)) == [[1, 2], [1, 2], [1, 2]]
    assert list(sl.repeat([1, 2], 3)) == [1, 2, 1, 2, 1, 2]
    with pytest.raises(TypeError, match=re.escape("repeat: seq must be a sequence")):
        sl.repeat(3, 10)  # seqtools.repeat(3, 10): a value, not a sequence


def test_cycle_is_lazy_and_peels():
    seq = sl.cycle(range(7), 10**15)
    assert isinstance(seq, IndexMap)
    assert len(seq) == 10**15 and seq[-1] == (10**15 - 1) % 7
    base, pos = source_indices(seq[5::3], np.array([0, 1, 2]))
    assert pos.tolist() == [5, 1, 4]
    assert seq._source_index(100) == seq._source_indices(np.array([100]))[0] == 2


def test_cycle_of_a_slice_and_a_slice_of_a_cycle():
    seq = sl.cycle(sl.shuffle(range(5), 0)[1:4], 8)
    inner = list(sl.shuffle(range(5), 0))[1:4]
    assert list(seq) == [inner[i % 3] for i in range(8)]
    assert list(seq[::-3]) == [inner[i % 3] for i in range(8)][::-3]


@pytest.mark.parametrize("args, exc, msg", [
    (([1, 2],), TypeError, "cycle: limit is required (got None): seqloader sequences are finite"),
    (([1, 2], None), TypeError, "cycle: limit is required (got None)"),
    (([1, 2], -1), ValueError, "cycle: limit must be a non-negative int (got -1)"),
    (([1, 2], 2.0), TypeError, "cycle: limit must be an int (got float 2.0)"),
    (([1, 2], True), TypeError, "cycle: limit must be an int (got bool True)"),
    (([1, 2], 2**63), ValueError, "cycle: limit must be < 2**63"),
    (([], 3), ValueError, "cycle: seq is empty, so it cannot fill limit=3 items"),
    ((5, 3), TypeError, "cycle: seq must be a sequence"),
])
def test_cycle_argument_errors(args, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.cycle(*args)


def test_cycle_of_nothing_to_nothing_and_its_repr():
    assert list(sl.cycle([], 0)) == []
    assert repr(sl.cycle("ab", 5)) == "cycle(limit=5, len=5)"
    with pytest.raises(IndexError, match=re.escape("cycle(limit=5, len=5): index 5 out of range [-5, 5)")):
        sl.cycle("ab", 5)[5]
