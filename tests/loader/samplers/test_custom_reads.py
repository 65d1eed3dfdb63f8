"""When a custom sampler is iterated (``seqloader/loader/samplers/custom.py``): once per epoch, at
the iterator's first ``next()``, so that a ``set_epoch`` made between ``iter()`` and the first
batch (what Lightning does when a fit or a resume begins) is the epoch read.

The oracle is torch's ``DataLoader`` with the same counting sampler: at ``num_workers=0`` torch
iterates it at the first ``next()`` (its ``BatchSampler``'s generator starts there), once, and
reads the ``set_epoch``'s order. With worker processes torch iterates it once too, but at
``iter()`` (the priming of its index queues in ``_MultiProcessingDataLoaderIter._reset``), so a
later ``set_epoch`` does not reach that epoch there; seqloader reads it at the first ``next()``
on every executor (docs/migrating.md), so its order is torch's single-process one.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Sampler

from seqloader import DataLoader
from seqloader.testing import assert_batches_equal

N, BATCH = 12, 4


class CountingSampler(Sampler):
    """A permutation of ``range(N)`` per ``epoch`` (Lightning's samplers have ``set_epoch``) that
    counts its ``__iter__`` calls."""

    def __init__(self):
        self.epoch, self.calls = 0, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return N

    def __iter__(self):
        self.calls += 1
        return iter(torch.randperm(N, generator=torch.Generator().manual_seed(self.epoch)).tolist())


def torch_epochs(num_workers: int) -> tuple[list, list]:
    """torch's batches and sampler counts for: iter(), set_epoch(3), next() ...; again with 4."""
    sampler = CountingSampler()
    loader = torch.utils.data.DataLoader(list(range(N)), sampler=sampler, batch_size=BATCH, num_workers=num_workers)
    epochs, calls = [], []
    for epoch in (3, 4):
        it = iter(loader)
        sampler.set_epoch(epoch)
        epochs.append([next(it)] + list(it))
        calls.append(sampler.calls)
    return epochs, calls


@pytest.mark.parametrize("kw", [dict(num_workers=0), dict(num_workers=2),
                                dict(num_workers=2, persistent_workers=True, in_order=False)],
                         ids=["main", "workers", "persistent-unordered"])
def test_a_custom_sampler_is_iterated_once_at_the_first_next_after_set_epoch(kw):
    theirs, _ = torch_epochs(0)
    _, their_calls = torch_epochs(kw["num_workers"])
    sampler = CountingSampler()
    loader = DataLoader(list(range(N)), sampler=sampler, batch_size=BATCH, seed=0, **kw)
    for e, epoch in enumerate((3, 4)):
        it = iter(loader)
        assert sampler.calls == e  # not iterated by iter()
        assert len(it) == N // BATCH  # torch's len(iterator), without iterating it
        sampler.set_epoch(epoch)
        first = next(it)
        assert sampler.calls == e + 1 == their_calls[e]
        got = [first] + list(it)
        if kw.get("in_order", True):
            assert_batches_equal(got, theirs[e])  # the set_epoch's order
        else:  # as they complete: the same batches
            assert sorted(b.tolist() for b in got) == sorted(b.tolist() for b in theirs[e])
        assert sampler.calls == e + 1
        assert loader.state_dict()["sampler_epoch"] == epoch


@pytest.mark.parametrize("load_workers", [0, 2])
def test_a_resume_after_iter_then_set_epoch_reads_the_rest_once(load_workers):
    """Lightning resuming mid-epoch: load_state_dict, iter(), set_epoch(the saved epoch), next()."""
    def make(num_workers=0):
        sampler = CountingSampler()
        return DataLoader(list(range(N)), sampler=sampler, batch_size=BATCH, seed=0, num_workers=num_workers), sampler

    whole, _ = make()
    whole.sampler.set_epoch(3)
    reference = list(whole)
    saved, _ = make()
    it = iter(saved)
    saved.sampler.set_epoch(3)
    head = [next(it)]
    state = saved.state_dict()
    fresh, sampler = make(load_workers)
    fresh.load_state_dict(state)
    it = iter(fresh)
    sampler.set_epoch(3)
    assert_batches_equal(head + list(it), reference)
    assert sampler.calls == 1


def _no_config(worker_id):
    raise KeyError(f"no config for worker {worker_id}")


def test_the_workers_still_start_at_iter_so_a_failing_worker_init_fn_raises_there():
    sampler = CountingSampler()
    loader = DataLoader(list(range(N)), sampler=sampler, batch_size=BATCH, seed=0, num_workers=2,
                        worker_init_fn=_no_config)
    with pytest.raises(KeyError, match="no config for worker"):
        iter(loader)
    assert sampler.calls == 0
