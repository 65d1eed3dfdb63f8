"""``loader/torch_compat.py``: what a dataset sees in seqloader's workers is what torch's workers show it."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils import worker as torch_worker

import seqloader
from seqloader.loader import torch_compat


class Info(torch.utils.data.Dataset):
    """Item ``i`` describes ``get_worker_info()`` in the process that computes it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = get_worker_info()
        return {"type": type(info).__name__, "fields": [f.name for f in dataclasses.fields(info)],
                "id": info.id, "num_workers": info.num_workers, "seed_is_int": isinstance(info.seed, int),
                "worker_method": getattr(info, "worker_method", None),
                "rng": None if getattr(info, "rng", None) is None else type(info.rng).__name__,
                "dataset": type(info.dataset).__name__}


def identity(batch):
    return batch


def infos(loader_cls):
    loader = loader_cls(Info(), batch_size=1, num_workers=2, collate_fn=identity)
    return sorted((item for batch in loader for item in batch), key=lambda d: d["id"])


def test_a_dataset_sees_the_same_worker_info_as_under_torchs_own_workers():
    ours, torchs = infos(seqloader.DataLoader), infos(torch.utils.data.DataLoader)
    assert ours == torchs
    assert {d["id"] for d in ours} == {0, 1} and ours[0]["dataset"] == "Info"


def test_default_collate_in_a_worker_stacks_into_plain_memory_and_a_users_collate_sees_the_info():
    ds = [torch.ones(3)] * 4

    def check(batch):  # runs in a worker: the user's collate sees the info
        assert get_worker_info() is not None
        return default_collate(batch)

    info = torch_compat.install_worker_info(0, 1, seed=0, dataset=ds)
    try:
        out = torch_compat.collate_in_plain_memory(default_collate, ds)
        assert not out.is_shared() and get_worker_info() is info
        assert torch_compat.collate_in_plain_memory(check, ds).shape == (4, 3)
    finally:
        torch_compat.clear_worker_info()
    assert get_worker_info() is None


@pytest.mark.skipif(not hasattr(torch_worker, "_thread_local_worker_info"),
                    reason="this torch has no thread-local worker info (it appears after 2.13)")
def test_hiding_the_info_hides_a_thread_local_one_too():  # pragma: no cover - newer torch
    local = torch_worker._thread_local_worker_info
    info = torch_worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None)
    local.worker_info = info
    try:
        with torch_compat.worker_info_hidden():
            assert get_worker_info() is None
        assert get_worker_info() is info
    finally:
        local.worker_info = None


def test_the_info_is_the_installed_torchs_dataclass_with_its_defaults():
    info = torch_compat.install_worker_info(1, 2, seed=7, dataset="ds")
    try:
        mine = {f.name for f in dataclasses.fields(info)}
        assert mine == {f.name for f in dataclasses.fields(torch_worker.WorkerInfo)}
        if "worker_method" in mine:
            assert info.worker_method == "multiprocessing"
        assert threading.current_thread() is threading.main_thread()
    finally:
        torch_compat.clear_worker_info()
