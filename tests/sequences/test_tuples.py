"""collate and starmap: list oracles, notes on errors, argument errors, pickling."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from strategies import check_against_oracle, pair


@given(st.integers(0, 10), st.integers(1, 4), st.data())
def test_collate_is_a_lazy_zip(n, k, data):
    seqs = [data.draw(st.lists(st.integers(), min_size=n, max_size=n)) for _ in range(k)]
    check_against_oracle(sl.collate(seqs), list(zip(*seqs)))
    check_against_oracle(sl.collate(iter(seqs)), list(zip(*seqs)))


@given(st.lists(st.tuples(st.integers(), st.integers()), max_size=12))
def test_starmap_unpacks_each_item(items):
    check_against_oracle(sl.starmap(pair, items), [pair(*x) for x in items])
    a, b = [x for x, _ in items], [y for _, y in items]
    assert list(sl.starmap(pair, sl.collate([a, b]))) == list(sl.smap(pair, a, b))


def test_starmap_errors_keep_their_type_and_name_the_item():
    def div(a, b):
        return a // b

    seq = sl.starmap(div, [(4, 2), (1, 0), (1,)])
    assert seq[0] == 2
    with pytest.raises(ZeroDivisionError) as info:
        seq[1]
    assert info.value.__notes__ == ["seqloader: raised in starmap(div, len=3) at item 1"]
    with pytest.raises(TypeError, match="missing 1 required positional argument") as info:
        seq[-1]
    assert info.value.__notes__ == ["seqloader: raised in starmap(div, len=3) at item 2"]


def test_they_pickle_and_have_reprs():
    for seq, text in [(sl.collate([range(3), "abc"]), "collate(2 seqs, len=3)"),
                      (sl.starmap(pair, [(1, 2)]), "starmap(pair, len=1)")]:
        assert repr(seq) == text
        assert list(pickle.loads(pickle.dumps(seq))) == list(seq)


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: sl.collate([]), ValueError, "collate: seqs must hold at least one sequence (got none)"),
    (lambda: sl.collate([[1, 2], [3]]), ValueError, "collate: sequences must have equal lengths (got 2, 1)"),
    (lambda: sl.collate(5), TypeError, "collate: seqs must be an iterable of sequences (got int)"),
    (lambda: sl.collate("ab"), TypeError, "collate: seqs must be an iterable of sequences (got str)"),
    (lambda: sl.collate([[1], 2]), TypeError, "collate: seqs[1] must be a sequence"),
    (lambda: sl.starmap("f", [()]), TypeError, "starmap: f must be callable (got str 'f')"),
    (lambda: sl.starmap(pair, 3), TypeError, "starmap: seq must be a sequence"),
])
def test_argument_errors_name_op_and_argument(make, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        make()
