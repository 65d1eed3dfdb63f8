"""``loader.stats()`` (issue 13.2): counted on a fake clock, so nothing depends on machine load."""

from __future__ import annotations

import logging

import pytest

from seqloader import DataLoader
from seqloader.loader.tuning import stats as stats_mod
from seqloader.loader.tuning.stats import EpochStats


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(stats_mod.time, "perf_counter", c)
    return c


class Slow:
    """Each item advances the fake clock by ``cost`` seconds (the time the loop waits)."""

    def __init__(self, clock, cost, n=8):
        self.clock, self.cost, self.n = clock, cost, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.clock.t += self.cost
        if i == 5:
            raise KeyError(i)
        return i


def consume(loader, clock, work):
    it = iter(loader)
    while True:
        try:
            next(it)
        except StopIteration:
            return
        except KeyError:  # a failing batch is consumed and counted
            pass
        clock.t += work


def test_waiting_and_working_are_told_apart(clock):
    loader = DataLoader(Slow(clock, cost=0.03), batch_size=2, seed=0)   # 0.06 s per batch
    consume(loader, clock, work=0.02)
    s = loader.stats()["current"]
    assert s["batches"] == 4
    # 8 items of 0.03 s read (item 5 raises: its batch counts); 4 gaps of work, the last one
    # before the next() that raised StopIteration
    assert s["wait_s"] == pytest.approx(0.24) and s["work_s"] == pytest.approx(0.08)
    assert s["input_bound"] == pytest.approx(0.75) and s["batches_per_s"] == pytest.approx(4 / 0.32)


def test_current_and_last_epoch_and_resumes(clock):
    loader = DataLoader(list(range(8)), batch_size=4, seed=0)
    assert loader.stats() == {"current": None, "last": None, "resumes": 0, "hint": None}
    list(loader)
    sd = loader.state_dict()
    list(loader)
    s = loader.stats()
    assert (s["last"]["epoch"], s["current"]["epoch"], s["current"]["batches"]) == (0, 1, 2)
    loader.load_state_dict(sd)
    list(loader)
    assert loader.stats()["resumes"] == 1


def test_the_hint_speaks_only_when_the_numbers_support_it():
    busy = EpochStats(0, batches=100, wait_s=6.0, work_s=4.0, workers=[{"busy_s": 9.8, "items": 50}] * 2)
    assert busy.hint(2, cores=8) == ("input-bound: 60% of wall time waiting for data and all 2 "
                                     "workers busy; try num_workers=5")
    assert "no idle core left" in busy.hint(2, cores=2)
    idle_workers = EpochStats(0, batches=100, wait_s=6.0, work_s=4.0, workers=[{"busy_s": 3.0, "items": 50}] * 2)
    not_waiting = EpochStats(0, batches=100, wait_s=0.5, work_s=9.5, workers=[{"busy_s": 9.9, "items": 50}] * 2)
    assert idle_workers.hint(2, 8) is None and not_waiting.hint(2, 8) is None
    assert EpochStats(0, batches=100, wait_s=6.0, work_s=4.0).hint(0, 8) == (
        "input-bound: 60% of wall time waiting for data with num_workers=0; try num_workers=2")


def test_an_optional_periodic_log_line(clock, caplog):
    loader = DataLoader(Slow(clock, cost=1.0, n=4), batch_size=1, seed=0)
    loader.log_stats(2.5)
    with caplog.at_level(logging.INFO, logger="seqloader.stats"):
        for _ in loader:
            pass
        try:
            next(iter(loader))
        except KeyError:
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "seqloader.stats"]
    assert lines and lines[0].startswith("seqloader: epoch 0, 3 batches") and "input-bound 100%" in lines[0]
    with pytest.raises(ValueError, match="every_s must be > 0 or None"):
        loader.log_stats(0)


@pytest.mark.parametrize("iterable", [False, True])
def test_workers_report_items_busy_time_read_ahead_and_bytes(iterable):
    import torch

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return iter(range(info.id, 40, info.num_workers))

    ds = Stream() if iterable else list(range(40))
    loader = DataLoader(ds, batch_size=4, num_workers=2, seed=0)
    list(loader)
    s = loader.stats()["current"]
    assert len(s["workers"]) == 2 and sum(w["items"] for w in s["workers"]) >= 10
    assert all(w["busy_s"] >= 0 for w in s["workers"]) and s["shm_bytes"] > 0 and s["ready_mean"] >= 0
    list(loader)
    assert loader.stats()["last"]["workers"] and loader.stats()["current"]["epoch"] == 1


class Recording:
    """A policy that switches on a schedule and keeps every timing it is shown."""

    def __init__(self, configs, every):
        from seqloader.loader.tuning.policy import Schedule

        self.schedule, self.seen = Schedule(configs, every=every), []

    def first(self):
        return self.schedule.first()

    def observe(self, timing, usage):
        self.seen.append(timing)
        return self.schedule.observe(timing, usage)

    def report(self):
        return self.schedule.report()


def test_autotune_reads_the_one_clock_of_stats(clock):
    """Issue 42: the wait and work autotune is shown per batch are the ones ``stats()`` adds up
    (one clock), switches included in the wait."""
    from seqloader.loader.tuning.policy import Config

    policy = Recording([Config("main"), Config("thread", 2), Config("main")], every=3)
    loader = DataLoader(Slow(clock, cost=0.03, n=40), batch_size=2, seed=0, autotune=policy)
    consume(loader, clock, work=0.02)
    s = loader.stats()["current"]
    seen = policy.seen
    assert len(seen) == s["batches"] - 1 == 19 and policy.schedule.switches == 6   # (not the batch that raised)
    assert seen[0].work_s is None and all(t.work_s is not None for t in seen[1:])
    assert [t.now for t in seen] == sorted(t.now for t in seen)
    # the batch that raised (batch 2, item 5) is in the stats only; every gap of work is in both
    assert sum(t.wait_s for t in seen) == pytest.approx(s["wait_s"] - 0.06)
    assert sum(t.work_s for t in seen[1:]) + 0.02 * 2 == pytest.approx(s["work_s"])


def test_one_clock_read_twice_a_batch(monkeypatch):
    """Settled autotune reads the clock no more than a fixed loader does: twice per ``next()``."""
    from seqloader.loader.tuning.policy import Config

    calls = {"n": 0}
    real = stats_mod.time.perf_counter

    def counting():
        calls["n"] += 1
        return real()

    def reads(**kw):
        loader = DataLoader(list(range(40)), batch_size=2, seed=0, **kw)
        it = iter(loader)
        next(it)
        monkeypatch.setattr(stats_mod.time, "perf_counter", counting)
        calls["n"] = 0
        for _ in range(10):
            next(it)
        monkeypatch.setattr(stats_mod.time, "perf_counter", real)
        return calls["n"]

    never = Recording([Config("main")], every=10**9)
    assert reads(autotune=never) == reads() == 20
