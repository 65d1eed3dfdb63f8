"""The loader's worker set-up (``seqloader/loader/workers/pool.py``): torch's, through the prefetcher's init hook.

Datasets are module-level classes so that they pickle for ``spawn``.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

import seqloader as sl
from seqloader import prefetch
from seqloader.loader.epoch.batches import EpochBatches
from seqloader.orders.orders import RangeOrder as _Range
from seqloader.orders.plans import OrderPlan
from seqloader.loader.rngs.seeding import preserved_globals
from seqloader.loader.torch_compat import worker_info_hidden
from seqloader.loader.workers.pool import TorchWorkerSetup, worker_base_seed


def identity(data):
    return data  # a collate step that keeps the sample (module-level: it pickles)


class Info:
    """Item ``i``: what ``get_worker_info()`` and ``worker_init_fn`` tell the worker computing it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return (info.id, info.num_workers, info.seed, type(info.dataset).__name__,
                os.environ.get("SEQLOADER_TEST_INIT"), torch.initial_seed())


def init_env(worker_id):
    info = torch.utils.data.get_worker_info()
    os.environ["SEQLOADER_TEST_INIT"] = f"{worker_id}/{info.num_workers}"


class Draws:
    """Item ``i`` draws from all three global RNGs."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return random.random(), float(np.random.random()), float(torch.rand(()))


def _info_seen(i):
    return torch.utils.data.get_worker_info() is not None


def _hidden_collate(items):
    with worker_info_hidden():
        out = torch.utils.data.default_collate(items), torch.utils.data.get_worker_info() is None
    return out + (torch.utils.data.get_worker_info() is not None,)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_setup_gives_each_worker_torchs_worker_info_seeds_and_init_fn(method):
    setup = TorchWorkerSetup(2, base_seed=1000, dataset=Info(), user_fn=init_env)
    with prefetch(Info(), num_workers=2, worker_init_fn=setup, multiprocessing_context=method) as p:
        got = list(p)
    assert {g[0] for g in got} == {0, 1}
    for wid, n, seed, ds_name, init, initial in got:
        assert (n, seed, ds_name, init, initial) == (2, 1000 + wid, "Info", f"{wid}/2", 1000 + wid)


def test_worker_info_dataset_is_the_setups_dataset_and_shared_with_later_sequences():
    data = Info()
    setup = TorchWorkerSetup(1, base_seed=0, dataset=data, user_fn=None)
    with prefetch(sl.gather(data, np.arange(8)), 1, worker_init_fn=setup, shared=data) as p:
        assert p[0][3] == "Info"
        p.reset(sl.gather(data, [3]))
        assert p[0][3] == "Info"


def test_worker_seeds_fit_a_signed_64_bit_int_like_torchs():
    for seed in (0, 2**64 - 1, 12345):
        for epoch in (0, 7):
            assert 0 <= worker_base_seed(seed, epoch) + 64 < 2**63


def test_epoch_batches_draw_the_same_globals_in_any_worker_and_order():
    seq = EpochBatches(Draws(), OrderPlan(_Range(12), 0, None, False), identity, seed=5, epoch=2)
    with preserved_globals():
        expected = [seq[i] for i in range(12)]
    setup = TorchWorkerSetup(2, base_seed=1, dataset=seq, user_fn=None)
    with prefetch(seq, num_workers=2, prefetch_factor=1, worker_init_fn=setup) as p:
        assert [p[i] for i in [11, 3, 4, 0]] == [expected[i] for i in [11, 3, 4, 0]]
        p.reset(EpochBatches(Draws(), OrderPlan(_Range(12), 0, None, False), identity, seed=5,
                             epoch=3))
        assert p[0] != expected[0]


def test_worker_info_can_be_hidden_around_collation_only():
    seq = sl.batch(sl.smap(_info_seen, range(6)), 3, collate_fn=_hidden_collate)
    setup = TorchWorkerSetup(1, base_seed=0, dataset=seq, user_fn=None)
    with prefetch(seq, num_workers=1, worker_init_fn=setup) as p:
        for items, hidden, restored in p:
            assert items.tolist() == [True] * 3 and hidden and restored


def test_loader_workers_see_torchs_worker_info_and_reproducible_seeds():
    def seeds():
        loader = sl.DataLoader(Info(), batch_size=None, num_workers=2, seed=3)
        return sorted({(g[0], g[2]) for g in loader})
    a = seeds()
    assert a == seeds() and [w for w, _ in a] == [0, 1] and a[1][1] == a[0][1] + 1


def test_an_iterator_keeps_its_workers_when_the_loader_is_a_temporary():
    got = [b.tolist() for b in sl.DataLoader(list(range(20)), batch_size=4, num_workers=2, seed=0)]
    assert got == [list(range(i, i + 4)) for i in range(0, 20, 4)]
