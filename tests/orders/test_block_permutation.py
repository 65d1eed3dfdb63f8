"""``BlockPermutation`` (``seqloader/orders/block_permutation.py``) and its measures (``seqloader/orders/block_quality.py``).

A bijection of ``[0, n)`` for many layouts; the vectorised and scalar paths agree; the windows,
the block order and the lanes' tail rule match oracles written independently from the
definition; a pinned order; pickling; ``n = 2**40`` in little memory; locality and quality.
"""

from __future__ import annotations

import pickle
import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqloader.orders.block_permutation import BlockPermutation
from seqloader.orders.block_quality import bytes_read_ratio, shuffle_quality
from seqloader.orders.permutation import FeistelPermutation
from seqloader.rng import derive_seed
from strategies import seeds

block_sizes = st.lists(st.integers(0, 12), max_size=12)
windows = st.one_of(st.none(), st.integers(0, 5), st.just(1000))


def ends_of(sizes) -> list[int]:
    return np.cumsum(sizes, dtype=np.int64).tolist()


def lane_oracle(n: int, lanes: int, chunk: int) -> list[int]:
    """``s[p]``: the windowed position of position ``p``, by dealing chunks round-robin to lanes
    and laying the lanes out one after another (the tail rule, written as a list)."""
    lane_chunks: list[list[range]] = [[] for _ in range(lanes)]
    for c, lo in enumerate(range(0, n, chunk)):
        lane_chunks[c % lanes].append(range(lo, min(lo + chunk, n)))
    s = [0] * n
    k = 0
    for chunks in lane_chunks:
        for r in chunks:
            for p in r:
                s[p] = k
                k += 1
    return s


@given(block_sizes, windows, seeds, st.integers(1, 4), st.integers(1, 7))
def test_a_permutation_and_the_scalar_path_agrees(sizes, window, seed, lanes, chunk):
    ends = ends_of(sizes)
    n = ends[-1] if ends else 0
    perm = BlockPermutation(ends, window, seed, lanes=lanes, chunk=chunk)
    order = perm(np.arange(n))
    assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(n))
    assert [perm.index(p) for p in range(n)] == order.tolist()
    for lo in range(0, n, 5):  # short runs (often inside one window: the one-window fast path)
        assert perm(np.arange(lo, min(lo + 5, n))).tolist() == order[lo:lo + 5].tolist()
    assert len(perm) == n


@given(block_sizes, windows, seeds, st.integers(1, 4), st.integers(1, 7), st.booleans())
def test_window_rows_name_exactly_the_blocks_of_a_positions_window(sizes, window, seed, lanes, chunk, split):
    """What the loader decodes ahead for position ``p`` (``window_rows``) is exactly the set of
    blocks that the positions of ``p``'s window read, one row in each."""
    ends = ends_of(sizes)
    n = ends[-1] if ends else 0
    perm = BlockPermutation(ends, window, seed, lanes=lanes, chunk=chunk, split_seams=split)
    order = perm(np.arange(n)).tolist()
    block = lambda i: int(np.searchsorted(ends, i, side="right"))  # noqa: E731
    windowed = lane_oracle(n, lanes, chunk)
    at = {s: p for p, s in enumerate(windowed)}                     # windowed position -> position
    for p in range(n):
        rows = perm.window_rows(p)
        named = [block(r) for r in rows]
        assert len(set(named)) == len(named) and all(0 <= r < n for r in rows)
        if window == 0:
            assert rows == [windowed[p]]
            continue
        w = perm._wstart   # (the test reads the windows' bounds to list the window's positions)
        k = int(np.searchsorted(w, windowed[p], side="right")) - 1
        read = {block(order[at[s]]) for s in range(int(w[k]), int(w[k + 1]))}
        assert set(named) == read
    with pytest.raises(IndexError):
        perm.window_rows(n)


@given(block_sizes, windows, seeds, st.integers(1, 4), st.integers(1, 7))
def test_lanes_follow_the_tail_rule_over_the_plain_windowed_order(sizes, window, seed, lanes, chunk):
    ends = ends_of(sizes)
    n = ends[-1] if ends else 0
    plain = BlockPermutation(ends, window, seed)(np.arange(n)).tolist()
    perm = BlockPermutation(ends, window, seed, lanes=lanes, chunk=chunk)
    s = lane_oracle(n, lanes, chunk)
    assert perm(np.arange(n)).tolist() == [plain[s[p]] for p in range(n)]
    bounds = perm.lane_bounds()
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == lanes + 1
    for c, lo in enumerate(range(0, n, chunk)):  # every chunk reads inside one lane's region
        region = set(plain[bounds[c % lanes]:bounds[c % lanes + 1]])
        assert set(perm(np.arange(lo, min(lo + chunk, n))).tolist()) <= region


@given(block_sizes, st.integers(1, 4), seeds)
def test_windows_are_groups_of_permuted_blocks(sizes, window, seed):
    """The definition, as an oracle: blocks in ``FeistelPermutation`` order, ``window`` at a time."""
    ends = ends_of(sizes)
    n = ends[-1] if ends else 0
    starts = [0] + ends[:-1]
    order = BlockPermutation(ends, window, seed)(np.arange(n)).tolist()
    blocks = FeistelPermutation(len(sizes), derive_seed(seed, "block_shuffle", 0))(np.arange(len(sizes))).tolist()
    at = 0
    for w in range(0, len(blocks), window):
        rows = sorted(i for b in blocks[w:w + window] for i in range(starts[b], ends[b]))
        assert sorted(order[at:at + len(rows)]) == rows
        at += len(rows)
    assert at == n


@given(block_sizes, seeds, st.integers(1, 4), st.integers(1, 7))
def test_window_zero_is_sequential_and_none_is_one_window_of_all_blocks(sizes, seed, lanes, chunk):
    ends = ends_of(sizes)
    n = ends[-1] if ends else 0
    assert BlockPermutation(ends, 0, seed)(np.arange(n)).tolist() == list(range(n))
    s = lane_oracle(n, lanes, chunk)  # with lanes, window=0 is the lanes' layout of the identity
    assert BlockPermutation(ends, 0, seed, lanes=lanes, chunk=chunk)(np.arange(n)).tolist() == s
    full = BlockPermutation(ends, None, seed)(np.arange(n)).tolist()
    assert full == BlockPermutation(ends, max(len(sizes), 1), seed)(np.arange(n)).tolist()


def test_window_one_shuffles_rows_within_each_block():
    ends = [5, 10, 15, 20]
    order = BlockPermutation(ends, 1, seed=3)(np.arange(20)).tolist()
    runs = [sorted(order[k:k + 5]) for k in range(0, 20, 5)]
    assert sorted(runs) == [list(range(b, b + 5)) for b in (0, 5, 10, 15)]
    assert order != sorted(order)


def test_the_order_is_pinned():
    """Changing the order changes every resumed epoch: do it on purpose (and bump the state version)."""
    perm = BlockPermutation([3, 7, 7, 12], window=2, seed=42, lanes=2, chunk=2)
    assert perm(np.arange(12)).tolist() == [8, 7, 3, 4, 11, 6, 10, 0, 5, 9, 1, 2]
    perm = BlockPermutation(np.cumsum(np.full(20, 10)), window=3, seed=7)
    assert perm(np.arange(12)).tolist() == [89, 182, 80, 180, 88, 8, 186, 86, 82, 2, 84, 85]


def test_pickling_round_trips_and_equality():
    perm = BlockPermutation([4, 9, 9, 20], window=2, seed=5, lanes=3, chunk=2)
    clone = pickle.loads(pickle.dumps(perm))
    assert clone == perm and hash(clone) == hash(perm) and repr(clone) == repr(perm)
    assert clone(np.arange(20)).tolist() == perm(np.arange(20)).tolist()
    assert perm != BlockPermutation([4, 9, 9, 20], window=2, seed=6, lanes=3, chunk=2)
    assert repr(perm) == "BlockPermutation(blocks=4, window=2, seed=5, lanes=3, chunk=2, n=20)"


def test_shapes_empty_input_and_position_errors():
    perm = BlockPermutation([4, 8], window=1, seed=0)
    assert perm(np.arange(8).reshape(2, 4)).shape == (2, 4)
    assert perm(np.array([], dtype=np.int64)).tolist() == []
    assert perm([]).tolist() == []
    with pytest.raises(IndexError, match=re.escape(f"{perm!r}: position 8 out of range [0, 8)")):
        perm([0, 8])
    with pytest.raises(IndexError, match=re.escape(f"{perm!r}: position -1 out of range [0, 8)")):
        perm.index(-1)
    with pytest.raises(TypeError, match="positions must be an integer array"):
        perm([0.5])


def test_n_2_to_the_40_with_1000_blocks_allocates_little():
    ends = (np.arange(1, 1001, dtype=np.int64) * 2**40) // 1000
    tracemalloc.start()
    try:
        for window, lanes in ((4, 4), (None, 1)):
            perm = BlockPermutation(ends, window, seed=1, lanes=lanes, chunk=64)
            pos = np.arange(0, 2**40, 2**40 // 4096, dtype=np.int64)
            out = perm(pos)
            last = perm.index(2**40 - 1)
            _, peak = tracemalloc.get_traced_memory()
            assert len(np.unique(out)) == len(pos) and 0 <= out.min() and out.max() < 2**40 and 0 <= last < 2**40
            assert [perm.index(int(p)) for p in pos[:20]] == out[:20].tolist()
    finally:
        tracemalloc.stop()
    assert perm.n == 2**40
    assert peak < 16 * 2**20


def test_a_million_blocks():
    ends = np.cumsum(np.full(10**6, 3, dtype=np.int64))
    perm = BlockPermutation(ends, 8, seed=2, lanes=4, chunk=256)
    pos = np.arange(0, 3 * 10**6, 7, dtype=np.int64)
    out = perm(pos)
    assert len(np.unique(out)) == len(pos) and out.max() < 3 * 10**6
    assert perm.index(3 * 10**6 - 1) == int(perm([3 * 10**6 - 1])[0])


@pytest.mark.parametrize("args, kwargs, exc, msg", [
    (([3, 2], 1, 0), {}, ValueError, "BlockPermutation: block_ends must be non-decreasing cumulative ends "
                                     "(block_ends[1] = 2 < block_ends[0] = 3)"),
    (([-1, 2], 1, 0), {}, ValueError, "BlockPermutation: block_ends[0] must be >= 0 (got -1)"),
    (([[1, 2]], 1, 0), {}, ValueError, "BlockPermutation: block_ends must be 1-D (got shape (1, 2))"),
    (([1.5], 1, 0), {}, TypeError, "BlockPermutation: block_ends must be ints (got dtype float64)"),
    (("12", 1, 0), {}, TypeError, "BlockPermutation: block_ends must be a 1-D array-like of ints (got str)"),
    (([4], -1, 0), {}, ValueError, "BlockPermutation: window must be None (a full shuffle) or an int >= 0 (got -1)"),
    (([4], True, 0), {}, TypeError, "BlockPermutation: window must be None (a full shuffle) or an int >= 0 "
                                    "(got bool True)"),
    (([4], 1, -1), {}, ValueError, "BlockPermutation: seed must be a non-negative int (got -1)"),
    (([4], 1, 0), {"lanes": 0}, ValueError, "BlockPermutation: lanes must be a positive int (got 0)"),
    (([4], 1, 0), {"chunk": 0}, ValueError, "BlockPermutation: chunk must be a positive int (got 0)"),
])
def test_argument_errors_name_the_argument(args, kwargs, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        BlockPermutation(*args, **kwargs)


# -- measures ---------------------------------------------------------------------------------------

ENDS = np.cumsum(np.full(400, 250, dtype=np.int64))  # 400 blocks of 250 rows


@pytest.mark.parametrize("window", [1, 4, 16])
def test_lanes_make_each_worker_decode_about_its_own_blocks_only(window):
    n = int(ENDS[-1])
    lanes = BlockPermutation(ENDS, window, seed=11, lanes=2, chunk=64)(np.arange(n))
    assert bytes_read_ratio(lanes, ENDS, batch_size=64, num_workers=2, cache_blocks=window) <= 1.1
    one_lane = BlockPermutation(ENDS, window, seed=11)(np.arange(n))
    assert bytes_read_ratio(one_lane, ENDS, batch_size=64, num_workers=2, cache_blocks=window) >= 1.8


def test_shuffle_quality_ranks_sequential_windowed_and_full():
    n = int(ENDS[-1])
    q = {w: shuffle_quality(BlockPermutation(ENDS, w, seed=1)(np.arange(n)), ENDS, batch_size=64)
         for w in (0, 1, 16, None)}
    assert q[0]["rank_correlation"] == pytest.approx(1.0) and q[0]["blocks_per_batch"] < 1.5
    assert abs(q[None]["rank_correlation"]) < 0.05 and q[None]["neighbour_distance"] == pytest.approx(1.0, abs=0.05)
    per_batch = [q[w]["blocks_per_batch"] for w in (0, 1, 16, None)]
    assert per_batch == sorted(per_batch) and q[None]["blocks_per_batch"] > 50
    same = [q[w]["same_block_pairs"] for w in (0, 1, 16, None)]
    assert same == sorted(same, reverse=True)


def test_measure_argument_errors():
    with pytest.raises(IndexError, match=re.escape("bytes_read_ratio: order holds indices outside [0, 4)")):
        bytes_read_ratio([0, 4], [4], batch_size=1, num_workers=1, cache_blocks=0)
    with pytest.raises(ValueError, match=re.escape("bytes_read_ratio: cache_blocks must be a non-negative int")):
        bytes_read_ratio([0], [4], batch_size=1, num_workers=1, cache_blocks=-1)
    with pytest.raises(ValueError, match="bytes_read_ratio: block_bytes must have one entry per block"):
        bytes_read_ratio([0], [4], batch_size=1, num_workers=1, cache_blocks=0, block_bytes=[1, 2])
    assert bytes_read_ratio([0, 1, 2, 3], [2, 4], batch_size=2, num_workers=1, cache_blocks=0,
                            block_bytes=[100, 300]) == 1.0


# -- split seams ------------------------------------------------------------------------------------

@given(block_sizes, windows, seeds, st.integers(1, 4), st.integers(1, 7))
def test_split_seams_is_a_bijection_whose_lanes_read_their_own_region(sizes, window, seed, lanes, chunk):
    ends = ends_of(sizes)
    n = ends[-1] if ends else 0
    shared = BlockPermutation(ends, window, seed, lanes=lanes, chunk=chunk)
    split = BlockPermutation(ends, window, seed, lanes=lanes, chunk=chunk, split_seams=True)
    order = split(np.arange(n))
    assert sorted(order.tolist()) == list(range(n)) and [split.index(p) for p in range(n)] == order.tolist()
    assert split.lane_bounds() == shared.lane_bounds()
    plain = BlockPermutation(ends, window, seed)(np.arange(n)).tolist()
    bounds = split.lane_bounds()
    s = lane_oracle(n, lanes, chunk)
    cut = {int(b) for b in bounds[1:-1]}
    wstart = shared._wstart.tolist() if shared._shuffled else []
    for w in range(len(wstart) - 1):
        lo, hi = wstart[w], wstart[w + 1]
        inside = [p for p in range(n) if lo <= s[p] < hi]
        # the rows of a window are the same; a window no lane boundary cuts keeps its order
        assert sorted(order[inside].tolist()) == sorted(plain[lo:hi])
        if window is None or not any(lo < b < hi for b in cut):
            assert order[inside].tolist() == shared(np.array(inside, dtype=np.int64)).tolist()


def test_with_split_seams_two_lanes_share_at_most_the_block_across_their_boundary():
    ends = np.cumsum(np.full(20, 4096))                    # 20 row groups, as in issue 28
    n = int(ends[-1])
    for window in (4, 8):
        for split, most in ((False, window), (True, 1)):
            perm = BlockPermutation(ends, window, seed=0, lanes=2, chunk=64, split_seams=split)
            order = perm(np.arange(n))
            lo, mid, hi = perm.lane_bounds()
            lanes = [order[np.arange(n) // 64 % 2 == lane] for lane in (0, 1)]
            blocks = [set(np.searchsorted(ends, lane, side="right").tolist()) for lane in lanes]
            assert len(blocks[0] & blocks[1]) <= most
            ratio = bytes_read_ratio(order, ends, batch_size=64, num_workers=2, cache_blocks=window)
            assert ratio <= (1.05 if split else 1.0 + window / 20 + 0.01)
        assert ratio <= 1.05


def test_the_split_seams_order_is_pinned_and_repr_pickle_and_equality_know_it():
    perm = BlockPermutation([3, 7, 7, 12], window=2, seed=42, lanes=2, chunk=2, split_seams=True)
    assert perm(np.arange(12)).tolist() == PINNED_SPLIT
    assert repr(perm) == "BlockPermutation(blocks=4, window=2, seed=42, lanes=2, chunk=2, split_seams=True, n=12)"
    clone = pickle.loads(pickle.dumps(perm))
    assert clone == perm and clone(np.arange(12)).tolist() == PINNED_SPLIT
    assert perm != BlockPermutation([3, 7, 7, 12], window=2, seed=42, lanes=2, chunk=2)
    with pytest.raises(TypeError, match="BlockPermutation: split_seams must be a bool"):
        BlockPermutation([3], window=1, seed=0, split_seams=1)


PINNED_SPLIT = [4, 6, 9, 10, 5, 3, 11, 0, 7, 8, 1, 2]
