"""The one rule set (issue 42): ``stats()["hint"]`` and autotune's search answer "which
configuration fits" through the same predicates of ``loader/tuning/rules.py``, so each notion has
one number. Each test moves a number across its threshold and checks that both sides turn together.
"""

from __future__ import annotations

import pytest

from seqloader.loader.tuning import rules
from seqloader.loader.tuning.hint import executor_hint, machine_busy
from seqloader.loader.tuning.policy import Config
from seqloader.loader.tuning.rules import executors, pruned
from seqloader.loader.tuning.stats import EpochStats, StageAccount
from seqloader.loader.tuning.trials import Trial


def hint_advises_threads(share: float) -> bool:
    workers = [{"busy_s": 10.0, "cpu_s": 10.0 * share}] * 2
    return "worker_method='thread'" in (executor_hint("process", 2, workers, 12.0, busy_machine=None) or "")


def tuner_takes_the_items_for_waits(share: float) -> bool:
    return executors(2, share)[0] == Config("thread", rules.THREADS_PER_WORKER * 2)


@pytest.mark.parametrize("share", [0.05, 0.29, 0.3, 0.31, 0.49, 0.5, 0.9])
def test_the_items_wait_rather_than_compute_is_one_number(share):
    assert hint_advises_threads(share) == tuner_takes_the_items_for_waits(share) == (share < rules.CPU_BOUND)


@pytest.mark.parametrize("used", [1.5, 1.79, 1.8, 1.9])
def test_saturated_is_one_number_for_cores_the_machine_and_the_workers(used):
    cores = 2
    threads = Trial(Config("thread", 2), batches=20, wall_s=1.0, wait_s=0.9, work_s=0.1, cpu_s=used)
    _, dropped, _ = pruned(threads, [Config("process", 2)], [threads], max_workers=2, cores=cores)
    busy = EpochStats(0, batches=100, wait_s=6.0, work_s=4.0, workers=[{"busy_s": 5.0 * used, "items": 50}] * 2)
    workers_busy = "workers busy" in (busy.hint(2, cores=8) or "")
    assert bool(dropped) == (machine_busy(load=used, cores=cores) is not None) == workers_busy \
        == (used >= rules.SATURATED * cores)


@pytest.mark.parametrize("waiting", [0.1, 0.19, 0.2, 0.3])
def test_worth_acting_on_is_one_number_for_waiting_start_up_and_pinning(waiting):
    waits = EpochStats(0, batches=100, wait_s=10.0 * waiting, work_s=10.0 * (1 - waiting)).hint(0, 8)
    startup = EpochStats(0, batches=100, wait_s=0.0, work_s=10.0 * (1 - waiting), startup_s=10.0 * waiting)
    pin = StageAccount(pin_s=10.0 * waiting).hint([], wall_s=10.0, returned=100)
    expected = waiting >= rules.WAITS
    assert ("input-bound" in (waits or "")) == ("start-up" in (startup.hint(2, 8) or "")) \
        == ("pinning" in (pin or "")) == expected


def test_threads_taking_turns_on_the_gil_is_one_number_read_where_it_is_used(monkeypatch):
    workers = [{"busy_s": 4.75, "cpu_s": 2.375}] * 4    # 4 threads busy 1.9 at a time, 0.95 of a core between them
    assert "'multiprocessing'" in executor_hint("thread", 4, workers, 10.0)
    monkeypatch.setattr(rules, "GIL_THREADS", 2.0)
    assert executor_hint("thread", 4, workers, 10.0) is None
    advised = executor_hint("process", 2, [{"busy_s": 10.0, "cpu_s": 1.0}] * 2, 12.0)
    assert f"threads_per_worker={rules.PROCESS_THREADS}," in advised
