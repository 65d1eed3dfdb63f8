"""``DataLoader(autotune=True)`` keeps what the user asked for, and counts only its own workers.

* ``max_worker_restarts``: only worker processes compute the batches, so a worker that crashes is
  replaced and the epoch finishes (a segfault in a thread worker or in the training process would
  kill the run: that is tried in a subprocess, whose exit code is the verdict);
* ``spawn``/``forkserver``: processes are tried only if what they would be sent pickles;
* the CPU seconds of a trial are this process's and its loader's workers', never another child's,
  and never decrease when a worker exits.

Each reason reaches ``stats()["autotune"]`` and the ``seqloader.autotune`` log in words. Nothing
here asserts timing.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import seqloader
from seqloader.loader.tuning.policy import BatchTiming, Config, Schedule, Tuner, Usage
from seqloader.loader.tuning.usage import ProcessTree
from seqloader.testing import assert_batches_equal

NEEDS = "max_worker_restarts=3 needs worker processes"


def noisy(n: int = 120):
    """A seeded pipeline with a lambda in it: it does not pickle."""
    return seqloader.rng_map(lambda x, rng: torch.tensor([x, int(rng.integers(1 << 30))]), range(n), seed=5)


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int = 120, burn: float = 0.0):
        self.n, self.burn = n, burn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.process_time() + self.burn   # CPU seconds of the process computing it
        while time.process_time() < end:
            pass
        return torch.tensor([i, i * i])


def loader(data, **kw):
    kw.setdefault("num_workers", 2)
    return seqloader.DataLoader(data, batch_size=3, shuffle=True, seed=11, **kw)


# -- max_worker_restarts ----------------------------------------------------------------------

CRASH = textwrap.dedent('''
    import json, os, signal, sys
    import torch, seqloader
    from seqloader.loader.tuning.policy import Tuner

    class Crashing(torch.utils.data.Dataset):
        """Item 7 segfaults the process computing it, the first time only (a marker file)."""
        def __init__(self, marker, n):
            self.marker, self.n = marker, n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if self.marker and i == 7:
                try:
                    os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    os.kill(os.getpid(), signal.SIGSEGV)
            return torch.tensor([i, i * i])

    def run(marker, n, autotune):
        kw = dict(batch_size=3, shuffle=True, seed=11, num_workers=2)
        want = list(seqloader.DataLoader(Crashing(None, n), **kw))
        tuned = seqloader.DataLoader(Crashing(marker, n), max_worker_restarts=3, autotune=autotune, **kw)
        got = list(tuned)
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
        return tuned.stats()["autotune"]

    out = sys.argv[1]
    reports = [run(os.path.join(out, "crashed-default"), 48, True),
               run(os.path.join(out, "crashed-short"), 240,
                   Tuner(2, 2**40, 0, trial_s=0.002, needs_processes="max_worker_restarts=3 needs worker processes"))]
    print(json.dumps(reports))
''')


def test_a_crashing_worker_is_healed_under_autotune_with_max_worker_restarts(tmp_path):
    run = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    assert sorted(os.listdir(tmp_path)) == ["crashed-default", "crashed-short"]   # each crashed a worker once
    import json

    for report in json.loads(run.stdout.splitlines()[-1]):
        assert all("processes" in t["config"] and "threads" not in t["config"] for t in report["trials"]), report
        assert "processes" in report["current"]
        assert report["not_tried"]["num_workers=0"].startswith(NEEDS)
        assert report["not_tried"]["thread workers"].startswith(NEEDS)


def test_the_tuner_under_max_worker_restarts_asks_for_worker_processes_only():
    t = Tuner(max_workers=4, memory_budget=2**40, worker_bytes=0, trial_s=0.05, cores=4, needs_processes=NEEDS)
    assert t.first() == Config("process", 4)
    asked, now = [], 0.0
    for k in range(600):   # a loop that never waits: it tries smaller configurations, down to 1 process
        now += 0.01
        c = t.observe(BatchTiming(now, 0.0001, 0.0099, nbytes=100),
                      lambda memory=True: Usage(cpu_s=now, loader_bytes=0))
        asked += [c] if c is not None else []
    assert asked and all(c.method == "process" and c.threads == 1 for c in asked), asked
    assert Config("process", 1) in asked and t.chosen.method == "process"
    assert t.refused[Config("main")].startswith(f"num_workers=0 not tried: {NEEDS}")
    assert f"num_workers=0 and thread workers not tried: {NEEDS}" in t.reason


def test_over_the_budget_under_max_worker_restarts_keeps_one_worker_process():
    t = Tuner(max_workers=2, memory_budget=1, worker_bytes=100, needs_processes=NEEDS)
    assert t.first() == Config("process", 1) and t.chosen == Config("process", 1)
    assert t.reason.startswith("1 processes, prefetch 2: every other configuration exceeds memory_budget")


def test_max_worker_restarts_needs_workers_with_autotune_as_without():
    for autotune in (False, True):
        with pytest.raises(ValueError, match="max_worker_restarts=1 needs num_workers > 0"):
            loader(Items(), num_workers=0, max_worker_restarts=1, autotune=autotune)


def test_a_policy_that_asks_for_no_worker_process_under_max_worker_restarts_is_refused():
    with pytest.raises(ValueError, match="the autotune policy asked for num_workers=0, but max_worker_restarts=1 "
                                         "needs worker processes"):
        loader(Items(), max_worker_restarts=1, autotune=Schedule([Config("main"), Config("process", 2)]))


def test_the_restarts_promise_is_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="seqloader.autotune"):
        dl = loader(Items(), max_worker_restarts=3, autotune=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "seqloader.autotune"]
    assert lines[0].startswith(f"seqloader autotune: num_workers=0 and thread workers not tried: {NEEDS}")
    assert dl.stats()["autotune"]["current"] == "2 processes, prefetch 2"


# -- spawn and forkserver ---------------------------------------------------------------------


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_pipeline_that_does_not_pickle_is_never_given_processes_under(context, caplog):
    expected = list(loader(noisy(), num_workers=0))
    tuner = Tuner(2, 2**40, 0, trial_s=0.005)
    dl = loader(noisy(), multiprocessing_context=context, autotune=tuner)
    with caplog.at_level(logging.INFO, logger="seqloader.autotune"):
        assert_batches_equal(list(dl), expected)
    report = dl.stats()["autotune"]
    why = report["not_tried"]["processes"]
    assert why.startswith(f"the pipeline does not pickle under {context!r} (PicklingError") or \
        why.startswith(f"the pipeline does not pickle under {context!r} (AttributeError"), why
    assert all("processes" not in t["config"] for t in report["trials"])
    assert all(why.startswith("processes not tried") for c, why in report["refused"].items() if "processes" in c)
    assert any(r.getMessage() == f"seqloader autotune: processes not tried: {why}" for r in caplog.records)


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_a_pipeline_that_pickles_or_fork_keeps_processes_among_the_candidates(context):
    data = noisy() if context == "fork" else Items()   # (fork pickles nothing: a lambda is fine)
    dl = loader(data, multiprocessing_context=context, autotune=Tuner(2, 2**40, 0))
    it = iter(dl)   # the check is made before the first batch
    assert "processes" not in dl.stats()["autotune"]["not_tried"]
    del it


def test_the_tuner_told_no_processes_never_asks_for_them():
    t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=0.05)
    t.no_processes("the pipeline does not pickle")
    asked, now = [], 0.0
    for k in range(400):
        now += 0.01
        c = t.observe(BatchTiming(now, 0.009, 0.001, nbytes=100, cpu_s=0.009 if k == 0 else None),
                      lambda memory=True: Usage(cpu_s=now, loader_bytes=0))
        asked += [c] if c is not None else []
    assert asked and all(c.method != "process" for c in asked)
    assert t.report()["refused"]["2 processes, prefetch 2"] == "processes not tried: the pipeline does not pickle"
    assert t.reason.endswith("; processes not tried: the pipeline does not pickle")


# -- CPU accounting ---------------------------------------------------------------------------

BURN = "import sys, time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\nsys.stdin.read()\n"


def _burned(child):
    """Wait until ``child`` (running :data:`BURN`) has burned its CPU seconds."""
    for _ in range(6000):
        with open(f"/proc/{child.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if int(fields[11]) + int(fields[12]) >= 0.45 * os.sysconf("SC_CLK_TCK"):
            return
        time.sleep(0.01)
    raise AssertionError("the child did not burn its CPU in 60 s")


def test_a_worker_that_exits_keeps_its_cpu_and_another_child_is_not_counted():
    tree = ProcessTree()
    worker = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE)
    _burned(worker)
    _burned(other)
    own, with_worker = time.process_time(), tree.usage(pids=[worker.pid]).cpu_s
    assert with_worker - own >= 0.45   # the worker's CPU counts; the other child's does not ...
    assert with_worker - own < 0.9
    for p in (worker, other):
        p.communicate(b"")   # both exit (and are reaped)
    after = tree.usage(pids=[])
    assert after.cpu_s >= with_worker   # ... and an exited worker keeps its last read: never subtracted


class Recorder:
    """A policy that stays on ``config`` and records the CPU seconds measured at each batch."""

    def __init__(self, config):
        self.config, self.reads = config, []

    def first(self):
        return self.config

    def observe(self, timing, usage):
        self.reads.append(usage(False).cpu_s)

    def report(self):
        return {"policy": "recorder", "reason": ""}


def test_another_loader_s_workers_exiting_mid_trial_subtract_nothing():
    other = loader(Items(burn=0.02))
    it_other = iter(other)
    for _ in range(6):
        next(it_other)   # its two workers burned CPU seconds
    recorder = Recorder(Config("main"))
    it = iter(loader(Items(), autotune=recorder))
    next(it)
    del it_other   # the other loader's workers exit between two measures
    next(it)
    assert recorder.reads[1] >= recorder.reads[0]
    del it


def test_the_loader_s_own_worker_processes_are_counted():
    recorder = Recorder(Config("process", 2))
    dl = loader(Items(60, burn=0.02), autotune=recorder)
    batches = list(dl)
    assert len(batches) == 20 and all(b >= a for a, b in zip(recorder.reads, recorder.reads[1:]))
    # the batches after the first 5 (at most 4 read ahead) were computed between the reads: 3 x 0.02 s each
    assert recorder.reads[-1] - recorder.reads[0] >= 14 * 3 * 0.02 * 0.9
