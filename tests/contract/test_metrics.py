"""What every executor shows on a dashboard (``seqloader.export_metrics``): the batches and samples
consumed, each worker's busy seconds, and a dead worker replaced.

Each worker's busy seconds are the wall time of the items it computed, which every executor
reports with each result (processes, threads, threads inside processes, Ray actors); at
``num_workers=0`` there are no workers (``tests/integrations/test_prometheus.py``). A worker dies
once: the first read of one sample ends its process (a marker file created with ``O_EXCL``
decides which read is the first, across processes), and its replacement computes the batch again.
"""

from __future__ import annotations

import os

import pytest
import torch

import seqloader
from contract_fixtures import executor, no_leaks, process_executor, ray_cluster  # noqa: F401 (fixtures)

prometheus_client = pytest.importorskip("prometheus_client", reason="prometheus_client is in the 'test' extra")
from prometheus_client import CollectorRegistry  # noqa: E402

LABELS = {"loader": "train"}


class DiesOnce(torch.utils.data.Dataset):
    """Sample ``i`` is ``i``; the first read of sample ``at`` (in any process) ends that process."""

    def __init__(self, directory, at, n=48):
        self.directory, self.at, self.n = str(directory), at, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            try:
                os.close(os.open(os.path.join(self.directory, "died"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return i
            os._exit(9)
        return i


def test_every_executor_counts_the_batches_consumed_and_each_workers_busy_seconds(executor):
    loader = seqloader.DataLoader(range(48), batch_size=4, seed=0, **executor)
    registry = CollectorRegistry()
    seqloader.export_metrics(loader, registry, labels=LABELS)
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert registry.get_sample_value("seqloader_batches_total", LABELS) == 5.0   # not the read-ahead
    assert registry.get_sample_value("seqloader_samples_total", LABELS) == 20.0
    list(it)
    assert registry.get_sample_value("seqloader_batches_total", LABELS) == 12.0
    assert registry.get_sample_value("seqloader_samples_total", LABELS) == 48.0
    busy = [registry.get_sample_value("seqloader_worker_busy_seconds_total", {**LABELS, "worker": str(w)})
            for w in range(3)]
    assert busy[0] > 0 and busy[1] > 0 and busy[2] is None, busy
    assert sum(w["items"] for w in loader.totals()["workers"]) >= 12
    assert registry.get_sample_value("seqloader_worker_restarts_total", LABELS) == 0.0


def test_a_healed_worker_is_counted_and_the_batches_are_those_of_a_run_without_death(process_executor, tmp_path):
    want = list(seqloader.DataLoader(range(48), batch_size=4, seed=0, **process_executor))
    loader = seqloader.DataLoader(DiesOnce(tmp_path, at=21), batch_size=4, seed=0, max_worker_restarts=1,
                                  **process_executor)
    registry = CollectorRegistry()
    seqloader.export_metrics(loader, registry, labels=LABELS)
    got = list(loader)
    assert os.path.exists(tmp_path / "died")
    assert len(got) == len(want) == 12 and all(torch.equal(g, w) for g, w in zip(got, want))
    assert registry.get_sample_value("seqloader_worker_restarts_total", LABELS) == 1.0
    assert registry.get_sample_value("seqloader_batches_total", LABELS) == 12.0
    assert registry.get_sample_value("seqloader_samples_total", LABELS) == 48.0
    # the replacement keeps the dead worker's index: still two workers, one restart among them
    restarts = [w["restarts"] for w in loader.totals()["workers"]]
    assert len(restarts) == 2 and sum(restarts) == 1
    list(loader)   # the next epoch: the counters go on
    assert registry.get_sample_value("seqloader_worker_restarts_total", LABELS) == 1.0
    assert registry.get_sample_value("seqloader_batches_total", LABELS) == 24.0
