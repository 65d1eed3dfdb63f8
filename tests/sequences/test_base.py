"""Properties every pipeline of sequence ops shares with its list oracle (tests/strategies.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import seqloader as sl
from seqloader.sequences.base import IndexMap, LazySequence, SliceView, source_indices
from strategies import check_against_oracle, pipelines, slices


@settings(max_examples=400)
@given(pipelines(max_depth=5), st.lists(st.tuples(slices, slices), max_size=3))
def test_pipeline_matches_list_oracle(p, slice_pairs):
    event(f"depth {len(p.ops)}")
    for op in p.ops:
        event(op.split("(")[0] if not op.startswith("[") else "slice")
    event(f"len {'0' if not p.oracle else '1-9' if len(p.oracle) < 10 else '10+'}")
    check_against_oracle(p.seq, p.oracle, slice_pairs)


@given(pipelines(ops=("gather", "shuffle", "repeat", "shard", "slice"), max_depth=5), st.data())
def test_source_indices_peels_every_index_map(p, data):
    n = len(p.oracle)
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=20)) if n else []
    base, pos = source_indices(p.seq, idx)
    assert not isinstance(base, IndexMap)
    assert pos.dtype == np.int64
    assert [base[j] for j in pos.tolist()] == [p.oracle[i] for i in idx]


@given(pipelines(ops=("gather", "shuffle", "repeat", "shard", "slice"), max_depth=3), st.data())
def test_vectorised_and_scalar_source_indices_agree(p, data):
    seq = p.seq
    if isinstance(seq, IndexMap) and len(seq):
        idx = np.array(data.draw(st.lists(st.integers(0, len(seq) - 1), min_size=1, max_size=20)), dtype=np.int64)
        vec = seq._source_indices(idx)
        assert vec.dtype == np.int64
        assert vec.tolist() == [seq._source_index(int(i)) for i in idx]


def test_source_indices_through_a_composed_pipeline():
    data = list(range(100, 200))
    seq = sl.shard(sl.shuffle(sl.gather(data, np.arange(99, -1, -1)), seed=5)[10:90:3], 1, 4)
    base, pos = source_indices(seq, np.arange(len(seq)))
    assert base is data
    assert [data[j] for j in pos] == list(seq)


def test_source_indices_stops_at_a_data_stage():
    inner = sl.smap(str, range(10))
    seq = sl.gather(inner, [3, 1])
    base, pos = source_indices(seq, [0, 1])
    assert base is inner
    assert pos.tolist() == [3, 1]


def test_every_op_returns_a_lazy_sequence_with_a_repr_naming_it():
    cases = {
        "smap(str, len=3)": sl.smap(str, range(3)),
        "rng_map(draw_int, seed=1, len=3)": sl.rng_map(__import__("strategies").draw_int, range(3), 1),
        "gather(len=2)": sl.gather(range(3), [0, 1]),
        "shuffle(len=3, seed=4)": sl.shuffle(range(3), 4),
        "concatenate(2 seqs, len=5)": sl.concatenate([range(3), range(2)]),
        "repeat(times=2, len=6)": sl.repeat(range(3), 2),
        "batch(k=2, drop_last=False, len=2)": sl.batch(range(3), 2),
        "batch(k=2, drop_last=True, collate_fn=sum, len=1)": sl.batch(range(3), 2, drop_last=True, collate_fn=sum),
        "shard(rank=1, world_size=2, drop_remainder=False, len=2)": sl.shard(range(3), 1, 2),
    }
    for text, seq in cases.items():
        assert isinstance(seq, LazySequence)
        assert repr(seq) == text


def test_slices_fold_and_name_their_parent():
    seq = sl.shuffle(range(10), seed=0)
    view = seq[2:][::-2]
    assert isinstance(view, SliceView) and view._parent is seq
    assert repr(view) == "slice(shuffle(len=10, seed=0), 9:1:-2, len=4)"
    assert list(view) == list(seq)[2:][::-2]


def test_empty_sequences_are_falsy_and_index_nothing():
    for seq in (sl.shuffle([], 0), sl.batch([], 3), sl.shard([], 0, 2), sl.concatenate([]), sl.repeat([1], 0)):
        assert len(seq) == 0 and not seq and list(seq) == []
        with pytest.raises(IndexError, match=r"index 0 out of range \[-0, 0\)"):
            seq[0]


@pytest.mark.parametrize("key", [1.0, "1", None, True, [0]])
def test_non_integer_keys_raise_type_error_naming_the_stage(key):
    seq = sl.repeat(range(3), 2)
    with pytest.raises(TypeError, match=r"^repeat\(times=2, len=6\): indices must be integers or slices"):
        seq[key]


def test_numpy_integer_keys_are_accepted():
    seq = sl.shuffle(range(10), seed=1)
    assert seq[np.int64(3)] == seq[3] == seq[np.uint8(3)]
