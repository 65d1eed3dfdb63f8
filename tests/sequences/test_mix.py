"""mix: the schedule, the prefix bound, length policies, indexing, laziness, validation, composition."""

from __future__ import annotations

import math
import pickle
import re
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import seqloader as sl
from seqloader.rng import item_rng
from seqloader.sequences.base import LazySequence
from seqloader.sequences.mix import MAX_BLOCK, mix
from strategies import check_against_oracle, draw_int, seeds, shard_oracle, shuffle_oracle

BIG = 10**15  # sources this long are never read to their end in these tests

# -- strategies and oracles ----------------------------------------------------------------------

int_weights = st.lists(st.integers(1, 12), min_size=1, max_size=5)
float_weights = st.lists(st.floats(0.5, 2.0), min_size=1, max_size=5)


@st.composite
def mix_args(draw, max_len: int = 25):
    """``(seqs, weights, kwargs)`` for a small mixture; items are ``(source, index)`` pairs."""
    weights = draw(int_weights | float_weights)
    lens = draw(st.lists(st.integers(1, max_len), min_size=len(weights), max_size=len(weights)))
    policy = draw(st.sampled_from(["first", "all", "length"]))
    kwargs = {"stop": policy} if policy != "length" else {"length": draw(st.integers(0, 60))}
    kwargs["seed"] = draw(st.none() | seeds)
    seqs = [[(k, j) for j in range(n)] for k, n in enumerate(lens)]
    return seqs, weights, kwargs


def raw_schedule(weights, seed, n: int) -> list:
    """``(k, j)`` of positions ``0 .. n - 1`` before any source wraps (sources of length BIG)."""
    m = mix([range(BIG)] * len(weights), weights, seed=seed, length=n)
    k, j = m._source_of(np.arange(n, dtype=np.int64))
    return list(zip(k.tolist(), j.tolist()))


def policy_oracle(weights, lens, seed=None, stop=None, length=None) -> list:
    """The ``(k, j)`` pairs a mixture reads, by replaying the raw schedule with counters."""
    horizon = length if length is not None else 4 * MAX_BLOCK + 40 * max(lens) * 64
    raw = raw_schedule(weights, seed, horizon)
    out, unread = [], [set(range(n)) for n in lens]
    for k, j in raw:
        if length is not None and len(out) == length:
            break
        if length is None and stop in (None, "first") and j >= lens[k]:
            break
        if stop == "all" and not any(unread):
            break
        unread[k].discard(j % lens[k])
        out.append((k, j % lens[k]))
    else:
        assert length is not None, "horizon too short"
    return out


def counts_by_prefix(ks: np.ndarray, n_sources: int) -> np.ndarray:
    """``c[p, k]``: how many of the first ``p`` positions read source ``k``."""
    onehot = np.zeros((len(ks) + 1, n_sources), dtype=np.int64)
    onehot[np.arange(1, len(ks) + 1), ks] = 1
    return onehot.cumsum(axis=0)


class Recording(LazySequence):
    """A long lazy source that records which items are read."""

    def __init__(self, n: int):
        self.n, self.reads = n, []

    def __len__(self):
        return self.n

    def _item(self, i):
        self.reads.append(i)
        return i

    def __repr__(self):
        return f"recording(len={self.n})"


# -- the sequence against its oracle -----------------------------------------------------------------

@given(mix_args())
def test_mix_matches_the_replayed_schedule(args):
    seqs, weights, kwargs = args
    m = mix(seqs, weights, **kwargs)
    oracle = [seqs[k][j] for k, j in policy_oracle(weights, [len(s) for s in seqs], **kwargs)]
    check_against_oracle(m, oracle, slice_pairs=[(slice(None, None, -1), slice(1, None, 2))])


@given(st.lists(st.integers(1, 30), min_size=1, max_size=6), st.integers(0, 400))
def test_the_unseeded_schedule_is_the_block_table_read_with_counters(weights, n):
    m = mix([range(BIG)] * len(weights), weights, length=n)
    counters = [0] * len(weights)
    expected = []
    for p in range(n):
        k = int(m._src[p % m._block])
        expected.append((k, counters[k]))
        counters[k] += 1
    assert raw_schedule(weights, None, n) == expected
    assert [m._source_of_one(p) for p in range(n)] == expected


@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), seeds, st.integers(1, 6))
def test_seeded_blocks_are_shuffles_of_the_unseeded_blocks(weights, seed, n_blocks):
    block = mix([[0]] * len(weights), weights, length=1)._block
    n = n_blocks * block
    plain, shuffled = raw_schedule(weights, None, n), raw_schedule(weights, seed, n)
    for q in range(n_blocks):
        assert sorted(shuffled[q * block:(q + 1) * block]) == sorted(plain[q * block:(q + 1) * block])


@given(st.lists(st.integers(1, 9), min_size=2, max_size=4), seeds, st.integers(0, 10**12))
def test_vectorised_and_scalar_lookups_agree(weights, seed, start):
    for s in (None, seed):
        m = mix([range(BIG), range(7)] + [range(3)] * (len(weights) - 2), weights, seed=s, length=2**62)
        pos = np.arange(start, start + 64, dtype=np.int64)
        k, j = m._source_of(pos)
        assert list(zip(k.tolist(), j.tolist())) == [m._source_of_one(int(p)) for p in pos]


# -- proportions -------------------------------------------------------------------------------------

def _prefix_deviation(weights, seed, n_blocks: int = 3):
    m = mix([range(BIG)] * len(weights), weights, seed=seed, length=1)
    block, counts = m._block, m._counts
    n = n_blocks * block + block // 2 + 1
    ks, _ = m._source_of(np.arange(n, dtype=np.int64))
    c = counts_by_prefix(ks, len(weights))
    ideal = np.arange(n + 1)[:, None] * counts[None, :] / block
    at_blocks = c[::block] - ideal[::block]
    assert np.all(at_blocks == 0), "every whole block holds exactly counts[k] items of source k"
    return np.abs(c - ideal).max(axis=0), counts, block


@given(int_weights | float_weights | st.lists(st.integers(1, 200), min_size=2, max_size=8))
def test_unseeded_prefix_bound(weights):
    dev, counts, block = _prefix_deviation(weights, None)
    k = len(weights)
    bound = 0.0 if k == 1 else 1 - 1 / (2 * k - 2)
    assert dev.max() <= bound + 1e-9, (dev, counts.tolist())


@given(int_weights | float_weights, seeds)
def test_seeded_prefix_bound(weights, seed):
    dev, counts, block = _prefix_deviation(weights, seed)
    assert np.all(dev <= counts * (1 - counts / block) + 1e-9)


def test_prefix_bound_of_a_70_20_10_mixture_against_the_weights_themselves():
    ks, _ = mix([range(BIG)] * 3, [0.7, 0.2, 0.1], length=1)._source_of(np.arange(1000, dtype=np.int64))
    c = counts_by_prefix(ks, 3)
    dev = np.abs(c - np.arange(1001)[:, None] * np.array([0.7, 0.2, 0.1])).max(axis=0)
    assert dev.max() <= 0.75 + 1e-9
    assert c[1000].tolist() == [700, 200, 100]


@given(st.lists(st.integers(1, 100), min_size=1, max_size=6))
def test_integer_weights_summing_to_at_most_max_block_are_exact(weights):
    g = math.gcd(*weights)
    assume(sum(weights) // g <= MAX_BLOCK)
    m = mix([[0]] * len(weights), weights, length=1)
    assert m._block == sum(weights) // g
    assert [Fraction(int(c), m._block) for c in m._counts] == [Fraction(w, sum(weights)) for w in weights]


@pytest.mark.parametrize("weights, counts", [
    ([0.7, 0.2, 0.1], [7, 2, 1]), ([70, 20, 10], [7, 2, 1]), ([7.0, 2.0, 1.0], [7, 2, 1]),
    ([1 / 3] * 3, [1, 1, 1]), ([0.1] * 3, [1, 1, 1]), ([2, 4], [1, 2]), ([0.25, 0.5], [1, 2]),
    ([np.float32(0.5), np.int64(1)], [1, 2]), ([10**30, 3 * 10**30], [1, 3]), ([5], [1]),
])
def test_weights_become_the_smallest_exact_counts(weights, counts):
    m = mix([[0]] * len(weights), weights, length=1)
    assert m._counts.tolist() == counts and m._block == sum(counts)


@given(st.lists(st.floats(1.0, 50.0), min_size=2, max_size=6))
def test_inexact_weights_are_rounded_to_within_one_block_slot(weights):
    m = mix([[0]] * len(weights), weights, length=1)
    shares = np.array(weights) / sum(weights)
    assert m._counts.sum() == m._block <= MAX_BLOCK and m._counts.min() >= 1
    assert np.all(np.abs(m._counts / m._block - shares) < 1 / m._block)


# -- length policies -----------------------------------------------------------------------------------

@given(mix_args())
def test_each_item_is_read_once_per_cycle(args):
    """Read ``t`` of source ``k`` is cycle ``t // len``: raw indices never repeat, whole blocks read
    ``0 .. q * c_k - 1``, and without a seed they come in order."""
    seqs, weights, kwargs = args
    m = mix(seqs, weights, **kwargs)
    n = len(m)
    ks, js = m._source_of(np.arange(n, dtype=np.int64))
    raw = np.array(raw_schedule(weights, kwargs["seed"], n), dtype=np.int64).reshape(n, 2)
    lens = np.array([len(s) for s in seqs])
    assert ks.tolist() == raw[:, 0].tolist() and js.tolist() == (raw[:, 1] % lens[raw[:, 0]]).tolist()
    for k, s in enumerate(seqs):
        reads = raw[raw[:, 0] == k, 1]
        whole = (n // m._block) * int(m._counts[k])
        assert len(set(reads.tolist())) == len(reads)
        assert set(range(whole)) <= set(reads.tolist()) and reads.max(initial=0) < whole + m._counts[k]
        if kwargs["seed"] is None:
            assert reads.tolist() == list(range(len(reads)))
        if kwargs.get("stop") == "first":
            assert reads.max(initial=-1) < len(s)
        if kwargs.get("stop") == "all":
            assert set((reads % len(s)).tolist()) == set(range(len(s)))


@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.data())
def test_stop_first_reads_one_source_to_its_end_without_a_seed(weights, data):
    lens = data.draw(st.lists(st.integers(1, 40), min_size=len(weights), max_size=len(weights)))
    m = mix([range(n) for n in lens], weights)
    ks, js = m._source_of(np.arange(len(m), dtype=np.int64))
    read = [int((ks == k).sum()) for k in range(len(lens))]
    assert all(r <= n for r, n in zip(read, lens)) and any(r == n for r, n in zip(read, lens))
    nxt_k, _ = mix([range(BIG)] * len(weights), weights, length=len(m) + 1)._source_of(np.array([len(m)]))
    assert read[int(nxt_k[0])] == lens[int(nxt_k[0])], "the next position would read past an end"


@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.none() | seeds, st.data())
def test_fixed_lengths_and_stops_are_prefixes_of_one_schedule(weights, seed, data):
    lens = data.draw(st.lists(st.integers(1, 30), min_size=len(weights), max_size=len(weights)))
    seqs = [[(k, j) for j in range(n)] for k, n in enumerate(lens)]
    long = list(mix(seqs, weights, seed=seed, length=3000))
    for stop in ("first", "all"):
        m = mix(seqs, weights, seed=seed, stop=stop)
        assert list(m) == long[:len(m)]
    assert list(mix(seqs, weights, seed=seed, length=0)) == []


def test_stop_all_and_first_on_a_70_20_10_example():
    seqs = [range(70), range(100, 110), range(200, 203)]
    first, every = mix(seqs, [7, 2, 1]), mix(seqs, [7, 2, 1], stop="all")
    # blocks of 10 read sources 0 0 1 0 0 2 0 0 1 0: source 2 (3 items) would read a 4th item at
    # position 35 (block 3, slot 5); source 0's last item (block 9, rank 6) is at slot 9 of block 9
    assert len(first) == 35 and len(every) == 100
    assert sorted(x for x in first if x >= 200) == [200, 201, 202]
    assert sorted(set(every)) == sorted(set(range(70)) | set(range(100, 110)) | set(range(200, 203)))


def test_a_single_source_is_itself():
    assert list(mix([range(5)], [3.5])) == list(range(5))
    assert list(mix([range(3)], [1], length=7)) == [0, 1, 2, 0, 1, 2, 0]
    assert list(mix([range(5)], [1], seed=3)) == list(range(5))


# -- laziness, size, golden orders ----------------------------------------------------------------------

def test_mix_reads_only_the_requested_item():
    a, b = Recording(1000), Recording(1000)
    m = mix([a, b], [3, 1], seed=5)
    assert a.reads == [] and b.reads == []
    k, j = m._source_of(np.array([123]))
    assert m[123] == int(j[0])
    assert (a.reads, b.reads) == (([int(j[0])], []) if k[0] == 0 else ([], [int(j[0])]))


def test_mix_of_billion_item_sources_allocates_nothing_large():
    tracemalloc.start()
    try:
        m = mix([range(10**9)] * 3, [0.7, 0.2, 0.1])
        ms = mix([range(10**9)] * 3, [0.7, 0.2, 0.1], seed=1, stop="all")
        items = [m[0], m[10**9 - 1], m[-1], ms[-1], ms[5 * 10**9]]
        ks, js = m._source_of(np.arange(256) * 5_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20
    # "first": source 0 (7 per block) ends first; "all": source 2 (1 per block) is read through last
    assert len(m) == 10**10 // 7 + 1 and 10**10 - 10 < len(ms) <= 10**10
    assert all(0 <= x < 10**9 for x in items + js.tolist())
    # p = 10**9 - 1 = 99999999 blocks of 10, then slot 9 (source 0, rank 6): item 7 * 99999999 + 6
    assert m[10**9 - 1] == 7 * 99_999_999 + 6


def test_mix_golden_orders():
    # Pinned on purpose: changing the schedule changes what a saved loader position names.
    m = mix([range(100), range(1000, 1100), range(2000, 2100)], [0.7, 0.2, 0.1])
    assert m._src.tolist() == [0, 0, 1, 0, 0, 2, 0, 0, 1, 0]
    assert list(m[:12]) == [0, 1, 1000, 2, 3, 2000, 4, 5, 1001, 6, 7, 8]
    s = mix([range(100), range(1000, 1100), range(2000, 2100)], [0.7, 0.2, 0.1], seed=3)
    assert list(s[:20]) == GOLDEN_SEEDED


GOLDEN_SEEDED = [1, 1001, 1000, 2000, 6, 3, 4, 2, 5, 0, 1002, 11, 8, 9, 7, 10, 12, 1003, 2001, 13]


def test_seeds_change_the_order_and_are_deterministic():
    seqs = [range(50), range(100, 150)]
    orders = {tuple(mix(seqs, [1, 1], seed=s)) for s in range(20)}
    assert len(orders) == 20
    assert list(mix(seqs, [1, 1], seed=4)) == list(mix(seqs, [1, 1], seed=4))
    assert list(mix(seqs, [1, 1])) == [x for pair in zip(range(50), range(100, 150)) for x in pair]


def test_mix_pickles_small_and_to_the_same_order():
    for seed in (None, 11):
        m = mix([range(10**12), list(range(30))], [0.3, 0.7], seed=seed, stop="all")
        clone = pickle.loads(pickle.dumps(m))
        assert len(clone) == len(m) and [clone[i] for i in range(-50, 50)] == [m[i] for i in range(-50, 50)]
        assert len(pickle.dumps(m)) < 2000


def test_repr_names_counts_policy_seed_and_length():
    assert repr(mix([[1, 2], [3]], [2, 1])) == "mix(2 seqs, counts=[2, 1] per 3, stop='first', seed=None, len=3)"
    assert repr(mix([[1]] * 10, [1] * 10, seed=2, length=4)) == (
        "mix(10 seqs, counts=[1, 1, 1, 1, 1, 1, 1, 1, ...] per 10, length=4, seed=2, len=4)")
    with pytest.raises(IndexError, match=re.escape("mix(2 seqs, counts=[2, 1] per 3, stop='all', seed=None, "
                                                   "len=3): index 3 out of range [-3, 3)")):
        mix([[1, 2], [3]], [2, 1], stop="all")[3]


# -- validation ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, exc, msg", [
    (([], []), {}, ValueError, "mix: seqs must not be empty; give at least one source"),
    ((5, [1]), {}, TypeError, "mix: seqs must be a sequence of sequences (got int)"),
    (([[1], 3], [1, 1]), {}, TypeError, "mix: seqs[1] must be a sequence with __len__ and __getitem__ (got int)"),
    (([[1], []], [1, 1]), {}, ValueError, "mix: seqs[1] is empty; every source needs at least one item"),
    (([[1], [2]], [1]), {}, ValueError, "mix: seqs and weights must have the same length (got 2 seqs and 1 weights)"),
    (([[1], [2]], 3), {}, TypeError, "mix: weights must be a sequence of positive numbers (got int)"),
    (([[1], [2]], "ab"), {}, TypeError, "mix: weights must be a sequence of positive numbers (got str)"),
    (([[1], [2]], [1, 0]), {}, ValueError, "mix: weights[1] must be a finite number > 0 (got 0)"),
    (([[1], [2]], [-1, 1]), {}, ValueError, "mix: weights[0] must be a finite number > 0 (got -1)"),
    (([[1], [2]], [1, float("nan")]), {}, ValueError, "mix: weights[1] must be a finite number > 0 (got nan)"),
    (([[1], [2]], [1, float("inf")]), {}, ValueError, "mix: weights[1] must be a finite number > 0 (got inf)"),
    (([[1], [2]], [1, 10**400]), {}, ValueError, "mix: weights[1] must be a finite number > 0 (got 1000"),
    (([[1], [2]], [1, "2"]), {}, TypeError, "mix: weights[1] must be a real number (got str '2')"),
    (([[1], [2]], [1, True]), {}, TypeError, "mix: weights[1] must be a real number (got bool True)"),
    (([[1], [2]], [1, 1e-5]), {}, ValueError, "mix: weights[1] is too small: its share of the total is 1e-05, below 1/4096"),
    (([[1], [2]], [1.0, 1e-10]), {}, ValueError, "mix: weights[1] is too small: its share of the total is 1e-10"),
    (([[1], [2]], [1, 10**12]), {}, ValueError, "mix: weights[0] is too small: its share of the total is 1e-12"),
    (([[1], [2]], [1, 1]), {"seed": -1}, ValueError, "mix: seed must be a non-negative int (got -1)"),
    (([[1], [2]], [1, 1]), {"seed": 2**64}, ValueError, "mix: seed must be < 2**64"),
    (([[1], [2]], [1, 1]), {"seed": 1.5}, TypeError, "mix: seed must be an int (got float 1.5)"),
    (([[1], [2]], [1, 1]), {"stop": "any"}, ValueError, "mix: stop must be 'first' or 'all' (got 'any')"),
    (([[1], [2]], [1, 1]), {"stop": 1}, TypeError, "mix: stop must be 'first' or 'all' (got int 1)"),
    (([[1], [2]], [1, 1]), {"stop": "all", "length": 3}, ValueError,
     "mix: give stop or length, not both (got stop='all', length=3)"),
    (([[1], [2]], [1, 1]), {"length": -1}, ValueError, "mix: length must be a non-negative int (got -1)"),
    (([[1], [2]], [1, 1]), {"length": 2**63}, ValueError, "mix: length must be < 2**63"),
    (([[1], [2]], [1, 1]), {"length": 2.0}, TypeError, "mix: length must be an int (got float 2.0)"),
    (([[1], range(2**62)], [4000, 1]), {"stop": "all"}, ValueError, "mix: stop='all' gives "),
])
def test_mix_argument_errors_name_op_and_argument(args, kwargs, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        mix(*args, **kwargs)


def test_too_many_sources_for_a_block_is_an_error():
    with pytest.raises(ValueError, match=re.escape("mix: weights[0] is too small")):
        mix([[0]] * (MAX_BLOCK + 1), [1] * (MAX_BLOCK + 1))
    assert mix([[0]] * MAX_BLOCK, [1] * MAX_BLOCK)._block == MAX_BLOCK


# -- composition --------------------------------------------------------------------------------------------

def _small():
    seqs = [[("a", j) for j in range(14)], [("b", j) for j in range(5)], [("c", j) for j in range(3)]]
    return mix(seqs, [0.6, 0.3, 0.1], seed=8, stop="all")


@given(seeds)
def test_shuffle_of_a_mix(seed):
    m = _small()
    check_against_oracle(sl.shuffle(m, seed), shuffle_oracle(list(m), seed))


@given(seeds, seeds)
def test_mix_of_shuffles(s1, s2):
    a, b = list(range(20)), list(range(100, 107))
    m = mix([sl.shuffle(a, s1), sl.shuffle(b, s2)], [3, 1], stop="all")
    oracle = list(mix([shuffle_oracle(a, s1), shuffle_oracle(b, s2)], [3, 1], stop="all"))
    check_against_oracle(m, oracle)


@given(st.integers(1, 4).flatmap(lambda w: st.tuples(st.integers(0, w - 1), st.just(w))), st.booleans())
def test_shard_of_a_mix(rank_world, drop):
    rank, world = rank_world
    m = _small()
    check_against_oracle(sl.shard(m, rank, world, drop), shard_oracle(list(m), rank, world, drop))


@given(st.integers(1, 6), seeds)
def test_batch_and_rng_map_of_a_mix(k, seed):
    m = _small()
    items = list(m)
    check_against_oracle(sl.batch(m, k), [items[i:i + k] for i in range(0, len(items), k)])
    check_against_oracle(sl.rng_map(draw_int, m, seed),
                         [(x, int(item_rng(seed, i).integers(1000))) for i, x in enumerate(items)])
