"""Skipped positions backfilled from the tail (``orders/holes.py``) and skips registered during an
epoch (``loader/recipe/changes.py``): property tests against a list-built oracle."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from seqloader.loader.recipe.changes import RecipeChanges, Skip, skip_ranges
from seqloader.orders.holes import HoledOrder, Intervals
from seqloader.orders.orders import BijectiveOrder, RangeOrder, positions_of
from seqloader.orders.steps import BatchSizes


@given(n=st.integers(0, 60), data=st.data())
def test_holes_are_backfilled_from_the_tail_and_every_kept_sample_is_read_once(n, data):
    holes = data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else set()
    order = HoledOrder(RangeOrder(n), Intervals.of_points(sorted(holes)))
    read = order.run(0, order.n, 1) if order.n else []
    assert order.n == n - len(holes) and sorted(read) == sorted(set(range(n)) - holes)
    tail = [p for p in range(n - 1, -1, -1) if p not in holes]  # the oracle: the k-th hole takes tail[k]
    k = 0
    for q in range(order.n):
        if q in holes:
            assert read[q] == tail[k]
            k += 1
        else:
            assert read[q] == q  # every other position is unchanged
    pos = np.arange(order.n, dtype=np.int64)
    assert order.lookup(pos) == read  # vectorised lookup == run


@given(ranges=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=6), x=st.integers(-2, 55))
def test_intervals_count_and_contain_like_a_set(ranges, x):
    iv = Intervals(ranges)
    points = {p for a, b in ranges for p in range(a, b)}
    assert len(iv) == len(points)
    assert int(iv.count_below(np.array([x]))[0]) == sum(p < x for p in points)
    assert bool(iv.contains(np.array([x]))[0]) == (x in points)
    assert Intervals.of_points(sorted(points)).ranges() == iv.ranges()


@given(n=st.integers(1, 80), seed=st.integers(0, 2**32), data=st.data())
def test_skips_registered_during_an_epoch_never_change_what_was_read(n, seed, data):
    """Read the epoch position by position; register skips at random moments: positions already
    read never change, no sample is read twice, and a skipped sample is read only if it had been
    read before its skip was registered."""
    base = BijectiveOrder(n, seed)
    changes, read, position = RecipeChanges(), [], 0
    while True:
        holes = changes.holes(0, base)
        order = HoledOrder(base, holes) if len(holes) else base
        if position >= order.n:
            break
        if data.draw(st.booleans()):  # a skip now, of indices or of a position range ahead
            if data.draw(st.booleans()):
                idx = data.draw(st.lists(st.integers(0, n - 1), max_size=4))
                if idx:
                    changes = changes.with_skip(Skip(0, position, "indices", skip_ranges(idx)))
            else:
                lo = data.draw(st.integers(position, n))
                hi = data.draw(st.integers(lo, n))
                if hi > lo:
                    changes = changes.with_skip(Skip(0, position, "positions", ((lo, hi),)))
            holes = changes.holes(0, base)
            order = HoledOrder(base, holes) if len(holes) else base
            if position >= order.n:
                break
            assert order.lookup(np.arange(position, dtype=np.int64)) == read  # the past is kept
        read.append(order.lookup(np.array([position], dtype=np.int64))[0])
        position += 1
    assert len(read) == len(set(read))
    skipped_indices = {i for s in changes.skips if s.kind == "indices" for a, b in s.ranges for i in range(a, b)}
    for s in changes.skips:
        if s.kind == "indices":
            late = [i for a, b in s.ranges for i in range(a, b) if i in read[s.position:]]
            assert not late, f"{late} read after their skip at position {s.position}"
    assert set(read) | skipped_indices | _skipped_positions(changes, base) >= set(range(n)) - set()


def _skipped_positions(changes, base):
    out = set()
    for s in changes.skips:
        if s.kind == "positions":
            out |= set(base.lookup(np.array([p for a, b in s.ranges for p in range(a, b)], dtype=np.int64)))
    return out


@given(n=st.integers(0, 200), seed=st.integers(0, 2**20), idx=st.lists(st.integers(-5, 210), max_size=10))
def test_positions_of_inverts_the_order(n, seed, idx):
    for order in (RangeOrder(n), BijectiveOrder(n, seed)):
        pos = positions_of(order, idx)
        wanted = {i for i in idx if 0 <= i < n}
        assert sorted(order.lookup(pos)) == sorted(wanted) if n else pos.size == 0


@given(size=st.integers(1, 6), changes=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 9)), max_size=4),
       first=st.integers(0, 40), total=st.integers(0, 200), drop=st.booleans())
def test_batch_sizes_against_a_step_by_step_oracle(size, changes, first, total, drop):
    steps = sorted({s for s, _ in changes})
    schedule = [(s, dict(changes)[s]) for s in steps]
    sizes = BatchSizes(size, schedule)

    def oracle_size(step):
        current = size
        for s, z in schedule:
            if step >= s:
                current = z
        return current

    assert [sizes.size(s) for s in range(60)] == [oracle_size(s) for s in range(60)]
    for b in range(12):
        assert sizes.offset(first, b) == sum(oracle_size(first + t) for t in range(b))
    left, count = total, 0
    while left > 0:
        z = oracle_size(first + count)
        if left < z and drop:
            break
        left, count = left - z, count + 1
    assert sizes.count(first, total, drop) == count
    for b in range(count):
        assert sizes.batch_at(first, sizes.offset(first, b)) == b
    step = first + count
    assert sizes.steps_before(step, sizes.offset(first, count)) >= count
