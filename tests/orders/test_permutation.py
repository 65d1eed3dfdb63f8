"""FeistelPermutation: bijection, inverse, scalar/vector agreement, large n, pickling, validation."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqloader.orders import permutation
from seqloader.orders.permutation import MAX_N, FeistelPermutation

seeds = st.integers(0, 2**64 - 1)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000])
def test_is_a_bijection_of_range_n(n):
    for seed in range(20):
        p = FeistelPermutation(n, seed)
        y = p(np.arange(n))
        assert y.dtype == np.uint64
        assert sorted(y.tolist()) == list(range(n))
        assert p.inverse(y).tolist() == list(range(n))


@given(st.integers(0, 2000), seeds, st.integers(1, 9))
def test_bijection_inverse_and_scalar_path_agree(n, seed, rounds):
    p = FeistelPermutation(n, seed, rounds=rounds)
    x = np.arange(n, dtype=np.int64)
    y = p(x)
    assert np.array_equal(np.sort(y), x.astype(np.uint64))
    assert np.array_equal(p.inverse(y), x.astype(np.uint64))
    sample = list(range(min(n, 20))) + list(range(max(n - 20, 0), n))
    assert [p.index(i) for i in sample] == y[sample].tolist()


@pytest.mark.parametrize("n", [2**40, 2**40 + 1, 3 * 2**40 + 17, 2**62 + 1, 2**63 - 1, MAX_N])
def test_is_a_bijection_on_sampled_positions_for_large_n(n):
    rng = np.random.default_rng(n % 1000)
    x = np.unique(np.concatenate([rng.integers(0, n - 1, 2000, dtype=np.uint64, endpoint=True),
                                  np.array([0, 1, n - 2, n - 1], dtype=np.uint64)]))
    for seed in (0, 2**64 - 1):
        p = FeistelPermutation(n, seed)
        y = p(x)
        assert int(y.max()) < n
        assert len(np.unique(y)) == len(x)
        assert np.array_equal(p.inverse(y), x)
        assert [p.index(int(v)) for v in x[:20]] == y[:20].tolist()


def test_len_and_n():
    assert len(FeistelPermutation(7, 0)) == 7
    assert FeistelPermutation(MAX_N, 0).n == MAX_N


def test_small_domains():
    assert FeistelPermutation(1, 5)(np.array([0])).tolist() == [0]
    assert FeistelPermutation(1, 5).index(0) == 0
    assert FeistelPermutation(0, 5)(np.zeros(0, dtype=np.int64)).tolist() == []
    assert {tuple(FeistelPermutation(2, s)(np.arange(2)).tolist()) for s in range(20)} == {(0, 1), (1, 0)}


def test_accepts_any_integer_dtype_and_shape():
    p = FeistelPermutation(100, 1)
    ref = p(np.arange(100))
    for dtype in (np.int8, np.uint8, np.int32, np.uint64, np.int64):
        assert np.array_equal(p(np.arange(100, dtype=dtype)), ref)
    assert np.array_equal(p(np.arange(100).reshape(10, 10)), ref.reshape(10, 10))
    assert p([3, 4]).tolist() == ref[3:5].tolist()
    assert p(np.array([], dtype=float)).tolist() == []


def test_does_not_modify_its_input():
    x = np.arange(50, dtype=np.uint64)
    FeistelPermutation(50, 3)(x)
    assert x.tolist() == list(range(50))


def test_seeds_and_rounds_change_the_order():
    orders = {tuple(FeistelPermutation(30, s, r)(np.arange(30)).tolist()) for s in range(5) for r in (4, 6, 8)}
    assert len(orders) == 15


def test_golden_order():
    # Pinned: shuffle(range(10), seed=0) is built on it.
    assert FeistelPermutation(10, 0)(np.arange(10)).tolist() == [6, 5, 3, 7, 4, 2, 1, 8, 9, 0]


def test_pickle_and_equality():
    p = FeistelPermutation(10**12, 42, rounds=7)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and repr(q) == repr(p) == "FeistelPermutation(n=1000000000000, seed=42, rounds=7)"
    x = np.arange(0, 10**12, 10**9)
    assert np.array_equal(q(x), p(x))
    assert p != FeistelPermutation(10**12, 43, rounds=7)
    assert len(pickle.dumps(p)) < 500


@pytest.mark.parametrize("args, exc, msg", [
    ((-1, 0), ValueError, "FeistelPermutation: n must be a non-negative int (got -1)"),
    ((MAX_N + 1, 0), ValueError, "FeistelPermutation: n must be <= 2**63"),
    ((1.5, 0), TypeError, "FeistelPermutation: n must be an int (got float 1.5)"),
    ((5, -3), ValueError, "FeistelPermutation: seed must be a non-negative int (got -3)"),
    ((5, 2**64), ValueError, "FeistelPermutation: seed must be < 2**64"),
    ((5, 0, 0), ValueError, "FeistelPermutation: rounds must be a positive int (got 0)"),
])
def test_argument_errors(args, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        FeistelPermutation(*args)


def test_out_of_range_positions_raise_index_error():
    p = FeistelPermutation(10, 0)
    name = re.escape(repr(p))
    with pytest.raises(IndexError, match=f"^{name}: position 10 out of range \\[0, 10\\)$"):
        p(np.array([0, 10]))
    with pytest.raises(IndexError, match=f"^{name}: position -1 out of range"):
        p.inverse([-1, 3])
    with pytest.raises(IndexError, match=f"^{name}: index -1 out of range \\[0, 10\\)$"):
        p.index(-1)
    with pytest.raises(TypeError, match=f"^{name}: positions must be an integer array \\(got dtype float64\\)$"):
        p(np.array([1.0]))
    with pytest.raises(TypeError, match=f"^{name}: index must be an int \\(got str '1'\\)$"):
        p.index("1")


@given(st.integers(2, 2**63))
def test_the_domain_is_barely_larger_than_n(n):
    a, b = FeistelPermutation(n, 0)._radix
    assert a * b >= n and a * b - n < a and a * b < 2**64


def test_cycle_walking_is_exercised():
    # n = 10 runs on [0, 12): some positions leave [0, 10) and must be walked back.
    p = FeistelPermutation(10, 0)
    assert p._radix == (4, 3)
    raw = p._encrypt(np.arange(10, dtype=np.uint64))
    assert raw.max() >= 10
    assert sorted(p(np.arange(10)).tolist()) == list(range(10))


@given(n=st.integers(1, 10**12), seed=st.integers(0, 2**64 - 1), start=st.integers(0, 10**12))
def test_a_long_array_and_its_short_pieces_map_alike(n, seed, start):
    """Arrays of _MANY positions or more use the other form of x % q; the values are the same."""
    p = FeistelPermutation(n, seed)
    x = (start + np.arange(permutation._MANY + 5, dtype=np.int64)) % n
    pieces = np.concatenate([p(x[i:i + 100]) for i in range(0, len(x), 100)])
    assert np.array_equal(p(x), pieces)
    assert np.array_equal(p.inverse(p(x)), x.astype(np.uint64))


@pytest.mark.parametrize("n", [2, 10**6, 2**32 + 7, 3 * 10**9])
def test_tabulated_round_functions_give_the_direct_values(n):
    """For halves up to _TABLE_MAX a long call reads F from per-round tables; the images and
    their inverses are those of the direct computation (element by element, in Python)."""
    p = FeistelPermutation(n, seed=11)
    x = (np.arange(permutation._MANY, dtype=np.int64) * 7919 + 5) % n
    images = p(x)
    assert images.tolist() == [p.index(int(i)) for i in x]
    assert np.array_equal(p.inverse(images), x.astype(np.uint64))
    a = p._radix[0]
    assert (p._tables is not None and all(t is not None for t in p._tables)) == (a <= permutation._TABLE_MAX)
