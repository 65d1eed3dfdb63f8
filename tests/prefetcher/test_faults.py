"""Faults of worker processes: the worker's traceback, exceptions and items that cannot be pickled,
workers killed by signals (inside an item or idle), a dead reader, Ctrl-C in the reader, start
methods that cannot pickle ``worker_init_fn``, fork. What every executor promises (an error keeps
its type and gains a note, a timeout, a failing ``worker_init_fn``, a dead worker named with its
item, nothing left after close, ``del`` or gc) is ``test_promises.py``.

The ``no_leaks`` fixture (tests/conftest.py) runs around every test here: it fails if a worker
process or a ``/dev/shm/seqloader_*`` segment outlives the test.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import gc
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch.utils.data

import seqloader as sl
from seqloader import prefetch


class Boom:
    """Item ``bad`` raises ``ValueError``; the others are their index."""

    def __init__(self, n=10, bad=3):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"bad item {i}")
        return i


class NeedsTwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}+{b}")


class Dies:
    """Item ``bad`` kills its worker with ``how``."""

    def __init__(self, how, bad=2):
        self.how, self.bad = how, bad

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == self.bad:
            if self.how == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "segfault":
                faulthandler.disable()  # pytest enables it; keep the worker's crash quiet
                ctypes.string_at(0)
            elif self.how == "unpicklable_error":
                raise NeedsTwoArgs(1, 2)
        return i


class Pid:
    def __len__(self):
        return 100

    def __getitem__(self, i):
        return os.getpid()


def make_closure(i):
    return lambda: i  # an item that cannot be pickled


def test_an_item_error_carries_the_workers_traceback_as_its_cause():
    with prefetch(Boom(), num_workers=2) as p:
        assert p[0] == 0
        with pytest.raises(ValueError, match=r"^bad item 3") as info:
            list(p)
    assert "in __getitem__" in str(info.value.__cause__) and "bad item 3" in str(info.value.__cause__)


def test_an_exception_that_cannot_be_pickled_keeps_its_type_when_it_can():
    with prefetch(Dies("unpicklable_error"), num_workers=1) as p:
        with pytest.raises(RuntimeError, match=r"NeedsTwoArgs: 1\+2") as info:
            p[2]
    assert "NeedsTwoArgs" in str(info.value.__cause__)


def test_an_unpicklable_item_is_a_type_error():
    with prefetch(sl.smap(make_closure, range(3)), num_workers=1) as p:
        with pytest.raises(TypeError, match=r"item 0 cannot be sent to the parent process"):
            p[0]


@pytest.mark.parametrize("how, match", [
    ("SIGKILL", r"seqloader worker \d \(pid \d+\) was killed by SIGKILL while producing item 2"),
    ("segfault", r"seqloader worker \d \(pid \d+\) was killed by SIGSEGV while producing item 2"),
])
def test_a_dead_worker_is_a_runtime_error_naming_worker_pid_and_signal(how, match):
    p = prefetch(Dies(how), num_workers=2)
    with pytest.raises(RuntimeError, match=match):
        list(p)
    assert p.closed
    with pytest.raises(ValueError, match="after an earlier error"):
        p[0]


def test_a_worker_killed_from_outside_while_idle_is_detected():
    with prefetch(Pid(), num_workers=2, prefetch_factor=1) as p:
        victim = psutil.Process(p[0])
        victim.kill()
        deadline = time.monotonic() + 60  # a bound, not a timing: the kill is seen well before
        while victim.status() != psutil.STATUS_ZOMBIE:  # do not reap it: its parent must
            assert time.monotonic() < deadline, "the killed worker never became a zombie"
            time.sleep(0.01)
        with pytest.raises(RuntimeError, match=rf"seqloader worker \d \(pid {victim.pid}\) was killed by SIGKILL"):
            list(p)


def _explode():
    raise ValueError("cannot be rebuilt in the worker")


class RebuildFails:
    """Pickles in the reader; unpickling it raises (in the worker)."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return i

    def __reduce__(self):
        return _explode, ()


def test_a_worker_that_reported_its_failure_and_exited_is_reported_by_its_error_not_as_dead():
    # A worker reports a failure (here a reset it cannot unpickle; under `ulimit -n`, a slot it
    # cannot map) and exits; the next send to it then breaks before the reader has read the report.
    # The reader must raise the report, not "exited unexpectedly with exit code 0": the executor
    # drains a dead worker's pipe before it reports the death.
    with prefetch(Pid(), num_workers=1, prefetch_factor=1) as p:
        worker = psutil.Process(p[0])
        p.reset(RebuildFails())
        deadline = time.monotonic() + 60  # a bound, not a timing
        while worker.status() != psutil.STATUS_ZOMBIE:  # gone, not reaped: its parent must
            assert time.monotonic() < deadline, "the worker never exited"
            time.sleep(0.01)
        with pytest.raises(ValueError, match="cannot be rebuilt in the worker") as info:
            p[0]  # the job's send breaks; the wait reads the report first
    assert any("reset failed in worker 0" in n for n in info.value.__notes__)


_READER = textwrap.dedent("""
    import os, sys, time
    from seqloader import prefetch
    import numpy as np
    p = prefetch([np.zeros(1000)] * 100, num_workers=2)
    p[0]
    import psutil
    print(" ".join(str(c.pid) for c in psutil.Process().children()), flush=True)
    time.sleep(60)
""")


def test_workers_exit_on_their_own_when_the_reader_is_killed():
    reader = subprocess.Popen([sys.executable, "-c", _READER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pids = [int(x) for x in reader.stdout.readline().split()]
    workers = [psutil.Process(pid) for pid in pids]
    assert len(workers) == 2
    reader.kill()
    reader.wait()
    reader.stdout.close()
    gone, alive = psutil.wait_procs(workers, timeout=60)  # they check every 0.25 s; 60 s is a bound
    assert not alive


def _interrupt_reader_once(marker, go, never, i):
    """Item 2 waits for ``go`` (set by the test inside ``pytest.raises``), sends Ctrl-C to the
    reader (once, whichever worker computes it: the marker file is created atomically) and then
    waits for ``never``, which the test never sets: the reader is certainly inside the ``raises``
    block and waiting for it when the signal arrives, and cannot read item 2 without it."""
    if i == 2:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return i
        assert go.wait(60), "the test never said go"
        os.kill(os.getppid(), signal.SIGINT)
        never.wait(60)
    return i


def test_keyboard_interrupt_in_the_reader_then_gc_leaves_nothing(tmp_path, sigint_raises):
    fork = multiprocessing.get_context("fork")
    go, never = fork.Event(), fork.Event()
    item = functools.partial(_interrupt_reader_once, str(tmp_path / "interrupted"), go, never)
    p = prefetch(sl.smap(item, range(10)), num_workers=2, prefetch_factor=1, multiprocessing_context="fork")
    assert p[0] == 0
    with pytest.raises(KeyboardInterrupt):
        go.set()
        list(p)
    assert p[1] == 1  # still usable
    del p  # close() stops the worker still sleeping in item 2 (SIGTERM after the join deadline)
    gc.collect()


def test_the_reader_holds_sigint_around_each_message_with_the_public_signal_function(monkeypatch):
    """Each message is written and read with SIGINT held by ``signal.pthread_sigmask`` (the public
    function, no longer the private C one under it) and the caller's mask restored after."""
    real, calls = signal.pthread_sigmask, []

    def spy(how, mask):
        held = real(how, mask)
        calls.append((how, set(mask), sigint_held()))
        return held

    def sigint_held():
        return signal.SIGINT in real(signal.SIG_BLOCK, ())

    before = sigint_held()
    monkeypatch.setattr(signal, "pthread_sigmask", spy)
    with prefetch(range(4), num_workers=1) as p:
        assert list(p) == [0, 1, 2, 3]
    monkeypatch.undo()
    blocks = [c for c in calls if c[0] == signal.SIG_BLOCK and c[1] == {signal.SIGINT}]
    assert blocks and all(held for _, _, held in blocks)
    assert sigint_held() == before


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_an_unpicklable_worker_init_fn_raises_pickles_error_with_a_note(method):
    """torch warns ("Got pickle error ...") and raises pickle's own error (here ``AttributeError:
    Can't pickle local object``, on 3.13 ``Can't get local object``); so does seqloader, with
    torch's words and a note."""
    fn = lambda w: None  # noqa: E731
    with pytest.raises((pickle.PicklingError, AttributeError)) as by_torch, \
            pytest.warns(UserWarning, match="Got pickle error") as torch_warned:
        list(torch.utils.data.DataLoader(range(3), num_workers=1, multiprocessing_context=method, worker_init_fn=fn))
    p = prefetch(range(3), 1, multiprocessing_context=method, worker_init_fn=fn)
    with pytest.raises(type(by_torch.value), match=re.escape(str(by_torch.value))) as info, \
            pytest.warns(UserWarning, match="Got pickle error") as warned:
        p[0]
    theirs = {str(w.message) for w in torch_warned if "pickle error" in str(w.message)}
    assert {str(w.message) for w in warned if "pickle error" in str(w.message)} == theirs
    assert any(f"cannot start worker 0 with the '{method}' start method" in n for n in info.value.__notes__)
    assert p.closed


def test_a_forked_copy_of_the_reader_cannot_stop_the_workers():
    with prefetch(range(20), num_workers=2) as p:
        assert p[0] == 0
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                p.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert list(p) == list(range(20))
