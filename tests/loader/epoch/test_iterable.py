"""IterableDataset: torch's worker split and round-robin, plus per-worker resume state."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from seqloader import DataLoader

from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip, run_saving_after


class MyIterableDataset(IterableDataset):
    """torchdata's tutorial dataset: a Stateful per-worker stream."""

    def __init__(self, high: int, seed: int):
        self.high, self.seed = high, seed
        self.g = torch.Generator()
        self.i = 0

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        self.g.manual_seed(self.seed)
        arr = torch.randperm(self.high, generator=self.g)
        arr = arr[worker_id:self.high:num_workers]
        for idx in range(self.i, len(arr)):
            self.i += 1
            yield arr[idx]
        self.i = 0

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state_dict):
        self.i = state_dict["i"]


class Uneven(IterableDataset):
    """No state_dict (resume replays); worker 0 has twice the items; draws from torch's RNG."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        items = [i for i in range(self.n) if i % (nw + 1) in ((0, 1) if wid == 0 else (wid + 1,))]
        for i in items:
            yield {"i": i, "noise": torch.rand(())}


def make_tutorial(nw):
    return DataLoader(MyIterableDataset(12, 0), batch_size=2, drop_last=False, num_workers=nw, seed=0)


def make_uneven(nw):
    return DataLoader(Uneven(13), batch_size=2, num_workers=nw, seed=1)


def test_tutorial_stateful_iterable_dataset():
    for num_workers in (0, 2):
        dl = make_tutorial(num_workers)
        batches, sd = run_saving_after(dl, 2)
        dl.load_state_dict(sd)
        assert_batches_equal(list(dl), batches[3:], f"num_workers={num_workers}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_iterable_resumes_exactly(num_workers):
    assert_resumes_exactly(make_tutorial, [1, 4, -1], workers=(num_workers,))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_without_state_replays_and_warns(num_workers, caplog):
    with caplog.at_level(logging.WARNING, logger="seqloader"):
        assert_resumes_exactly(make_uneven, [1, 3, 5], workers=(num_workers,))
    assert "replays its stream" in caplog.text


def test_uneven_worker_streams_resume_after_one_ends():
    ref = make_uneven(2)
    e0 = list(ref)
    assert len(e0) == 7  # worker 0: 9 items -> 5 batches; worker 1: 4 items -> 2 batches
    assert_resumes_exactly(make_uneven, [4, 5, 6], workers=(2,))


def test_iterable_state_is_json_and_names_workers():
    loader = make_tutorial(2)
    it = iter(loader)
    next(it), next(it), next(it)
    sd = loader.state_dict()
    assert json_round_trip(sd) == sd
    assert sd["position"] == 3  # the next batch comes from stream 3 % 2 = 1
    assert [w["batches"] for w in sd["iterable"]["workers"]] == [2, 1]
    assert sd["dataset"] is None and sd["saved_with"]["num_workers"] == 2
    del it


def test_iterable_resume_with_other_num_workers_is_rejected():
    loader = make_tutorial(2)
    sd = loader.state_dict()
    other = make_tutorial(0)
    with pytest.raises(ValueError, match=r"num_workers=2 when saved, num_workers=0 now"):
        other.load_state_dict(sd)


def test_worker_info_dataset_is_the_users_dataset():
    seen = []

    class Probe(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            yield type(info.dataset).__name__

    loader = DataLoader(Probe(), batch_size=None, num_workers=1, seed=0)
    seen = list(loader)
    assert seen == ["Probe"]


def test_iterable_epochs_advance():
    loader = make_tutorial(0)
    e0, e1 = list(loader), list(loader)
    assert loader.state_dict()["epoch"] == 2 and len(e0) == len(e1) == 6


def test_iterable_at_num_workers_0_leaves_the_callers_rng_alone_and_is_reproducible():
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    a = list(make_uneven(0))
    assert torch.equal(torch.rand(3), want)
    assert_batches_equal(list(make_uneven(0)), a)
