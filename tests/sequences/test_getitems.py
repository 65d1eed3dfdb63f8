"""Batched reads through index maps and ``smap``: one ``__getitems__`` call on the data stage per batch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl


class Batched(list):
    """A data stage with a batched read that counts its calls."""

    def __init__(self, n):
        super().__init__(range(n))
        self.calls = []

    def __getitems__(self, positions):
        self.calls.append(list(positions))
        return [self[p] for p in positions]


def ten_times(x):
    return 10 * x


def explode_at_7(x):
    if x == 7:
        raise ValueError("bad 7")
    return x


@given(n=st.integers(1, 40), seed=st.integers(0, 100), data=st.data())
def test_a_chain_of_index_maps_reads_its_batch_in_one_call(n, seed, data):
    base = Batched(n)
    chain = sl.smap(ten_times, sl.gather(sl.shuffle(base, seed=seed), list(range(n - 1, -1, -1)))[::1])
    positions = data.draw(st.lists(st.integers(0, n - 1), max_size=8))
    assert chain.__getitems__(positions) == [chain[p] for p in positions]
    assert len(base.calls) == 1


def test_a_block_shuffle_over_a_source_reads_in_batches():
    base = Batched(12)
    order = sl.block_shuffle(base, [4, 8, 12], window=1, seed=0)
    assert order.__getitems__([0, 5, 11]) == [order[0], order[5], order[11]] and len(base.calls) == 1


def test_no_batched_read_without_one_below_and_errors_name_the_item():
    assert sl.shuffle(list(range(5)), seed=1).__getitems__ is None
    assert sl.smap(ten_times, list(range(5))).__getitems__ is None
    assert sl.smap(max, Batched(3), Batched(3)).__getitems__ is None  # several sequences: item by item
    with pytest.raises(ValueError, match="bad 7") as info:
        sl.smap(explode_at_7, Batched(10)).__getitems__([1, 7])
    assert any("smap(explode_at_7" in n and "at item 7" in n for n in info.value.__notes__)
