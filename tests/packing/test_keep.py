"""``keep``: against a list comprehension, positions back to the input, masks, blocks, errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from packing_helpers import BatchedDocs
from seqloader.sequences.base import source_indices
from strategies import check_against_oracle, slices


def is_odd(x):
    return x % 2 == 1


def flagged(flags, x):
    return flags[int(x[1:])]


@given(st.lists(st.booleans(), max_size=60), st.integers(1, 20), st.lists(st.tuples(slices, slices), max_size=2))
def test_kept_items_equal_the_comprehension(flags, window, slice_pairs):
    items = [f"x{i}" for i in range(len(flags))]
    want = [x for x, f in zip(items, flags) if f]
    by_mask = sl.keep(np.array(flags, dtype=bool), items, window=window)
    check_against_oracle(by_mask, want, slice_pairs)
    by_predicate = sl.keep(functools.partial(flagged, flags), items, window=window, cache=False)
    check_against_oracle(by_predicate, want)
    where = [i for i, f in enumerate(flags) if f]
    assert [by_mask.source_index(j) for j in range(len(want))] == where
    if where:
        assert source_indices(by_mask, np.arange(len(want))[::-1])[1].tolist() == where[::-1]
    ends = list(range(0, len(flags) + 1, 7)) + [len(flags)]
    assert by_mask.rank(ends).tolist() == [sum(flags[:e]) for e in ends]


def test_the_predicate_runs_once_per_item_at_build_and_reads_are_batched():
    docs = BatchedDocs(list(range(30)))
    kept = sl.keep(lambda d: len(d) % 3 == 0, docs, window=8, cache=False)
    assert len(kept) == 10 and docs.reads == 30 and docs.calls == 4  # one call per window
    docs.reads = docs.calls = 0
    kept.__getitems__([9, 0])  # via IndexMap: one batched read of the input
    assert docs.reads == 2 and docs.calls == 1
    stats = kept.index_stats()
    assert stats["kept"] == 10 and stats["items_read"] == 30 and stats["predicate"] == "evaluated"


def test_blocks_of_the_kept_items():
    class Blocky(list):
        def blocks(self):
            return np.array([4, 4, 10])

    kept = sl.keep(is_odd, Blocky(range(10)), window=3, cache=False)
    assert kept.blocks().tolist() == [2, 2, 5]
    with pytest.raises(TypeError, match=r"the input has no blocks\(\)"):
        sl.keep(is_odd, list(range(4)), cache=False).blocks()


def test_composes_with_pack_and_mix():
    lengths = [3, 0, 5, 2, 7, 1, 4]
    docs = [np.arange(1, n + 1) + 10 * i for i, n in enumerate(lengths)]
    kept = sl.keep(lambda d: len(d) % 2 == 1, docs, cache=False)
    packed = sl.pack(kept, 8, cache=False)
    got = sorted(t for x in packed for t in x["tokens"][x["loss_mask"]].tolist())
    assert got == sorted(t for d in docs if len(d) % 2 for t in d.tolist())
    even = sl.keep(lambda d: len(d) % 2 == 0, docs, cache=False)
    mixed = sl.mix([kept, even], [1, 1], seed=3)
    want = sl.mix([[d.tolist() for d in docs if len(d) % 2], [d.tolist() for d in docs if len(d) % 2 == 0]], [1, 1],
                  seed=3)
    assert [x.tolist() for x in mixed] == list(want) and len(mixed) == 7


def test_errors():
    with pytest.raises(TypeError, match=r"keep: predicate must be a callable or an array of bools"):
        sl.keep(3, [1, 2])
    with pytest.raises(TypeError, match=r"the predicate returned int 0 for item 0; it must return a bool"):
        len(sl.keep(lambda x: x, [0, 1], cache=False))

    def fails(x):
        raise KeyError(x)

    with pytest.raises(KeyError) as info:
        len(sl.keep(fails, ["a"], cache=False))
    assert info.value.__notes__ == ["seqloader: raised in keep(fails, window=4096, of=1) at item 0"]
    with pytest.raises(ValueError, match="keep: window must be a positive int"):
        sl.keep(is_odd, [1], window=0)
