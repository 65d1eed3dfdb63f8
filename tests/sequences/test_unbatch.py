"""unbatch (the inverse of batch) and batch(pad=): list oracles, checked batch sizes, errors.

``tests/sequences/test_shape.py`` covers batch without ``pad`` and is unchanged.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from strategies import check_against_oracle, collate_tuple


@given(st.lists(st.integers(), max_size=30), st.integers(1, 6), st.booleans())
def test_unbatch_inverts_batch(xs, k, drop_last):
    kept = xs[:len(xs) // k * k] if drop_last else xs
    last = None if drop_last else len(xs) % k
    check_against_oracle(sl.unbatch(sl.batch(xs, k, drop_last), k, last), kept)
    check_against_oracle(sl.unbatch(sl.batch(xs, k, drop_last, collate_tuple), k, last), kept)
    if not xs or len(kept) == len(xs) and len(xs) % k == 0:
        check_against_oracle(sl.unbatch(sl.batch(xs, k), k), xs)


def test_unbatch_of_arrays_and_a_full_last_batch():
    batches = [np.arange(3), np.arange(3, 6)]
    u = sl.unbatch(batches, 3)
    assert [int(x) for x in u] == list(range(6)) and len(sl.unbatch(batches, 3, 0)) == 6
    assert len(sl.unbatch([], 4, 2)) == 0


@given(st.lists(st.integers(), max_size=30), st.integers(1, 6))
def test_pad_fills_only_a_short_last_batch(xs, k):
    chunks = [xs[i:i + k] for i in range(0, len(xs), k)]
    padded = [c + [None] * (k - len(c)) for c in chunks]
    check_against_oracle(sl.batch(xs, k, pad=None), padded)  # None is a value, not "no padding"
    check_against_oracle(sl.batch(xs, k, collate_fn=collate_tuple, pad=0),
                         [tuple(c + [0] * (k - len(c))) for c in chunks])
    assert list(sl.unbatch(sl.batch(xs, k, pad=-1), k)) == [x for c in chunks for x in c + [-1] * (k - len(c))]


def test_seqtools_batching_example():
    # seqtools' tests/test_shape.py::test_batching, on the reads it checks
    arr = list(range(137))
    expected = [[i + k for k in range(5)] for i in range(0, 135, 5)]
    assert list(sl.batch(arr, 5, True)) == expected
    assert list(sl.unbatch(expected, 5, 0)) == [x for b in expected for x in b]
    expected += [[135, 136]]
    assert list(sl.batch(arr, 5, False)) == expected
    assert list(sl.unbatch(expected, 5, len(arr) % 5)) == arr
    assert list(sl.batch(arr, 5, pad=0, collate_fn=list))[-1] == [135, 136, 0, 0, 0]


def test_pad_reaches_collate_fn_and_errors_name_the_batch():
    seen = []

    def collate(items):
        seen.append(list(items))
        return np.stack(items)

    b = sl.batch([np.ones(2)] * 3, 2, collate_fn=collate, pad=np.zeros(2))
    assert b[-1].tolist() == [[1.0, 1.0], [0.0, 0.0]] and len(seen[-1]) == 2
    assert repr(b) == "batch(k=2, drop_last=False, pad=array([0., 0.]), collate_fn=collate, len=2)"
    assert repr(sl.batch(range(3), 2, pad=np.zeros(100))) == "batch(k=2, drop_last=False, pad=<ndarray>, len=2)"
    bad = sl.batch(range(3), 2, collate_fn=sum, pad="x")
    with pytest.raises(TypeError) as info:
        bad[1]
    assert info.value.__notes__ == ["seqloader: raised in batch(k=2, drop_last=False, pad='x', collate_fn=sum, len=2) at item 1"]


def test_a_batch_of_the_wrong_size_raises_instead_of_shifting_items():
    u = sl.unbatch(sl.batch(range(7), 3), 3)
    assert len(u) == 9 and u[5] == 5
    with pytest.raises(ValueError, match=re.escape("unbatch(batch_size=3, len=9): batch 2 has 1 items, expected 3")):
        u[6]
    with pytest.raises(ValueError, match="batch 2 has 1 items, expected 3"):
        list(u)
    with pytest.raises(ValueError, match=re.escape("unbatch(batch_size=2, last_batch_size=1, len=3): batch 0 has 3 items, expected 2")):
        sl.unbatch([[1, 2, 3], [4]], 2, 1)[0]
    with pytest.raises(TypeError, match=re.escape("unbatch: seq[0] must be a sequence with __len__ and __getitem__ (got dict)")):
        sl.unbatch([{"x": 1}], 1)[0]


def test_iterating_reads_each_batch_once():
    calls = []

    def collate(items):
        calls.append(items[0])
        return items

    assert list(sl.unbatch(sl.batch(range(10), 4, collate_fn=collate), 4, 2)) == list(range(10))
    assert calls == [0, 4, 8]


@pytest.mark.parametrize("args, exc, msg", [
    (([[1]], 0), ValueError, "unbatch: batch_size must be a positive int (got 0)"),
    (([[1]], 2, 3), ValueError, "unbatch: last_batch_size must be at most batch_size (got 3 > 2)"),
    (([[1]], 2, -1), ValueError, "unbatch: last_batch_size must be a non-negative int (got -1)"),
    (([[1]], 2, 1.0), TypeError, "unbatch: last_batch_size must be an int (got float 1.0)"),
    (([[1]], "2"), TypeError, "unbatch: batch_size must be an int (got str '2')"),
    ((5, 2), TypeError, "unbatch: seq must be a sequence"),
])
def test_unbatch_argument_errors(args, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.unbatch(*args)


def test_pad_with_drop_last_is_refused():
    with pytest.raises(ValueError, match=re.escape("batch: pad and drop_last=True exclude each other")):
        sl.batch(range(5), 2, drop_last=True, pad=0)
    with pytest.raises(TypeError, match=re.escape("batch: collate_fn must be callable (got int 0)")):
        sl.batch(range(5), 2, False, 0)  # seqtools' positional pad lands on collate_fn: refused, not misread
