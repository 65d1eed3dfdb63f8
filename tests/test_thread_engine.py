"""The one thread engine (``seqloader/threads/engine.py``) driven through each of its adapters —
:class:`~seqloader.threads.ThreadPool`, :class:`~seqloader.prefetcher.threads.ThreadExecutor`
and :class:`~seqloader.prefetcher.processes.runner.Runner` — under a tiny switch interval, so the
lock, not the GIL, must keep the bookkeeping right.

Nothing asserts timing: every wait has a generous bound, and results are compared bit for bit.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import threading

import pytest

from forking import BOUND, wait_until
from seqloader.prefetcher.executor import Done, Started
from seqloader.prefetcher.processes.messages import Job
from seqloader.prefetcher.processes.runner import Runner
from seqloader.prefetcher.threads import ThreadExecutor
from seqloader.threads import ThreadPool

_names = itertools.count()


def unique_name() -> str:
    return f"test-engine-{os.getpid()}-{next(_names)}"


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name + "-")]


class Stop(BaseException):
    """Not an ``Exception``: what a job raising ``SystemExit`` or ``KeyboardInterrupt`` looks like."""


def digest(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


class Items:
    """``items[i]`` is ``digest(i)``, after some bytecodes to switch in; ``raises`` raise :class:`Stop`."""

    def __init__(self, n: int, raises=()):
        self.n, self.raises = n, set(raises)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        for _ in range(50):
            pass
        if i in self.raises:
            raise Stop(i)
        return digest(i)


def drive_pool(name: str) -> None:
    pool = ThreadPool(4, name=name)
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            for r in range(5):
                items = range(k * 100 + r * 10, k * 100 + r * 10 + 37)
                assert pool.map(digest, items) == [digest(i) for i in items]
            with pytest.raises(Stop) as info:
                pool.map(Items(40, raises={17, 30}).__getitem__, range(40))
            assert info.value.args == (17,) and "at item 17" in info.value.__notes__[0]
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    callers = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(BOUND)
    assert not errors, errors
    # close while a map runs: it returns in full or raises the documented ValueError
    outcome: list = []
    running = threading.Event()

    def item(i: int) -> bytes:
        running.set()
        return digest(i)

    def long_map() -> None:
        try:
            outcome.append(pool.map(item, range(5000)))
        except ValueError as exc:
            outcome.append(exc)

    t = threading.Thread(target=long_map)
    t.start()
    assert running.wait(BOUND)
    pool.close()
    t.join(BOUND)
    assert len(outcome) == 1
    got = outcome[0]
    assert got == [digest(i) for i in range(5000)] or "closed while map was waiting" in str(got), got


def read_until(ex: ThreadExecutor, want: set, events: list) -> None:
    """Poll until a ``Done`` came for every ``(gen, index)`` of ``want``."""
    seen: set = set()
    assert wait_until(lambda: (events.extend(got := ex.poll(0.05)),
                               seen.update((e.gen, e.index) for e in got if isinstance(e, Done)),
                               want <= seen)[-1])


def drive_executor(name: str) -> None:
    ex = ThreadExecutor(4, name=name)
    seq = Items(400, raises={77, 310})
    ex.launch(seq, gen=0)
    events: list = []
    gen0 = [(0, i) for i in range(200)]
    for _, i in gen0:
        ex.submit(i % 4, 0, i)
    ex.new_generation(1)  # a seek: queued jobs of generation 0 are skipped, each answered
    ex.reset(seq, 1)
    gen1 = [(1, i) for i in range(200, 400)]
    for _, i in gen1:
        ex.submit(i % 4, 1, i)
    read_until(ex, set(gen0) | set(gen1), events)
    assert sorted(e.worker for e in events if isinstance(e, Started)) == [0, 1, 2, 3]
    done = [e for e in events if isinstance(e, Done)]
    assert len(done) == 400 and len({(e.gen, e.index) for e in done}) == 400  # exactly one answer each
    for e in done:
        if e.reply is None:
            assert e.gen == 0  # skipped
        elif e.index in seq.raises:
            assert e.reply[0] is False and isinstance(e.reply[1], Stop) and e.reply[1].args == (e.index,)
        else:
            assert e.reply == (True, digest(e.index))
    assert all(e.reply is not None for e in done if e.gen == 1)
    for i in range(1000):  # close while jobs run: queued ones are dropped unread
        ex.submit(i % 4, 1, i % 400)
    ex.close()
    assert ex.closed and not threads_named(name)


def drive_runner(name_of: str) -> None:
    log, lock = [], threading.Lock()
    results: dict = {}

    def work(job, seq):
        with lock:
            log.append(("start", job.index))
        value = seq[job.index]
        with lock:
            results[job.index] = value
            log.append(("end", job.index))

    failures: list = []
    runner = Runner(3, work, 97, lambda w, t: None, lambda stage, exc: failures.append((stage, exc)))
    runner.wait_ready(lambda: True)
    seq = Items(300, raises={250})
    alone = {40, 41, 120, 199}
    for i in range(200):
        runner.put(Job(0, i, i, "", alone=i in alone), seq)
    assert wait_until(lambda: len(results) == 200)
    assert results == {i: digest(i) for i in range(200)}
    for a in alone:
        start, end = log.index(("start", a)), log.index(("end", a))
        assert end == start + 1  # nothing started or ended while it ran
        assert all(("end", j) in log[:start] for j in range(a))  # every earlier job had ended
        assert all(("start", j) in log[end:] for j in range(a + 1, 200))  # no later job had begun
    for i in range(240, 300):  # job 250 raises Stop: reported once, and the threads stop
        runner.put(Job(0, i, i, "", alone=False), seq)
    assert wait_until(lambda: failures and not threads_named(name_of))
    assert len(failures) == 1 and failures[0][0] == "computing a job" and isinstance(failures[0][1], Stop)
    runner.stop()


def test_every_adapter_of_the_engine_under_a_tiny_switch_interval():
    """Many short jobs, seeks, a job raising a ``BaseException`` and a close while jobs run, through
    the pool, the thread executor and the runner: results bit for bit, and no thread left."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(2):
            pool_name, ex_name = unique_name(), unique_name()
            drive_pool(pool_name)
            drive_executor(ex_name)
            drive_runner("seqloader-worker-97")
            assert wait_until(lambda: not threads_named(pool_name) and not threads_named(ex_name)
                              and not threads_named("seqloader-worker-97"))
    finally:
        sys.setswitchinterval(old)


_EXIT_SCRIPT = """
import os, sys, time
from seqloader.prefetcher.threads import ThreadExecutor

root = sys.argv[1]

class Slow:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        open(os.path.join(root, "started"), "w").close()
        time.sleep(0.5)  # still inside the item when the script ends
        open(os.path.join(root, "finished"), "w").close()
        return i

ex = ThreadExecutor(1, None)
ex.launch(Slow(), gen=0)
ex.submit(0, 0, 0)
while not os.path.exists(os.path.join(root, "started")):
    time.sleep(0.005)
# the script ends here, its thread worker inside an item: the exit joins it (bounded)
"""


def test_interpreter_exit_joins_threads_still_inside_a_job(tmp_path):
    """The NOTE [thread shutdown], 7: a daemon thread left inside native code while the interpreter
    tears down can abort the process; the exit joins the runtime's threads first."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=BOUND)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "finished").exists(), "the exit did not wait for the thread inside its job"
