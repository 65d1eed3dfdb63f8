"""Epoch orders (``seqloader/orders/orders.py``): the chunk-cached bijection equals the direct one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqloader.orders.orders import BijectiveOrder as _Bijective
from seqloader.orders.plans import OrderPlan
from seqloader.orders.permutation import FeistelPermutation


@settings(max_examples=40)
@given(n=st.integers(1, 20_000), world=st.integers(1, 5), bs=st.integers(1, 300), start_frac=st.floats(0, 1),
       seed=st.integers(0, 2**64 - 1), data=st.data())
def test_cached_chunks_give_the_direct_images_for_every_rank_and_seek(n, world, bs, start_frac, seed, data):
    rank = data.draw(st.integers(0, world - 1))
    start = int(start_frac * n)
    direct = FeistelPermutation(n, seed)
    plan = OrderPlan(_Bijective(n, seed), start, bs, False, rank, world)
    for b in range(len(plan)):
        _, idx = plan.batch(b)
        j = np.arange(b * bs, min((b + 1) * bs, plan.per_rank), dtype=np.int64)
        g = (start + rank + j * world) % n
        assert idx == direct(g).astype(np.int64).tolist()


def test_a_seek_at_a_billion_costs_one_chunk_not_n():
    order = _Bijective(10**9, 3)
    plan = OrderPlan(order, 10**9 - 1000, 256, False)
    _, idx = plan.batch(0)
    assert len(idx) == 256 and len(order._chunk[2]) <= _Bijective.CHUNK
