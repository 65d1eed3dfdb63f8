"""``DataLoader(autotune=...)``: the batches, their order and the state of a fixed loader, whatever it switches to.

Switches are forced deterministically by a :class:`~seqloader.loader.autotune_policy.Schedule`
policy (a switch every few batches, across executors) or by the measuring
:class:`~seqloader.loader.autotune_policy.Tuner` with a tiny trial; every batch is compared with
``torch.equal`` to an ``autotune=False`` run, before and after a resume saved mid-tuning (loaded
into a fixed loader, and the other way round). The tuner's decisions are tested by feeding it
numbers (no process, no clock). Nothing here asserts timing; the leak check (``tests/conftest.py``)
runs on every test of this folder.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch

import seqloader
from seqloader.loader.autotune_policy import BatchTiming, Config, Schedule, Tuner, Usage
from seqloader.testing import assert_batches_equal

N = 48


class Items(torch.utils.data.Dataset):
    """Items that cost a little wall time (so threads overlap) and draw nothing from the globals."""

    def __init__(self, n: int = N, sleep: float = 0.0):
        self.n, self.sleep = n, sleep

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep:
            time.sleep(self.sleep)
        return torch.tensor([i, i * i, 7 * i % 5])


class Drawing(Items):
    """Items that draw from torch's global generator (seeded per batch by the loader)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.cat([super().__getitem__(i), torch.randint(0, 1 << 30, (2,))])


def noisy(n: int = N):
    """A seeded random pipeline that threads may compute: ``rng_map`` draws from ``(seed, index)``."""
    return seqloader.rng_map(lambda x, rng: torch.tensor([x, int(rng.integers(1 << 30))]), range(n), seed=5)


EVERY = [Config("main"), Config("thread", 3), Config("process", 2), Config("process", 2, 2),
         Config("thread", 1, prefetch=3), Config("process", 1, prefetch=1)]
PROCESSES_ONLY = [Config("process", 2), Config("main"), Config("process", 1, prefetch=3)]


def loader(data, autotune=False, **kw):
    kw.setdefault("num_workers", 2)
    return seqloader.DataLoader(data, batch_size=3, shuffle=True, seed=11, autotune=autotune, **kw)


def epochs(dl, n=2):
    return [b for _ in range(n) for b in dl]


@pytest.mark.parametrize("data, configs", [(noisy, EVERY), (Drawing, PROCESSES_ONLY)], ids=["rng_map", "globals"])
@pytest.mark.parametrize("every", [1, 4])
def test_switches_keep_every_batch(data, configs, every):
    expected = epochs(loader(data()))
    schedule = Schedule(configs, every=every)
    got = epochs(loader(data(), autotune=schedule))
    assert_batches_equal(got, expected)
    assert schedule.switches >= 2 * (N // 3) // every - 1


def test_persistent_workers_follow_the_switches():
    expected = epochs(loader(noisy()), 3)
    got = epochs(loader(noisy(), autotune=Schedule(EVERY, every=5), persistent_workers=True), 3)
    assert_batches_equal(got, expected)


@pytest.mark.parametrize("saved_tuned", [True, False], ids=["tuned-to-fixed", "fixed-to-tuned"])
@pytest.mark.parametrize("stop", [1, 5, 9])
def test_resume_across_tuning(saved_tuned, stop):
    fixed_kw = dict(num_workers=2)
    ref = loader(noisy(), **fixed_kw)
    it = iter(ref)
    head = [next(it) for _ in range(stop)]
    ref_state = ref.state_dict()
    rest = list(it) + list(ref)

    tuned = loader(noisy(), autotune=Schedule(EVERY, every=2))
    it = iter(tuned)
    assert_batches_equal([next(it) for _ in range(stop)], head)
    assert tuned.state_dict() == ref_state   # the state of a fixed loader, mid-tuning
    del it

    state = tuned.state_dict() if saved_tuned else ref_state
    target = loader(noisy(), num_workers=1) if saved_tuned else loader(noisy(), autotune=Schedule(EVERY, every=3))
    target.load_state_dict(json.loads(json.dumps(state)))
    assert_batches_equal(list(target) + list(target), rest)


def test_measuring_tuner_switches_and_keeps_every_batch():
    data = Items(200, sleep=0.001)
    expected = epochs(loader(data))
    tuner = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.005)
    dl = loader(data, autotune=tuner)
    got = epochs(dl)
    assert_batches_equal(got, expected)
    report = dl.stats()["autotune"]
    json.dumps(report)
    assert report["switches"] >= 1   # (trials are timed: which came next depends on the machine)
    assert report["log"][0]["from"] == "num_workers=0" and report["log"][0]["to"] == "16 threads, prefetch 2"
    assert dl.stats()["hint"] == report["reason"]


def test_a_dataset_drawing_from_the_globals_is_never_given_threads():
    expected = epochs(loader(Drawing(120)))
    dl = loader(Drawing(120), autotune=Tuner(2, 2**40, 0, trial_s=0.005))
    assert_batches_equal(epochs(dl), expected)
    report = dl.stats()["autotune"]
    assert "16 threads, prefetch 2" in report["refused"]
    assert all("threads" not in t["config"] for t in report["trials"])


def test_a_tiny_memory_budget_refuses_every_worker():
    expected = epochs(loader(noisy()))
    dl = loader(noisy(), autotune=True, memory_budget=1)
    assert_batches_equal(epochs(dl), expected)
    report = dl.stats()["autotune"]
    assert report["current"] == "num_workers=0" and report["chosen"] == "num_workers=0"
    assert set(report["refused"]) == {"16 threads, prefetch 2",
                                      "2 processes, prefetch 2", "2 processes x 4 threads, prefetch 2"}
    assert all(why.startswith("predicted") for why in report["refused"].values())
    assert [t["config"] for t in report["trials"]] == ["num_workers=0"]   # the first batch; no worker started


def test_each_switch_is_logged_once(caplog):
    schedule = Schedule([Config("main"), Config("thread", 2)], every=4)
    with caplog.at_level(logging.INFO, logger="seqloader.autotune"):
        list(loader(noisy(), autotune=schedule))
    lines = [r.getMessage() for r in caplog.records if r.name == "seqloader.autotune"]
    assert len(lines) == schedule.switches
    assert lines[0].startswith("seqloader autotune: num_workers=0 -> 2 threads, prefetch 2")


def test_an_abandoned_tuned_iterator_leaves_nothing_behind():
    dl = loader(noisy(), autotune=Schedule([Config("process", 2), Config("thread", 2)], every=2))
    it = iter(dl)
    for _ in range(5):
        next(it)
    del it   # the leak check of this folder fails the test if a worker outlives it


@pytest.mark.parametrize("kw, match", [
    (dict(worker_method="thread"), "autotune=True chooses the executor"),
    (dict(threads_per_worker=2), "autotune=True chooses the threads"),
    (dict(in_order=False), "in_order=False has no fixed order"),
    (dict(autotune=False, memory_budget=10), "memory_budget applies with autotune=True only"),
    (dict(memory_budget=-1), "memory_budget must be >= 0"),
])
def test_refused_combinations(kw, match):
    kw = {"autotune": True, **kw}
    with pytest.raises(ValueError, match=match):
        loader(noisy(), **kw)


def test_refuses_an_iterable_dataset_and_a_bad_type():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="needs a map-style dataset"):
        seqloader.DataLoader(Stream(), batch_size=2, num_workers=2, seed=0, autotune=True)
    with pytest.raises(TypeError, match="autotune must be a bool or a policy"):
        loader(noisy(), autotune="yes")


# -- the policy, fed numbers ------------------------------------------------------------------


def feed(tuner, n, per_batch, work, start=0.0, cores=1.0):
    """``n`` batches ``per_batch`` seconds apart, the loop working ``work`` of them, ``cores`` busy;
    the configurations asked for."""
    asked, now = [], start
    for k in range(n):
        now += per_batch
        c = tuner.observe(BatchTiming(now, per_batch - work, work, nbytes=100),
                          lambda: Usage(cpu_s=cores * now, loader_bytes=0))
        if c is not None:
            asked.append(c)
    return asked, now


def test_tuner_tries_executors_then_settles_and_stays_put():
    t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.1)
    asked, now = feed(t, 200, 0.01, 0.001)
    assert asked[:4] == [Config("thread", 16), Config("thread", 2), Config("process", 2), Config("process", 2, 4)]
    assert t.chosen is not None and t.report()["trying"] is None
    again, _ = feed(t, 500, 0.01, 0.001, start=now)
    assert again == []   # nothing changed: it stays put


def test_tuner_picks_the_cheapest_that_keeps_a_consumer_bound_loop_fed():
    t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.1)
    # the loop works 10 ms per batch and never waits
    asked, _ = feed(t, 400, 0.01, 0.0099)
    smaller = [c for c in asked if c.workers < 16 and c.method == "thread"] + \
        [c for c in asked if c.method == "main"]
    assert smaller, asked    # it tried fewer threads while the loop kept up
    assert t.chosen is not None and "consumer-bound" in t.reason


def test_tuner_skips_processes_when_threads_wait_rather_than_compute():
    t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.1)
    asked, _ = feed(t, 200, 0.01, 0.001, cores=0.1)
    assert Config("process", 2) not in asked
    assert "2 processes, prefetch 2" in t.report()["skipped"]


def test_tuner_tunes_again_when_the_step_time_changes_2x():
    t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.1)
    _, now = feed(t, 200, 0.01, 0.001)
    assert t.chosen is not None
    asked, _ = feed(t, 80, 0.04, 0.035, start=now)   # the training step got 35x slower, above the interval
    assert asked and asked[0] == Config("thread", 16)
    assert t.report()["trials"] and t.report()["trials"][0]["config"] == "16 threads, prefetch 2"


def test_tuner_refuses_a_configuration_measured_over_the_budget():
    t = Tuner(max_workers=2, memory_budget=1000, worker_bytes=0, trial_s=0.05)
    asked = [t.observe(BatchTiming(0.01 * k, 0.009, 0.001, nbytes=1),
                       lambda: Usage(cpu_s=0.0, loader_bytes=5000)) for k in range(1, 100)]
    assert [c for c in asked if c is not None][-1] == Config("main")
    assert all(why.startswith("measured") or why.startswith("predicted") for why in t.refused.values())
    assert t.chosen == Config("main")


def test_a_columnar_source_s_cache_follows_the_configuration_in_force(tmp_path):
    """With the default ``cache_blocks``, each configuration autotune switches to opens the epoch's
    rest with the cache its executor needs (``loader/block_caches.py``): no block decoded again
    for want of room, and the batches of a fixed loader."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from torch.utils.data import default_convert

    from seqloader.loader.block_caches import blocks_in_use
    from seqloader.prefetcher.options import ThreadWorkers

    for f in range(3):
        n = 32
        pq.write_table(pa.table({"x": np.arange(f * n, (f + 1) * n)}), str(tmp_path / f"p{f}.parquet"), row_group_size=8)

    def make(autotune):
        src = seqloader.parquet(str(tmp_path), columnar=True)
        sampler = seqloader.BlockShuffleSampler(src, window=3, seed=3, lanes=2)
        return src, seqloader.DataLoader(src, batch_size=4, sampler=sampler, num_workers=2, seed=0,
                                         collate_fn=default_convert, autotune=autotune)

    _, fixed = make(False)
    src, tuned = make(Schedule([Config("main"), Config("thread", 2), Config("process", 2)], every=5))
    assert_batches_equal(list(tuned), list(fixed))
    assert src.cache_blocks >= blocks_in_use(3, 2, 12, 2, ThreadWorkers())   # thread workers' size was in force
    assert src.counters()["blocks_decoded_again"] == 0
