"""interleave, case and switch: list oracles, phases of interleave, checked choices, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from strategies import check_against_oracle, interleave_oracle

lists = st.lists(st.integers(), max_size=8)


@given(st.lists(lists, min_size=1, max_size=5))
def test_interleave_matches_round_robin(parts):
    check_against_oracle(sl.interleave(*parts), interleave_oracle(*parts))


@given(st.lists(lists, min_size=1, max_size=5))
def test_interleave_reads_every_item_once(parts):
    tagged = [[(k, j) for j in range(len(p))] for k, p in enumerate(parts)]
    seq = sl.interleave(*tagged)
    assert sorted(seq) == sorted(x for t in tagged for x in t)
    assert [seq.origin(p) for p in range(len(seq))] == list(seq)


def test_interleave_of_lazy_sequences_reads_only_the_item_asked_for():
    reads = []
    a = sl.smap(lambda i: reads.append(("a", i)) or i, range(3))
    b = sl.smap(lambda i: reads.append(("b", i)) or -i, range(1, 6))
    seq = sl.interleave(a, b)
    assert len(seq) == 8 and seq[5] == -3 and seq[-1] == -5
    assert reads == [("b", 3), ("b", 5)]  # items 2 and 4 of b, whose values are 3 and 5
    assert repr(seq) == "interleave(2 seqs, len=8)"


@given(st.data(), st.integers(0, 12), st.integers(1, 4))
def test_case_matches_its_oracle(data, n, k):
    seqs = [[(m, i) for i in range(n)] for m in range(k)]
    selector = data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    check_against_oracle(sl.case(selector, *seqs), [seqs[s][i] for i, s in enumerate(selector)])
    check_against_oracle(sl.case(np.array(selector, dtype=np.int8), *seqs), [seqs[s][i] for i, s in enumerate(selector)])


@given(st.lists(st.booleans(), max_size=12))
def test_switch_matches_its_oracle(cond):
    a, b = [("a", i) for i in range(len(cond))], [("b", i) for i in range(len(cond))]
    expected = [x if c else y for c, x, y in zip(cond, a, b)]
    check_against_oracle(sl.switch(cond, a, b), expected)
    check_against_oracle(sl.switch(np.array(cond, dtype=bool), a, b), expected)
    check_against_oracle(sl.switch([int(c) for c in cond], a, b), expected)


def test_case_reads_the_chosen_sequence_only():
    reads = []
    seqs = [sl.smap(lambda i, m=m: reads.append((m, i)) or (m, i), range(4)) for m in range(3)]
    seq = sl.case([2, 0, 1, 2], *seqs)
    assert seq[1] == (0, 1) and seq[-1] == (2, 3)
    assert reads == [(0, 1), (2, 3)]


@pytest.mark.parametrize("selector, exc, msg", [
    ([0, 3], IndexError, "case(2 seqs, len=2): selector[1] = 3 out of range [0, 2)"),
    ([0, -1], IndexError, "case(2 seqs, len=2): selector[1] = -1 out of range [0, 2)"),
    ([0, 1.0], TypeError, "case(2 seqs, len=2): selector[1] must be an int (got float 1.0)"),
    ([0, True], TypeError, "case(2 seqs, len=2): selector[1] is a bool (True); use switch(condition, a, b)"),
    ([0, np.True_], TypeError, "case(2 seqs, len=2): selector[1] is a bool"),
])
def test_case_checks_each_choice_when_read(selector, exc, msg):
    seq = sl.case(selector, "ab", "AB")
    assert seq[0] == "a"
    with pytest.raises(exc, match="^" + re.escape(msg)):
        seq[1]


@pytest.mark.parametrize("cond, exc, msg", [
    ([True, 2], ValueError, "switch(len=2): condition[1] must be a bool, or 0 or 1 (got 2)"),
    ([True, None], TypeError, "switch(len=2): condition[1] must be a bool (got NoneType None)"),
    ([True, 0.5], TypeError, "switch(len=2): condition[1] must be a bool (got float 0.5)"),
])
def test_switch_checks_each_condition_when_read(cond, exc, msg):
    seq = sl.switch(cond, "ab", "AB")
    assert seq[0] == "a"
    with pytest.raises(exc, match="^" + re.escape(msg)):
        seq[1]


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: sl.interleave(), TypeError, "interleave: expected at least one sequence (got none)"),
    (lambda: sl.interleave([1], 2), TypeError, "interleave: seqs[1] must be a sequence"),
    (lambda: sl.interleave(range(2**62), range(2**62)), ValueError, "interleave: the total length must be < 2**63"),
    (lambda: sl.case([0]), TypeError, "case: expected at least one sequence after selector (got none)"),
    (lambda: sl.case([0, 1], "ab", "abc"), ValueError, "case: every sequence must have len(selector) = 2 items (seqs[1] has 3)"),
    (lambda: sl.case(5, "ab"), TypeError, "case: selector must be a sequence"),
    (lambda: sl.switch([True], "a", "AB"), ValueError, "switch: every sequence must have len(condition) = 1 items (b has 2)"),
    (lambda: sl.switch([True], "ab", "A"), ValueError, "switch: every sequence must have len(condition) = 1 items (a has 2)"),
    (lambda: sl.switch(None, "a", "A"), TypeError, "switch: condition must be a sequence"),
])
def test_argument_errors_name_op_and_argument(make, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        make()


def test_huge_interleave_is_computed_per_position():
    seq = sl.interleave(range(10**15), range(3), range(-5, 0))
    assert len(seq) == 10**15 + 8
    assert list(seq[:9]) == [0, 0, -5, 1, 1, -4, 2, 2, -3]
    assert list(seq[9:13]) == [3, -2, 4, -1]
    assert seq[13] == 5 and seq[-1] == 10**15 - 1
