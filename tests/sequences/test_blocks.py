"""``block_shuffle``: the op over ``BlockPermutation`` against a list oracle, its block arguments,
its errors, and ``source_indices`` peeling it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from seqloader.orders.block_permutation import BlockPermutation
from seqloader.sequences.base import source_indices
from strategies import check_against_oracle, seeds, slices


class Shards:
    """A stand-in data source with natural boundaries: ``blocks()`` returns cumulative ends."""

    def __init__(self, sizes):
        self.ends = np.cumsum(sizes).tolist()
        self.items = [f"row{i}" for i in range(self.ends[-1] if self.ends else 0)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def blocks(self):
        return self.ends


@given(st.lists(st.integers(0, 9), max_size=8), st.one_of(st.none(), st.integers(0, 4)), seeds,
       st.integers(1, 3), st.integers(1, 5), st.lists(st.tuples(slices, slices), max_size=2))
def test_block_shuffle_matches_its_permutation(sizes, window, seed, lanes, chunk, slice_pairs):
    src = Shards(sizes)
    n = len(src)
    order = BlockPermutation(src.ends, window, seed, lanes, chunk)(np.arange(n)).tolist()
    seq = sl.block_shuffle(src.items, src.ends, window=window, seed=seed, lanes=lanes, chunk=chunk)
    check_against_oracle(seq, [src.items[j] for j in order], slice_pairs)
    via_source = sl.block_shuffle(src, src, window=window, seed=seed, lanes=lanes, chunk=chunk)
    assert list(via_source) == list(seq)
    if n:
        pos = np.arange(n)[::-1]
        base, got = source_indices(seq[::-1][::-1], pos)  # slices and block_shuffle peel in one go
        assert base is src.items and got.tolist() == [order[p] for p in pos]


def test_block_shuffle_reads_blocks_together():
    seq = sl.block_shuffle(range(12), [4, 8, 12], window=1, seed=0)
    assert sorted(sorted(seq[k:k + 4]) for k in (0, 4, 8)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert repr(seq) == "block_shuffle(blocks=3, window=1, seed=0, lanes=1, chunk=1, len=12)"
    assert list(sl.block_shuffle(range(5), [5], window=0, seed=0)) == [0, 1, 2, 3, 4]
    assert list(sl.block_shuffle([], [], window=None, seed=0)) == []


@pytest.mark.parametrize("args, kwargs, exc, msg", [
    ((range(12), [4, 8]), {"window": 1, "seed": 0}, ValueError,
     "block_shuffle: the last block end is 8 but len(seq) is 12; blocks must be the cumulative ends"),
    ((range(3), [2, 1]), {"window": 1, "seed": 0}, ValueError,
     "block_shuffle: block_ends must be non-decreasing cumulative ends"),
    ((range(3), [3]), {"window": -2, "seed": 0}, ValueError,
     "block_shuffle: window must be None (a full shuffle) or an int >= 0 (got -2)"),
    ((range(3), [3]), {"window": "full", "seed": 0}, TypeError,
     "block_shuffle: window must be None (a full shuffle) or an int >= 0 (got str 'full')"),
    ((range(3), [3]), {"window": 1, "seed": 2**64}, ValueError, "block_shuffle: seed must be < 2**64"),
    ((range(3), [3]), {"window": 1, "seed": 0, "lanes": 0}, ValueError,
     "block_shuffle: lanes must be a positive int (got 0)"),
    ((range(3), [3]), {"window": 1, "seed": 0, "chunk": 1.0}, TypeError,
     "block_shuffle: chunk must be an int (got float 1.0)"),
    ((3, [3]), {"window": 1, "seed": 0}, TypeError, "block_shuffle: seq must be a sequence"),
])
def test_argument_errors_name_op_and_argument(args, kwargs, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.block_shuffle(*args, **kwargs)
