"""batch: sizes, the last partial batch, collate_fn, error notes and argument validation."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from strategies import check_against_oracle, collate_tuple


@given(st.lists(st.integers(), max_size=30), st.integers(1, 8), st.booleans())
def test_batch_matches_list_chunks(xs, k, drop_last):
    chunks = [xs[i:i + k] for i in range(0, len(xs), k)]
    if drop_last:
        chunks = [c for c in chunks if len(c) == k]
    check_against_oracle(sl.batch(xs, k, drop_last=drop_last), chunks)
    check_against_oracle(sl.batch(xs, k, drop_last, collate_tuple), [tuple(c) for c in chunks])


@pytest.mark.parametrize("n, k, drop_last, length", [
    (0, 3, False, 0), (0, 3, True, 0), (2, 3, False, 1), (2, 3, True, 0),
    (6, 3, False, 2), (6, 3, True, 2), (7, 3, False, 3), (7, 3, True, 2), (10**15, 7, False, 142857142857143),
])
def test_batch_length(n, k, drop_last, length):
    assert len(sl.batch(range(n), k, drop_last)) == length


def test_batch_reads_only_its_members():
    reads = []
    seq = sl.batch(sl.smap(lambda i: reads.append(i) or i, range(10)), 4)
    assert seq[-1] == [8, 9] and reads == [8, 9]
    assert seq._item(1) == [4, 5, 6, 7]
    assert seq.member_range(2) == range(8, 10)


def test_collate_error_keeps_type_and_names_the_batch():
    def collate(items):
        return items[2]

    seq = sl.batch(range(10), 3, collate_fn=collate)
    assert seq[0] == 2
    with pytest.raises(IndexError, match="list index out of range") as info:
        seq[3]
    assert info.value.__notes__ == [
        "seqloader: raised in batch(k=3, drop_last=False, collate_fn=collate, len=4) at item 3"]


def test_item_errors_are_annotated_by_their_own_stage():
    def bad(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad 4") as info:
        sl.batch(sl.smap(bad, range(6)), 2, collate_fn=list)[2]
    assert info.value.__notes__ == ["seqloader: raised in smap(bad, len=6) at item 4"]


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(k=0), ValueError, "batch: k must be a positive int (got 0)"),
    (dict(k=-2), ValueError, "batch: k must be a positive int (got -2)"),
    (dict(k=2.0), TypeError, "batch: k must be an int (got float 2.0)"),
    (dict(k=True), TypeError, "batch: k must be an int (got bool True)"),
    (dict(k=2, drop_last=1), TypeError, "batch: drop_last must be a bool (got int 1)"),
    (dict(k=2, drop_last=None), TypeError, "batch: drop_last must be a bool (got NoneType None)"),
    (dict(k=2, collate_fn="stack"), TypeError, "batch: collate_fn must be callable (got str 'stack')"),
    (dict(seq=5, k=2), TypeError, "batch: seq must be a sequence"),
])
def test_batch_argument_errors_name_op_and_argument(kwargs, exc, msg):
    kwargs.setdefault("seq", range(5))
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.batch(**kwargs)
