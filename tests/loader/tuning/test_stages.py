"""The per-stage account (``DataLoader(profile_stages=True)``, issue 20.3) and ``stats()``'s start-up line.

A stage is made slow on purpose (an ``smap`` function that sleeps) and must be named first; the
tests assert rankings and keys, never timings.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

import seqloader.loader.epoch.iterator as iterator_mod
import seqloader.loader.epoch.opening as opening_mod
from seqloader import DataLoader, rng_map, smap
from seqloader.loader.tuning.stats import StageAccount
from seqloader.loader.tuning.stats import EpochStats
from seqloader.sequences import stage_times

KEYS = {"where", "seconds", "per_batch_s", "share"}


def slow(x):
    time.sleep(0.004)
    return x


def cheap(x):
    return x + 1


def noisy(x, rng):
    return x + int(rng.integers(2))


def pipeline(n=48):
    return rng_map(noisy, smap(cheap, smap(slow, list(range(n)))), seed=0)


class SlowStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (slow(i) for i in range(first, 48, step))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_slow_stage_is_named_first(num_workers):
    loader = DataLoader(pipeline(), batch_size=4, num_workers=num_workers, seed=0, profile_stages=True)
    assert loader.profile_stages is True
    for _ in loader:
        pass
    s = loader.stats()
    stages = s["current"]["stages"]
    assert list(stages)[0] == "smap(slow)"
    expected = {"smap(slow)", "smap(cheap)", "rng_map(noisy)", "fetch", "collate"}
    assert expected <= set(stages) and ("transfer" in stages) == (num_workers > 0)
    assert all(set(row) == KEYS for row in stages.values())
    assert {row["where"] for row in stages.values()} == {"workers" if num_workers else "main"}
    assert 0 < sum(row["share"] for row in stages.values()) <= 1.0 + 1e-9
    assert "slowest stage: smap(slow) takes" in s["hint"]
    assert stage_times.ACTIVE is None  # nothing left collecting in this process


def test_an_iterable_dataset_reports_its_stages_and_persistent_workers_keep_timing():
    loader = DataLoader(SlowStream(), batch_size=4, num_workers=2, persistent_workers=True, seed=0,
                        profile_stages=True)
    for _ in range(2):
        for _ in loader:
            pass
        stages = loader.stats()["current"]["stages"]
        assert list(stages)[0] == "fetch" and {"collate", "transfer"} <= set(stages)
    assert loader.stats()["last"]["stages"]  # the first epoch's account is kept


@pytest.mark.parametrize("num_workers", [0, 2])
def test_off_by_default(num_workers):
    loader = DataLoader(pipeline(8), batch_size=4, num_workers=num_workers, seed=0)
    assert loader.profile_stages is False
    list(loader)
    s = loader.stats()
    assert s["current"]["stages"] == {} and (s["hint"] is None or "stage" not in s["hint"])
    with pytest.raises(TypeError, match="profile_stages must be a bool"):
        DataLoader(list(range(4)), profile_stages="yes")


def test_pinning_is_a_stage_of_this_process(monkeypatch):
    def slow_pin(batch, device):
        time.sleep(0.004)
        return batch

    monkeypatch.setattr(opening_mod, "pin_device", lambda *args: "fake")
    monkeypatch.setattr(iterator_mod, "pin", slow_pin)
    loader = DataLoader(list(range(40)), batch_size=4, pin_memory=True, seed=0, profile_stages=True)
    list(loader)
    stages = loader.stats()["current"]["stages"]
    assert stages["pin"]["where"] == "main" and set(stages["pin"]) == KEYS
    assert stages["pin"]["seconds"] >= 10 * 0.004  # 10 batches, each pinned for at least 4 ms (a bound, not a race)


def test_startup_is_its_own_line():
    loader = DataLoader(list(range(8)), batch_size=4, num_workers=2, seed=0)
    list(loader)
    cur = loader.stats()["current"]
    assert cur["startup_s"] > 0  # starting 2 workers, inside iter(): not in wait_s


def test_the_hints_for_one_process_start_up_and_stages():
    waits = EpochStats(0, batches=100, wait_s=9.3, work_s=0.7)
    assert waits.hint(0, cores=8) == ("input-bound: 93% of wall time waiting for data with num_workers=0; "
                                      "try num_workers=8")
    assert "num_workers=2" in waits.hint(0, cores=2) and "one core" in waits.hint(0, cores=1)
    assert EpochStats(0, batches=100, wait_s=1.0, work_s=9.0).hint(0, cores=8) is None
    starting = EpochStats(0, batches=20, wait_s=0.7, work_s=0.1, startup_s=1.8,
                          workers=[{"busy_s": 0.3, "items": 20}] * 2)
    assert "start-up: iter() took 1.80 s of the epoch's 2.60 s" in starting.hint(2, cores=8)
    assert "start-up" not in (starting.hint(2, cores=8, persistent=True) or "")
    account = StageAccount({"collate": 6.1, "fetch": 2.0}, pin_s=0.1)
    staged = EpochStats(0, batches=50, wait_s=1.0, work_s=9.0, workers=[{"busy_s": 5.0, "items": 25}] * 2,
                        account=account)
    assert staged.hint(2, cores=8) == "slowest stage: collate takes 61% of worker time (122.0 ms per batch)"
    table = staged.as_dict()["stages"]
    assert list(table) == ["collate", "fetch", "other", "pin"] and table["pin"]["share"] == pytest.approx(0.01)


def test_stage_times_are_exclusive_and_stay_in_their_process_and_thread():
    times = stage_times.StageTimes()
    with stage_times.collecting(times):
        outer = times.begin()
        times.call("inner", time.sleep, 0.002)
        times.end("outer", outer)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            assert pool.apply(_active_in_child) is None  # a forked child does not collect
    assert set(times.take()) == {"inner", "outer"} and stage_times.ACTIVE is None


def _active_in_child():
    return stage_times.ACTIVE
