"""A scale simulation (issue 11.5), pure arithmetic: 10**9 samples on 1024 ranks, resumed mid-epoch
on 768 and on 1536 ranks. By sampling positions: every sample of the epoch is read exactly once
across both halves (plus the documented padding of the last round), memory stays O(1), and the plan
of any rank is built in O(1)."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest

from seqloader.orders.orders import builtin_order
from seqloader.orders.plans import OrderPlan

N, BS, SAVED_WORLD = 10**9, 32, 1024
STEPS = 20_000                              # steps taken before the checkpoint
POSITION = STEPS * BS * SAVED_WORLD         # the state's position: samples of the global order read


def reader(q: int, start: int, world: int) -> tuple[int, int, int]:
    """Which ``(rank, batch, offset)`` reads global position ``q >= start`` of an epoch resumed at
    ``start`` on ``world`` ranks (the DistributedSampler layout: rank r reads start + r + j*world)."""
    rank, j = (q - start) % world, (q - start) // world
    return rank, j // BS, j % BS


@pytest.mark.parametrize("new_world", [768, 1536])
def test_every_sample_is_read_once_across_the_checkpoint(new_world):
    order = builtin_order(N, seed=11, epoch=3, shuffle=True)
    rng = random.Random(new_world)
    tracemalloc.start()
    try:
        for q in [rng.randrange(N) for _ in range(60)] + [0, POSITION - 1, POSITION, N - 1]:
            if q < POSITION:   # read before the checkpoint, on 1024 ranks from position 0
                rank, b, k = reader(q, 0, SAVED_WORLD)
                plan = OrderPlan(order, 0, BS, False, rank, SAVED_WORLD)
                assert b < STEPS                      # ... in a step taken before saving
            else:              # read after it, on new_world ranks from the saved position
                rank, b, k = reader(q, POSITION, new_world)
                plan = OrderPlan(order, POSITION, BS, False, rank, new_world)
            key, idx = plan.batch(b)
            assert idx[k] == order.lookup(np.array([q]))[0]
            # and the other half does not read q: before the checkpoint, rank q % 1024 reads q in
            # step (q // 1024) // BS, which was taken iff q < POSITION
            assert ((q // SAVED_WORLD) // BS < STEPS) == (q < POSITION)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # O(1): a few chunks of 4096 images, never n


@pytest.mark.parametrize("new_world", [768, 1536])
def test_the_padding_and_the_drop_rule_of_the_resumed_last_round(new_world):
    order = builtin_order(N, seed=11, epoch=3, shuffle=True)
    remaining = N - POSITION
    padded = OrderPlan(order, POSITION, BS, False, 0, new_world)
    dropped = OrderPlan(order, POSITION, BS, True, 0, new_world)
    assert padded.per_rank == -(-remaining // new_world) and dropped.per_rank == remaining // new_world
    pad = padded.per_rank * new_world - remaining   # positions past the end wrap to the order's start
    assert 0 <= pad < new_world
    last_rank = new_world - 1
    if pad:
        plan = OrderPlan(order, POSITION, BS, False, last_rank, new_world)
        b = (padded.per_rank - 1) // BS
        _, idx = plan.batch(b)
        q = POSITION + last_rank + (padded.per_rank - 1) * new_world
        assert q >= N and idx[-1] == order.lookup(np.array([q % N]))[0]
    # every rank gets the same number of batches, whatever the world size
    lens = {len(OrderPlan(order, POSITION, BS, False, r, new_world)) for r in (0, new_world // 2, last_rank)}
    assert len(lens) == 1


def test_a_plan_for_any_rank_is_constant_time_and_memory():
    order = builtin_order(N, seed=1, epoch=0, shuffle=True)
    tracemalloc.start()
    try:
        for rank in (0, 511, 1535):
            plan = OrderPlan(order, POSITION, BS, False, rank, 1536)
            plan.batch(len(plan) - 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
