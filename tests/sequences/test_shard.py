"""shard: DistributedSampler's index layout, partition properties and argument validation.

This is the one test file of tests/sequences that imports torch (as the reference, not by seqloader).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

import seqloader as sl
from seqloader.sequences.base import source_indices
from strategies import check_against_oracle, shard_oracle


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 8])
def test_shard_equals_distributed_sampler(world_size, drop):
    for n in list(range(0, 20)) + [31, 64, 100]:
        for rank in range(world_size):
            ref = list(DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop))
            ours = sl.shard(range(n), rank, world_size, drop_remainder=drop)
            assert list(ours) == ref, (n, rank, world_size, drop)
            assert len(ours) == len(ref)


@given(st.lists(st.integers(), max_size=40), st.integers(1, 9), st.booleans(), st.data())
def test_shard_matches_oracle(xs, world_size, drop, data):
    rank = data.draw(st.integers(0, world_size - 1))
    check_against_oracle(sl.shard(xs, rank, world_size, drop), shard_oracle(xs, rank, world_size, drop))


@given(st.integers(0, 200), st.integers(1, 12), st.booleans())
def test_shard_parts_are_equal_disjoint_and_cover(n, world_size, drop):
    parts = [sl.shard(range(n), r, world_size, drop) for r in range(world_size)]
    lengths = {len(p) for p in parts}
    assert len(lengths) == 1
    positions = [source_indices(p, np.arange(len(p)))[1].tolist() for p in parts]
    # Disjoint as positions of the padded order; as items only the wrap-around padding repeats.
    flat = sorted(x for pos in positions for x in pos)
    if drop:
        assert len(flat) == len(set(flat)) == (n // world_size) * world_size
        assert set(flat) == set(range(len(flat)))
    else:
        assert set(flat) == set(range(n))
        assert len(flat) - n == (-n) % world_size if n else len(flat) == 0
    assert sum(lengths) * world_size == len(flat)


def test_shard_of_fewer_items_than_ranks_wraps_more_than_once():
    assert [list(sl.shard(range(2), r, 5)) for r in range(5)] == [[0], [1], [0], [1], [0]]
    assert [len(sl.shard(range(2), r, 5, drop_remainder=True)) for r in range(5)] == [0] * 5


def test_shard_of_an_empty_sequence_is_empty():
    assert [len(sl.shard([], r, 3)) for r in range(3)] == [0, 0, 0]


def test_shard_of_a_shuffle_peels_to_the_data():
    data = list(range(1000, 1010))
    parts = [sl.shard(sl.shuffle(data, 4), r, 3) for r in range(3)]
    assert sorted(set(x for p in parts for x in p)) == data
    base, pos = source_indices(parts[1], np.arange(len(parts[1])))
    assert base is data and [data[j] for j in pos] == list(parts[1])


@pytest.mark.parametrize("args, exc, msg", [
    ((2, 2), ValueError, "shard: rank must be in [0, world_size) (got rank=2, world_size=2)"),
    ((-1, 2), ValueError, "shard: rank must be in [0, world_size) (got rank=-1, world_size=2)"),
    ((0, 0), ValueError, "shard: world_size must be a positive int (got 0)"),
    ((0, 2.0), TypeError, "shard: world_size must be an int (got float 2.0)"),
    ((None, 2), TypeError, "shard: rank must be an int (got NoneType None)"),
    ((0, 2, "yes"), TypeError, "shard: drop_remainder must be a bool (got str 'yes')"),
])
def test_shard_argument_errors_name_op_and_argument(args, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.shard(range(5), *args)


def test_shard_rejects_a_non_sequence():
    with pytest.raises(TypeError, match=re.escape("shard: seq must be a sequence")):
        sl.shard(5, 0, 1)
