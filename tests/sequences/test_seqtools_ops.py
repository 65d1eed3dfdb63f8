"""The ops ported from seqtools, together: random pipelines against list oracles (tests/strategies.py,
``ALL_OPS``), peeling through ``cycle``, reprs, and a pipeline of every one of them read through
``prefetch`` in ``spawn`` workers (pickled, each worker with its own caches) with seeks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import seqloader as sl
from seqloader.sequences.base import IndexMap, LazySequence, source_indices
from strategies import ALL_OPS, check_against_oracle, pair, pipelines, slices


@settings(max_examples=200)
@given(pipelines(max_depth=5, ops=ALL_OPS), st.lists(st.tuples(slices, slices), max_size=3))
def test_pipelines_with_the_seqtools_ops_match_list_oracle(p, slice_pairs):
    for op in p.ops:
        event(op.split("(")[0] if not op.startswith("[") else "slice")
    check_against_oracle(p.seq, p.oracle, slice_pairs)


@given(pipelines(ops=("gather", "shuffle", "repeat", "cycle", "shard", "slice"), max_depth=5), st.data())
def test_source_indices_peels_through_cycle(p, data):
    n = len(p.oracle)
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=20)) if n else []
    base, pos = source_indices(p.seq, idx)
    assert not isinstance(base, IndexMap)
    assert [base[j] for j in pos.tolist()] == [p.oracle[i] for i in idx]


def test_every_new_op_is_a_lazy_sequence_with_a_repr_naming_it():
    cases = {
        "add_cache(cache_size=1, len=3)": sl.add_cache(range(3)),
        "cycle(limit=5, len=5)": sl.cycle(range(3), 5),
        "unbatch(batch_size=2, last_batch_size=1, len=3)": sl.unbatch([[0, 1], [2]], 2, 1),
        "batch(k=2, drop_last=False, pad=None, len=2)": sl.batch(range(3), 2, pad=None),
        "split(3 boundaries, len=4)": sl.split(range(6), [1, 2, 3]),
        "interleave(2 seqs, len=5)": sl.interleave(range(3), range(2)),
        "case(2 seqs, len=2)": sl.case([0, 1], "ab", "cd"),
        "switch(len=2)": sl.switch([True, False], "ab", "cd"),
        "collate(2 seqs, len=2)": sl.collate(["ab", "cd"]),
        "starmap(pair, len=1)": sl.starmap(pair, [(1, 2)]),
    }
    for text, seq in cases.items():
        assert isinstance(seq, LazySequence)
        assert repr(seq) == text


# -- every op in spawn workers (module-level functions only) -------------------------------------------

def square(x):
    return x * x


def first(seg):
    return seg[0]


def neg(x):
    return -x


def total(a, b):
    return a + b


def build():
    """A pipeline of every ported op; 15 items."""
    base = sl.smap(square, range(24))
    firsts = sl.smap(first, sl.split(base, 3))                        # 4 segments of 6: 0, 36, 144, 324
    mixed = sl.interleave(base[:5], sl.cycle(firsts, 7))              # 12 items
    chosen = sl.case([0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0], mixed, sl.smap(neg, mixed))
    switched = sl.switch([i % 3 != 0 for i in range(12)], chosen, mixed)
    summed = sl.starmap(total, sl.collate([switched, mixed]))
    batches = sl.batch(sl.add_cache(summed, 2), 5, pad=-1)           # 3 batches, the last padded
    return sl.unbatch(sl.add_cache(batches), 5)


def oracle():
    base = [x * x for x in range(24)]
    firsts = [base[6 * k] for k in range(4)]
    cyc = [firsts[i % 4] for i in range(7)]
    mixed = [x for j in range(7) for x in ((base[:5][j],) if j < 5 else ()) + (cyc[j],)]
    sel = [0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0]
    chosen = [m if s == 0 else -m for s, m in zip(sel, mixed)]
    switched = [c if i % 3 != 0 else m for i, (c, m) in enumerate(zip(chosen, mixed))]
    return [a + b for a, b in zip(switched, mixed)] + [-1] * 3


def test_the_pipeline_of_every_op_matches_its_oracle_in_process():
    seq = build()
    check_against_oracle(seq, oracle())


@pytest.mark.mp
@pytest.mark.timeout(300)
def test_every_op_reads_the_same_through_spawn_workers_with_seeks():
    seq, expected = build(), oracle()
    positions = [7, 0, 1, -1, 3, 3, 14, 5]
    with sl.prefetch(seq, num_workers=2, multiprocessing_context="spawn") as p:
        assert [p[i] for i in positions] == [expected[i] for i in positions]
        assert list(p) == expected
        assert list(p[9:2:-3]) == expected[9:2:-3]
    assert [int(x) for x in np.asarray(list(seq))] == expected
