"""``pack``: items against an oracle, exactly ``length`` tokens, every token once, ``documents``,
the sequence protocol (indexing, slices, iteration, pickle, errors) and batched reads."""

from __future__ import annotations

import collections
import pickle
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from packing_helpers import SCALE, BatchedDocs, Docs, as_lists, item_from_pieces, ref_pack, ref_split, tokens_of
from strategies import slices

configs = st.fixed_dictionaries({
    "length": st.integers(1, 12), "window": st.integers(1, 6), "method": st.sampled_from(["best_fit", "first_fit"]),
    "split": st.booleans(), "overlong": st.sampled_from(["split", "truncate"])})


def oracle(lengths, cfg):
    if cfg["split"]:
        return ref_split(lengths, cfg["length"])
    return ref_pack(lengths, cfg["length"], cfg["window"], cfg["method"], cfg["overlong"])


@given(st.lists(st.integers(0, 25), max_size=30), configs, st.booleans(), st.lists(st.tuples(slices, slices), max_size=2))
def test_items_equal_the_oracle(lengths, cfg, given_lengths, slice_pairs):
    docs = Docs(lengths)
    packed = sl.pack(docs, lengths=lengths if given_lengths else None, cache=False, **cfg)
    want = oracle(lengths, cfg)
    n, length = len(want), cfg["length"]
    assert len(packed) == n
    items = [packed[j] for j in range(n)]
    for j, (item, pieces) in enumerate(zip(items, want)):
        assert {k: (v.shape, v.dtype) for k, v in item.items()} == {
            "tokens": ((length,), np.int64), "segment_ids": ((length,), np.int32),
            "positions": ((length,), np.int32), "loss_mask": ((length,), np.bool_)}
        tokens, seg, pos = item_from_pieces(pieces, length)
        assert item["tokens"].tolist() == tokens and item["segment_ids"].tolist() == seg
        assert item["positions"].tolist() == pos and item["loss_mask"].tolist() == [s > 0 for s in seg]
        assert packed.documents(j) == [(d, s, s + z) for d, s, z in pieces] == packed.documents(j - n)
    # the sequence protocol: negative indices, iteration, slices, pickle, batched reads, errors
    assert [as_lists(x) for x in items] == [as_lists(packed[j]) for j in range(-n, 0)]
    assert [as_lists(x) for x in packed] == [as_lists(x) for x in items]
    assert [as_lists(x) for x in packed.__getitems__(list(range(n))[::-1])] == [as_lists(x) for x in items[::-1]]
    for s1, s2 in slice_pairs:
        assert [as_lists(x) for x in packed[s1][s2]] == [as_lists(x) for x in items[s1][s2]]
    clone = pickle.loads(pickle.dumps(packed))
    assert [as_lists(x) for x in clone] == [as_lists(x) for x in items]
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=re.escape(f"{packed!r}: index {bad} out of range [-{n}, {n})")):
            packed[bad]
    with pytest.raises(IndexError, match="out of range"):
        packed.documents(n)


@given(st.lists(st.integers(0, 40), max_size=40), configs)
def test_every_token_appears_exactly_once(lengths, cfg):
    packed = sl.pack(Docs(lengths), cache=False, **{**cfg, "overlong": "split"})
    seen = collections.Counter()
    for item in packed:
        assert item["tokens"].size == cfg["length"]
        real = item["tokens"][item["loss_mask"]]
        assert (item["tokens"][~item["loss_mask"]] == 0).all()
        seen.update(real.tolist())
        # segments are contiguous, numbered 1..k, positions restart at 0 in each
        seg = item["segment_ids"]
        k = int(seg.max()) if seg.size else 0
        assert seg[: int((seg > 0).sum())].tolist() == sorted(seg[seg > 0].tolist())
        for s in range(1, k + 1):
            assert item["positions"][seg == s].tolist() == list(range(int((seg == s).sum())))
            # tokens of one segment come from one document, consecutively
            toks = item["tokens"][seg == s]
            assert len(set((toks - 1) // SCALE)) == 1 and (np.diff(toks) == 1).all()
    assert sorted(seen.elements()) == sorted(t for d, n in enumerate(lengths) for t in tokens_of(d, n).tolist())
    assert max(seen.values(), default=1) == 1


def test_truncate_drops_the_tail_and_split_keeps_it():
    docs = Docs([3, 11, 2])
    trunc = sl.pack(docs, 4, overlong="truncate", cache=False)
    assert [trunc.documents(j) for j in range(len(trunc))] == [[(0, 0, 3)], [(1, 0, 4)], [(2, 0, 2)]]
    split = sl.pack(docs, 4, overlong="split", cache=False)
    assert [split.documents(j) for j in range(len(split))] == [
        [(0, 0, 3)], [(1, 0, 4)], [(1, 4, 8)], [(1, 8, 11)], [(2, 0, 2)]]
    assert split[3]["positions"].tolist() == [0, 1, 2, 0]  # positions restart in each piece
    with pytest.raises(ValueError, match=r"document 1 has 11 tokens, more than length=4; pass overlong="):
        len(sl.pack(docs, 4, overlong="error", cache=False))


def test_a_batch_reads_its_documents_with_one_call():
    docs = BatchedDocs([5, 3, 7, 2, 6, 1, 4] * 3)
    packed = sl.pack(docs, 10, window=7, lengths=docs.lengths, cache=False)
    assert len(packed) and docs.reads == 0  # the index needs the lengths only
    items = packed.__getitems__([3, 0, 3, -1])
    assert docs.calls == 1
    wanted = {d for j in (3, 0, len(packed) - 1) for d, _, _ in packed.documents(j)}
    assert docs.reads == len(wanted)  # each document once, only those of the batch
    assert [as_lists(x) for x in items] == [as_lists(packed[j]) for j in (3, 0, 3, -1)]


def test_reading_an_item_reads_only_its_documents():
    docs = Docs(list(range(1, 50)))
    packed = sl.pack(docs, 64, window=16, lengths=docs.lengths, cache=False)
    packed[len(packed) // 2]
    assert docs.reads == len(packed.documents(len(packed) // 2))


def test_dtype_pad_id_and_an_empty_input():
    docs = Docs([2, 1])
    item = sl.pack(docs, 4, dtype=np.int32, pad_id=-1, cache=False)[0]
    assert item["tokens"].dtype == np.int32 and item["tokens"].tolist() == [1, 2, SCALE + 1, -1]
    empty = sl.pack(Docs([]), 4, cache=False)
    assert len(empty) == 0 and list(empty) == [] and empty.index_stats()["padding"] == 0.0
    assert len(sl.pack(Docs([0, 0]), 4, cache=False)) == 0
    with pytest.raises(ValueError, match=r"document 0 has token ids outside dtype uint8"):
        sl.pack([np.array([300])], 4, dtype=np.uint8, cache=False)[0]


def test_lengths_that_do_not_describe_the_input_are_refused_when_read():
    packed = sl.pack(Docs([3, 4]), 8, lengths=[3, 5], cache=False)
    with pytest.raises(ValueError, match=r"document 1 has 4 tokens but lengths= says 5; the lengths do not describe"):
        packed[0]


@pytest.mark.parametrize("kwargs, exc, msg", [
    ({"length": 0}, ValueError, "pack: length must be a positive int (got 0)"),
    ({"window": 1.5}, TypeError, "pack: window must be an int (got float 1.5)"),
    ({"method": "worst_fit"}, ValueError, "pack: method must be one of 'best_fit', 'first_fit' (got 'worst_fit')"),
    ({"overlong": None}, ValueError, "pack: overlong must be one of 'split', 'truncate', 'error' (got None)"),
    ({"split": 1}, TypeError, "pack: split must be a bool (got int 1)"),
    ({"dtype": np.float32}, TypeError, "pack: dtype must be an integer dtype (got float32)"),
    ({"pad_id": 256, "dtype": np.uint8}, ValueError, "pack: pad_id=256 does not fit dtype uint8"),
    ({"lengths": [1, 2]}, ValueError, "pack: lengths has 2 entries but the input has 3 items"),
    ({"lengths": [1.0, 2.0, 3.0]}, TypeError, "pack: lengths must be ints (got dtype float64)"),
    ({"lengths": [1, -2, 3]}, ValueError, r"pack: lengths\[1\] is -2; lengths must be >= 0"),
    ({"cache_dir": 3}, TypeError, "pack: cache_dir must be a str or None (got int)"),
])
def test_bad_arguments_are_named(kwargs, exc, msg):
    with pytest.raises(exc, match="^" + (msg if "\\" in msg else re.escape(msg))):
        sl.pack(Docs([1, 2, 3]), **{"length": 4, **kwargs})


def test_the_input_must_hold_token_arrays():
    with pytest.raises(TypeError, match=r"document 0 must be a 1-D array of token ids \(got str"):
        sl.pack(["abc"], 4, lengths=[3], cache=False)[0]
    with pytest.raises(TypeError, match="pack: seq must be a sequence"):
        sl.pack(3, 4)


def test_user_errors_keep_their_type_and_gain_a_note():
    def boom(i):
        raise KeyError(f"no document {i}")

    packed = sl.pack(sl.smap(boom, range(3)), 4, lengths=[1, 1, 1], cache=False)
    with pytest.raises(KeyError) as info:
        packed[0]
    assert any("raised in smap(boom" in n for n in info.value.__notes__)
