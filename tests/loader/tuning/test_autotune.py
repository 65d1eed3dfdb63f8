"""``DataLoader(autotune=...)``: the batches, their order and the state of a fixed loader, whatever it switches to.

Switches are forced deterministically by a :class:`~seqloader.loader.tuning.policy.Schedule`
policy (a switch every few batches, across executors) or by the measuring
:class:`~seqloader.loader.tuning.policy.Tuner` with a tiny trial; every batch is compared with
``torch.equal`` to an ``autotune=False`` run, before and after a resume saved mid-tuning (loaded
into a fixed loader, and the other way round). The tuner's decisions are tested by feeding it
numbers (no process, no clock). Nothing here asserts timing; the leak check (``tests/conftest.py``)
runs on every test of this folder.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
import torch

import seqloader
from seqloader.loader.tuning.policy import BatchTiming, Config, Schedule, Tuner, Usage
from seqloader.loader.tuning.rules import pruned, smaller
from seqloader.loader.tuning.trials import Trial
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
    # (the first batch's CPU share decides which threads come first: timed, so either)
    assert report["log"][0]["from"] == "num_workers=0" and \
        report["log"][0]["to"] in ("16 threads, prefetch 2", "2 threads, prefetch 2")
    assert dl.stats()["hint"] == report["reason"]


def test_a_dataset_drawing_from_the_globals_is_never_given_threads():
    expected = epochs(loader(Drawing(120)))
    dl = loader(Drawing(120), autotune=Tuner(2, 2**40, 0, trial_s=0.005))
    assert_batches_equal(epochs(dl), expected)
    report = dl.stats()["autotune"]
    assert report["refused"] and all("global random" in why for why in report["refused"].values())
    assert all("threads" not in t["config"] for t in report["trials"])


def test_a_tiny_memory_budget_refuses_every_worker():
    expected = epochs(loader(noisy()))
    dl = loader(noisy(), autotune=True, memory_budget=1)
    assert_batches_equal(epochs(dl), expected)
    report = dl.stats()["autotune"]
    assert report["current"] == "num_workers=0" and report["chosen"] == "num_workers=0"
    assert report["refused"] and all(why.startswith("predicted") for why in report["refused"].values())
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
    with pytest.raises(TypeError, match=r"autotune must be a bool or a policy .*\(got str 'yes'\)"):
        loader(noisy(), autotune="yes")
    with pytest.raises(TypeError, match=r"\(got numpy\.int64 np\.int64\(1\)\)"):
        loader(noisy(), autotune=np.int64(1))


def test_a_numpy_bool_is_a_bool_and_a_negative_num_workers_gets_torchs_words():
    assert seqloader.DataLoader(range(4), batch_size=2, autotune=np.True_).autotune
    assert seqloader.DataLoader(range(4), batch_size=2, autotune=np.False_)._tuning is None
    with pytest.raises(ValueError, match=r"^num_workers option should be non-negative; use num_workers=0"):
        seqloader.DataLoader(range(4), batch_size=2, num_workers=-1, autotune=True)
    with pytest.raises(ValueError, match=r"^num_workers option should be non-negative; use num_workers=0"):
        torch.utils.data.DataLoader(range(4), batch_size=2, num_workers=-1)


# -- the policy, fed numbers ------------------------------------------------------------------


def feed(tuner, n, per_batch, work, start=0.0, cores=1.0):
    """``n`` batches ``per_batch`` seconds apart, the loop working ``work`` of them, ``cores`` busy;
    the configurations asked for."""
    asked, now = [], start
    for k in range(n):
        now += per_batch
        c = tuner.observe(BatchTiming(now, per_batch - work, work, nbytes=100),
                          lambda memory=True: Usage(cpu_s=cores * now, loader_bytes=0))
        if c is not None:
            asked.append(c)
    return asked, now


def test_tuner_tries_executors_then_settles_and_stays_put():
    t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.1)
    asked, now = feed(t, 200, 0.01, 0.001)
    # (no CPU share of the first batch: the most threads first; threads as fast as processes: none inside)
    assert asked[:3] == [Config("thread", 16), Config("thread", 2), Config("process", 2)]
    assert "as fast as processes" in t.report()["skipped"]["2 processes x 4 threads, prefetch 2"]
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
    _, now = feed(t, 300, 0.01, 0.001)
    chosen = t.chosen
    assert chosen is not None and t.report()["trying"] is None
    # the training step got 39x slower (the loop now waits 2.5% of its time): it is measured again
    # in place, then only cheaper configurations are tried while the loop keeps up
    asked, now = feed(t, 300, 0.04, 0.039, start=now)
    assert t.report()["trials"][0]["config"] == chosen.label   # no switch for the re-measure
    chain, c = [], chosen
    while (c := smaller(c)) is not None:
        chain.append(c)
    assert asked == chain and t.chosen == Config("main") and "consumer-bound" in t.reason
    # and 4x faster again: the executors are searched again, after the one in force is re-measured
    asked, _ = feed(t, 300, 0.01, 0.001, start=now)
    assert asked and asked[0].workers and t.report()["trials"][0]["config"] == "num_workers=0"


def test_tuner_refuses_a_configuration_measured_over_the_budget():
    t = Tuner(max_workers=2, memory_budget=1000, worker_bytes=0, trial_s=0.05)
    asked = [t.observe(BatchTiming(0.01 * k, 0.009, 0.001, nbytes=1),
                       lambda memory=True: Usage(cpu_s=0.0, loader_bytes=5000)) for k in range(1, 100)]
    assert [c for c in asked if c is not None][-1] == Config("main")
    assert all(why.startswith("measured") or why.startswith("predicted") for why in t.refused.values())
    assert t.chosen == Config("main")


def test_a_columnar_source_s_cache_follows_the_configuration_in_force(tmp_path):
    """With the default ``cache_blocks``, each configuration autotune switches to opens the epoch's
    rest with the cache its executor needs (``loader/epoch/block_caches.py``): no block decoded again
    for want of room, and the batches of a fixed loader."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from torch.utils.data import default_convert

    from seqloader.loader.epoch.block_caches import blocks_in_use
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

    class Cycles(Schedule):   # a policy that takes the loader's cycle
        periods: list = []

        def set_period(self, batches):
            self.periods.append(batches)

    policy = Cycles([Config("main"), Config("thread", 2)], every=5)
    _, cycled = make(policy)
    assert_batches_equal(list(cycled), list(make(False)[1]))
    assert policy.periods and set(policy.periods) == {2 * (3 * 8 // 4)}   # 2 lanes x a window of 3 x 8 rows / 4


class Machine:
    """A simulated machine for the tuner (no clock, no process): configuration ``c`` delivers a
    batch every ``interval(c)`` seconds with ``cores(c)`` cores busy, the loop works ``work`` of
    each; after a switch, the new workers' first round arrives in a burst (each worker computed a
    batch at once) after ``startup`` seconds. The first batch, computed here, kept ``probe_share``
    of a core busy."""

    def __init__(self, tuner, interval, cores=lambda c: 1.0, work=0.0005, probe_share=1.0, startup=0.05,
                 refill=(0, 1.0), stall=(0, 0.0)):
        self.tuner, self.interval, self.cores, self.work = tuner, interval, cores, work
        self.probe_share, self.startup = probe_share, startup
        #: a block shuffle: the first ``refill[0]`` batches after a switch take ``refill[1]`` times as
        #: long (no window decoded ahead yet), and every ``stall[0]``-th batch waits ``stall[1]`` more
        self.refill, self.stall = refill, stall
        self.now, self.cpu, self.config, self.since, self.delivered = 0.0, 0.0, tuner.first(), 0, 0
        self.asked, self.memory_measures = [], 0

    def usage(self, memory=True):
        self.memory_measures += bool(memory)
        return Usage(cpu_s=self.cpu, loader_bytes=0)

    def run(self, n):
        for _ in range(n):
            rounds = max(1, self.config.workers * self.config.threads)
            if self.since == 0:
                dt = self.startup + self.interval(self.config)
            elif self.since < rounds:
                dt = 1e-4   # the rest of the first round, computed together
            else:
                dt = max(self.interval(self.config), self.work)
            if self.since < self.refill[0]:
                dt *= self.refill[1]
            self.delivered += 1
            if self.stall[0] and self.delivered % self.stall[0] == 0:
                dt += self.stall[1]
            self.since += 1
            self.now += dt
            self.cpu += self.cores(self.config) * dt
            here = self.probe_share * dt if self.config.method == "main" else None
            c = self.tuner.observe(BatchTiming(self.now, dt - min(self.work, dt), self.work, 100, here), self.usage)
            if c is not None:
                self.asked.append(c)
                self.config, self.since = c, 0
        return self


def rates(**per_label):
    """``interval(config)`` from batches/s by label (others: 10/s)."""
    return lambda c: 1 / per_label.get(c.label.split(",")[0].replace(" ", "_").replace("=", "_"), 10.0)


def test_the_first_batch_s_cpu_share_decides_the_first_trial():
    waits = Machine(Tuner(2, 2**40, 0, trial_s=0.1), rates(), probe_share=0.02).run(2)
    computes = Machine(Tuner(2, 2**40, 0, trial_s=0.1), rates(), probe_share=0.9).run(2)
    assert waits.asked == [Config("thread", 16)]      # a remote read's latency: the most threads
    assert computes.asked == [Config("thread", 2)]    # they compute: as many threads as workers, no process yet


def test_threads_that_keep_the_cores_busy_rule_out_processes():
    m = Machine(Tuner(2, 2**40, 0, trial_s=0.1, cores=2), rates(), cores=lambda c: 1.9).run(300)
    assert all(c.method != "process" for c in m.asked)
    assert "cores busy: processes add no core" in m.tuner.report()["skipped"]["2 processes, prefetch 2"]


def test_threads_held_to_one_core_by_the_gil_try_processes_which_win():
    m = Machine(Tuner(2, 2**40, 0, trial_s=0.1, cores=2), rates(**{"2_processes": 18.0}),
                cores=lambda c: 2.0 if c.method == "process" else 1.0).run(400)
    assert Config("process", 2) in m.asked and m.tuner.chosen == Config("process", 2)
    assert m.tuner.report()["trying"] is None


def test_a_loop_that_keeps_up_with_threads_tries_no_process():
    # the loop works 0.2 s per batch and threads deliver faster: it never waits
    m = Machine(Tuner(2, 2**40, 0, trial_s=0.5), rates(), work=0.2).run(200)
    assert all(c.method != "process" for c in m.asked)
    assert "the loop kept up" in m.tuner.report()["skipped"]["2 processes, prefetch 2"]
    assert m.tuner.chosen is not None and "consumer-bound" in m.tuner.reason


def test_a_trial_does_not_count_the_first_round_s_burst():
    t = Tuner(2, 2**40, 0, trial_s=0.5)
    m = Machine(t, rates(**{"16_threads": 20.0}), probe_share=0.0, cores=lambda c: 0.1, startup=0.5).run(60)
    first = next(tr for tr in t.report()["trials"] if tr["config"] == "16 threads, prefetch 2")
    assert first["batches_per_s"] == pytest.approx(20.0, rel=0.01)   # not the burst's 16 batches at once
    assert m.asked[0] == Config("thread", 16)


def test_a_lucky_trial_is_measured_again_and_the_runner_up_chosen():
    lucky = {"n": 0}

    def interval(c):   # 2 processes: a fast trial (30/s), then 12/s for good; 2 threads: 20/s
        if c == Config("process", 2):
            lucky["n"] += 1
            return 1 / 30 if lucky["n"] < 20 else 1 / 12
        return 1 / 20 if c == Config("thread", 2) else 1 / 5

    t = Tuner(2, 2**40, 0, trial_s=0.3, cores=2)
    m = Machine(t, interval, cores=lambda c: 1.0).run(600)
    assert t.chosen == Config("thread", 2) and t.report()["trying"] is None
    assert m.asked.count(Config("process", 2)) == 1   # no switching back and forth
    measured = {tr["config"]: tr["batches_per_s"] for tr in t.report()["trials"]}
    assert measured["2 processes, prefetch 2"] < 20


def test_over_a_block_shuffle_a_trial_skips_the_refill_and_counts_whole_cycles():
    # a window cycle of 40 batches: each cycle's first batch waits 0.1 s; after a switch the first
    # cycle is 1.5x slower (nothing decoded ahead). Steady: 2 threads 100/s, 2 processes 70/s.
    def machine(period):
        t = Tuner(2, 2**40, 0, trial_s=0.3, cores=2)
        if period:
            t.set_period(period)
        return Machine(t, rates(**{"2_threads": 100.0, "2_processes": 70.0}), cores=lambda c: 1.0,
                       refill=(40, 1.5), stall=(40, 0.1)).run(1500)

    m = machine(40)
    trials = {tr["config"]: tr for tr in m.tuner.report()["trials"]}
    assert m.tuner.chosen == Config("thread", 2) and m.tuner.report()["trying"] is None
    steady = 40 / (40 / 100.0 + 0.1)   # batches per second over whole cycles, a stall in each
    assert trials["2 threads, prefetch 2"]["batches_per_s"] == pytest.approx(steady, rel=0.05)
    assert all(tr["batches"] % 40 == 0 for tr in trials.values() if tr["config"] != "num_workers=0"
               and not tr["cut_short"])
    # without the cycle, the trial counted the refill and a part of a cycle
    before = {tr["config"]: tr for tr in machine(0).tuner.report()["trials"]}
    assert before["2 threads, prefetch 2"]["batches_per_s"] < 0.9 * steady


def test_a_winner_slower_at_its_confirmation_than_at_its_own_trial_measures_the_runner_up_again():
    # threads' trial came while the machine was slow (40/s; 100/s after); processes' trial was
    # lucky (90/s; 60/s after): the confirmation (60/s) is over 0.85 of threads' old 40/s, but
    # under 0.85 of its own 90/s, so threads are measured again, and chosen
    seen = {"process": 0}

    def interval(c):
        if c == Config("process", 2):
            seen["process"] += 1
            return 1 / 90 if seen["process"] < 40 else 1 / 60
        if c == Config("thread", 2):
            return 1 / 40 if m.now < 1.0 else 1 / 100
        return 1 / 5

    t = Tuner(2, 2**40, 0, trial_s=0.3, cores=2)
    m = Machine(t, interval, cores=lambda c: 1.0)
    m.run(800)
    assert t.chosen == Config("thread", 2) and t.report()["trying"] is None
    assert m.asked.count(Config("process", 2)) == 1   # no switching back and forth


def test_a_runner_up_clearly_losing_is_not_measured_again_when_the_winner_slows():
    seen = {"process": 0}

    def interval(c):   # processes: 90/s, then 60/s; threads: 20/s, clearly losing (under 0.6 of 60/s)
        if c == Config("process", 2):
            seen["process"] += 1
            return 1 / 90 if seen["process"] < 40 else 1 / 60
        return 1 / 20 if c == Config("thread", 2) else 1 / 5

    t = Tuner(2, 2**40, 0, trial_s=0.3, cores=2)
    m = Machine(t, interval, cores=lambda c: 1.0).run(800)
    assert t.chosen == Config("process", 2) and t.report()["trying"] is None
    assert m.asked.count(Config("thread", 2)) == 1


def test_a_confirmed_winner_stays_put_without_another_switch():
    t = Tuner(2, 2**40, 0, trial_s=0.1, cores=2)
    m = Machine(t, rates(**{"2_processes": 30.0}), cores=lambda c: 1.0).run(300)
    assert t.chosen == Config("process", 2) and t.report()["trying"] is None
    n = len(m.asked)
    m.run(500)
    assert len(m.asked) == n


def test_settled_memory_is_measured_every_few_seconds_and_trial_starts_measure_cpu_only():
    t = Tuner(2, 2**40, 0, trial_s=0.1, cores=2)
    m = Machine(t, rates(**{"2_processes": 100.0}), cores=lambda c: 1.0).run(400)
    assert t.report()["trying"] is None
    before, start = m.memory_measures, m.now
    m.run(2000)   # 20 s at 100 batches/s
    assert m.memory_measures - before <= (m.now - start) / 5 + 1


def test_a_clearly_losing_trial_ends_early():
    t = Tuner(2, 2**40, 0, trial_s=1.0, cores=2)
    Machine(t, rates(**{"2_threads": 50.0, "2_processes": 5.0}), cores=lambda c: 1.0).run(300)
    procs = next(tr for tr in t.report()["trials"] if tr["config"] == "2 processes, prefetch 2")
    assert procs["cut_short"]


def test_threads_inside_processes_are_tried_only_where_the_gil_holds_threads_back():
    procs = Trial(Config("process", 2), batches=40, wall_s=1.0, wait_s=0.9, work_s=0.1, cpu_s=1.0)
    inside = [Config("process", 2, 4)]

    def dropped(thread_rate):
        threads = Trial(Config("thread", 2), batches=int(thread_rate), wall_s=1.0, wait_s=0.9, work_s=0.1)
        return pruned(procs, inside, [threads, procs], max_workers=2, cores=2)[1]

    assert dropped(20) == inside    # far behind: the items compute
    assert dropped(32) == []        # close behind: they wait as well, the GIL holds threads back
    assert dropped(44) == inside    # as fast: the GIL is not the limit


def test_num_workers_0_gets_a_full_trial_only_if_its_first_batch_came_near_the_best_rate():
    def main_tried(probe_rate):
        t = Tuner(2, 2**40, 0, trial_s=0.1, cores=2)
        m = Machine(t, lambda c: 1 / probe_rate if c.method == "main" else 1 / 10, cores=lambda c: 1.9, startup=0.0)
        m.run(300)
        return Config("main") in m.asked

    assert main_tried(8.0) and not main_tried(5.0)


def test_a_batch_of_seqloader_s_own_code_is_not_taken_for_drawing(tmp_path):
    """A columnar Parquet batch with torch's collate is not seeded (``loader/rngs/draws.py``):
    autotune's check sees that it draws nothing, so threads stay among the candidates."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from torch.utils.data import default_convert

    from seqloader.loader.epoch.tuned import computed_watching
    from seqloader.loader.epoch.batches import EpochBatches
    from seqloader.loader.rngs.seeding import DERIVATION
    from seqloader.orders.orders import RangeOrder
    from seqloader.orders.plans import OrderPlan

    pq.write_table(pa.table({"x": np.arange(16)}), str(tmp_path / "p.parquet"), row_group_size=8)
    src = seqloader.parquet(str(tmp_path), columnar=True)
    own = EpochBatches(src, OrderPlan(RangeOrder(16), 0, 4, False), default_convert, seed=0, epoch=0)
    assert own.draws_globals is False
    out, drew = computed_watching(own, 1, 0, 0, DERIVATION)
    assert drew is False and torch.equal(out["x"], torch.arange(4, 8))
    tuned = seqloader.DataLoader(src, batch_size=4, num_workers=2, seed=0, collate_fn=default_convert, autotune=True)
    assert_batches_equal(list(tuned), list(seqloader.DataLoader(src, batch_size=4, seed=0, collate_fn=default_convert)))
    assert not any("global" in why for why in tuned.stats()["autotune"]["refused"].values())
