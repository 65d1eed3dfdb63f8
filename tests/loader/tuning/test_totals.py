"""``loader/tuning/totals.py``: what the loop consumed since the loader was built (``DataLoader.totals()``).

The histogram's buckets, the samples of a batch, the sums over epochs against ``stats()``, and
the order in which an epoch's start retires its numbers: a reader in another thread (a scrape)
may count less than the truth for a moment, never more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqloader import DataLoader
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.loader.tuning.totals import BOUNDS, Totals, samples_in


def test_buckets_are_inclusive_upper_bounds_from_100_us_to_10_s_then_inf():
    assert (BOUNDS[0], BOUNDS[-1], len(BOUNDS)) == (1e-4, 10.0, 16)
    assert list(BOUNDS) == sorted(BOUNDS)
    t = Totals()
    for w in (0.0, 1e-4, 1.0001e-4, 0.3, 10.0, 10.5):
        t.add(w)
    r = t.read(t.gone, [], 0, None)
    cumulative = dict(r["wait_buckets"])
    assert (cumulative[1e-4], cumulative[2.5e-4], cumulative[0.5], cumulative[10.0], cumulative[float("inf")]) == \
        (2, 3, 4, 5, 6)
    assert r["batches"] == 6 and r["wait_s"] == pytest.approx(0.0 + 1e-4 + 1.0001e-4 + 0.3 + 10.0 + 10.5)
    counts = [n for _, n in r["wait_buckets"]]
    assert counts == sorted(counts)  # cumulative: never decreasing


@pytest.mark.parametrize("batch, n", [
    (torch.zeros(8, 3), 8),
    ({"x": torch.zeros(5), "y": ["a"] * 5}, 5),
    ([torch.zeros(3, 2), torch.zeros(3)], 3),
    ((np.zeros((6, 1)), "label"), 6),
    (["a", "b"], 2),
    ([{"x": torch.zeros(7)}], 7),
    (torch.tensor(3), 1),
    (object(), 0),
    ({}, 0),
])
def test_samples_in_a_batch(batch, n):
    assert samples_in(batch) == n


def test_samples_are_counted_once_asked_and_a_raised_batch_adds_none():
    t = Totals()
    t.add(0.001, torch.zeros(4))
    assert t.samples is None
    t.count_samples(one_per_batch=False)
    t.add(0.001, torch.zeros(4))
    t.add(0.001)  # raised
    t.add(0.001, None)  # a batch that is None (batch_size=None over a dataset of Nones) is a batch
    t.count_samples(one_per_batch=True)
    t.add(0.001, None)
    assert (t.samples, t.read(t.gone, [], 0, None)["batches"]) == (5, 5)


def test_the_totals_sum_the_epochs_of_stats():
    loader = DataLoader(list(range(22)), batch_size=4, num_workers=2, seed=0, multiprocessing_context="fork")
    loader.totals(count_samples=True)
    list(loader)
    list(loader)
    s, t = loader.stats(), loader.totals()
    assert t["batches"] == s["last"]["batches"] + s["current"]["batches"] == 12
    assert t["wait_s"] == pytest.approx(s["last"]["wait_s"] + s["current"]["wait_s"])
    assert t["samples"] == 44
    for i, w in enumerate(t["workers"]):
        for k in ("busy_s", "items"):
            assert w[k] == pytest.approx(s["last"]["workers"][i][k] + s["current"]["workers"][i][k])
    assert sum(w["items"] for w in t["workers"]) >= 12  # read-ahead included
    assert t["input_bound"] == s["current"]["input_bound"]


class FakeSource:
    """A ``Prefetch``'s counters, set by the test."""

    def __init__(self):
        self.busy = 0.0

    def counters(self):
        return {"workers": [{"busy_s": self.busy, "cpu_s": 0.0, "items": 0, "restarts": 0}], "reads": 0,
                "ready_sum": 0, "shm_bytes": 0, "restarts": 0, "stages": {}, "executor": "process"}


def test_a_reader_during_an_epochs_start_never_counts_twice(monkeypatch):
    stats, source = LoaderStats(), FakeSource()
    truth = []
    for epoch in range(3):
        stats.begin(epoch)
        stats.attach(source)
        stats.returned(stats.start(), torch.zeros(1))
        source.busy += 1.0
        truth.append(float(epoch + 1))
    seen = []
    retire = Totals.retire

    def watched(self, epoch_stats):   # a scrape right before and right after the retirement
        seen.append(stats.read_totals()["workers"][0]["busy_s"])
        retire(self, epoch_stats)
        seen.append(stats.read_totals()["workers"][0]["busy_s"])

    monkeypatch.setattr(Totals, "retire", watched)
    stats.begin(3)
    seen.append(stats.read_totals()["workers"][0]["busy_s"])
    assert all(v <= truth[-1] for v in seen), seen
    assert seen[-1] == truth[-1] == 3.0
