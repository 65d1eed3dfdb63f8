"""The packing algorithms of one window, against the obvious implementations (``packing_helpers``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing_helpers import ref_assign, ref_pack, ref_pieces, ref_split
from seqloader.packing import _bins

lengths_lists = st.lists(st.integers(0, 30), max_size=40)


@given(st.lists(st.integers(1, 16), max_size=60), st.integers(16, 20), st.sampled_from(_bins.METHODS))
def test_assignment_equals_the_obvious_scan(sizes, capacity, method):
    fast = _bins.best_fit if method == "best_fit" else _bins.first_fit
    assert fast(sizes, capacity) == ref_assign(sizes, capacity, method)


@given(lengths_lists, st.integers(1, 12), st.sampled_from(["split", "truncate"]))
def test_pieces_cover_each_document(lengths, length, overlong):
    doc, start, size = _bins.pieces(np.array(lengths, dtype=np.int64), length, overlong)
    assert list(zip(doc.tolist(), start.tolist(), size.tolist())) == ref_pieces(lengths, length, overlong)
    assert (size > 0).all() and (size <= length).all()


@given(lengths_lists, st.integers(1, 12), st.integers(1, 7), st.sampled_from(_bins.METHODS),
       st.sampled_from(["split", "truncate"]))
def test_window_bins_and_items_equal_the_reference(lengths, length, window, method, overlong):
    lens = np.array(lengths, dtype=np.int64)
    want = ref_pack(lengths, length, window, method, overlong)
    counts, piece_ends, bins = _bins.window_bins(lens, window, length, method, overlong)
    assert int(counts.sum()) == len(want)
    got = []
    for w, a in enumerate(range(0, len(lengths), window)):
        lo = int(piece_ends[w - 1]) if w else 0
        for b in range(int(counts[w])):
            d, s, z = _bins.item_pieces(lens[a:a + window], a, bins[lo:int(piece_ends[w])], b, length, overlong)
            assert 0 < int(z.sum()) <= length
            got.append(list(zip(d.tolist(), s.tolist(), z.tolist())))
    assert got == want


@given(lengths_lists, st.integers(1, 12), st.integers(1, 7))
def test_chunk_pieces_equal_concat_and_chunk(lengths, length, window):
    lens = np.array(lengths, dtype=np.int64)
    want = ref_split(lengths, length)
    ends = _bins.chunk_ends(lens, window)
    assert (int(ends[-1]) if ends.size else 0) == sum(lengths)
    for j, pieces in enumerate(want):
        d, s, z = _bins.chunk_pieces(lens, ends, window, length, j)
        assert list(zip(d.tolist(), s.tolist(), z.tolist())) == pieces


def test_overlong_error_names_the_document():
    with pytest.raises(ValueError, match="^document 5 has 9 tokens, more than length=8$"):
        _bins.window_bins(np.array([1, 2, 3, 4, 5, 9]), 4, 8, "best_fit", "error")
