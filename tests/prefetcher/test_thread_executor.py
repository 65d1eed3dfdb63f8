"""The thread executor (``prefetch(method="thread")``): what threads of this process do alone.

Ordered reads with random seeks against a list oracle; a seek drops items queued behind a blocked
thread; concurrency bounds; garbage collection without joining, fork; and that the thread backend
never imports torch. What every executor promises (reads, seeks, read-ahead, reset, close, errors,
timeouts, arguments) is ``test_promises.py``. Blocked items wait on events the test controls;
nothing asserts timing.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from forking import BOUND, run_in_fork, wait_until
from strategies import tag


def ThreadPrefetch(seq, num_threads, **kwargs):
    return sl.prefetch(seq, num_threads, method="thread", **kwargs)


class Recorder:
    """A sequence of ``n`` items that records which items were computed; ``hooks[i]()`` runs first."""

    def __init__(self, n, hooks=None):
        self.n, self.hooks = n, hooks or {}
        self.lock = threading.Lock()
        self.computed = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.computed.append(i)
        hook = self.hooks.get(i)
        if hook is not None:
            hook()
        return i * 10


# -- ordered reads and seeks ----------------------------------------------------------------------

reads = st.lists(st.one_of(st.just("next"), st.tuples(st.just("seek"), st.integers(0, 40)),
                           st.tuples(st.just("read"), st.integers(-40, 39))), max_size=40)


@given(st.lists(st.integers(-100, 100), max_size=30), st.integers(1, 4), st.integers(1, 3), reads)
def test_reads_and_seeks_match_a_list(base, num_workers, prefetch_factor, ops):
    oracle = [tag(x) for x in base]
    n = len(oracle)
    with sl.prefetch(sl.smap(tag, base), num_workers, method="thread", prefetch_factor=prefetch_factor) as p:
        assert len(p) == n
        cursor = 0
        for op in ops:
            if op == "next":
                if cursor < n:
                    assert p[cursor] == oracle[cursor]
                    cursor += 1
            elif op[0] == "seek":
                if op[1] <= n:
                    p.seek(op[1])
                    cursor = op[1]
            elif -n <= op[1] < n:
                assert p[op[1]] == oracle[op[1]]
                cursor = op[1] % n + 1
        assert list(p) == oracle
        assert list(p[::-1]) == oracle[::-1]
        with pytest.raises(IndexError, match=re.escape(f"{p!r}: index {n} out of range")):
            p[n]


def test_a_seek_drops_queued_items_unread():
    gate, in_one = threading.Event(), threading.Event()

    def block():
        in_one.set()
        assert gate.wait(BOUND)

    rec = Recorder(20, {1: block})
    with ThreadPrefetch(rec, num_threads=1, prefetch_factor=4) as p:
        assert p[0] == 0  # items 1..4 are in flight; the one thread is inside item 1
        assert in_one.wait(BOUND)
        p.seek(10)
        gate.set()
        assert [p[10], p[11]] == [100, 110]
    assert not {2, 3, 4} & set(rec.computed), rec.computed


def test_at_most_num_workers_items_run_at_once_and_all_of_them_do():
    cond, state, reached = threading.Condition(), {"running": 0, "peak": 0}, threading.Event()

    def together():
        with cond:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
            if state["running"] == 3:
                reached.set()
        try:
            assert reached.wait(BOUND), "three items never ran at once"
        finally:
            with cond:
                state["running"] -= 1

    rec = Recorder(12, {i: together for i in range(12)})
    with ThreadPrefetch(rec, num_threads=3, prefetch_factor=2) as p:
        assert list(p) == [i * 10 for i in range(12)]
    assert state["peak"] == 3


def test_other_items_complete_while_one_blocks():
    four_done = threading.Event()
    rec = Recorder(8, {1: lambda: four_done.wait(BOUND) or pytest.fail("item 4 never ran while 1 blocked"),
                       4: four_done.set})
    with ThreadPrefetch(rec, num_threads=2, prefetch_factor=2) as p:
        assert list(p) == [i * 10 for i in range(8)]


# -- lifecycle ----------------------------------------------------------------------------------

def test_garbage_collection_signals_the_threads_without_joining(monkeypatch):
    gate, inside = threading.Event(), threading.Event()

    def block():
        inside.set()
        gate.wait(BOUND)

    before = set(threading.enumerate())
    p = ThreadPrefetch(Recorder(8, {1: block}), num_threads=2)
    assert p[0] == 0
    assert inside.wait(BOUND)
    mine = [t for t in set(threading.enumerate()) - before if t.name.startswith("seqloader-worker-")]
    joined = []
    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "join", lambda self, timeout=None: joined.append(self.name))
        del p
        gc.collect()
    assert joined == []
    gate.set()
    assert wait_until(lambda: not any(t.is_alive() for t in mine))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_prefetch_inherited_through_fork_reads_with_the_childs_own_threads():
    with ThreadPrefetch(range(30), num_threads=3) as p:
        assert [p[0], p[1]] == [0, 1]  # items 2..7 in flight in the parent
        assert run_in_fork(lambda: [p[i] for i in range(2, 30)]) == repr(list(range(2, 30)))
        assert [p[i] for i in range(2, 30)] == list(range(2, 30))


# -- prefetch(method="thread") --------------------------------------------------------------------


def test_method_is_validated():
    with pytest.raises(ValueError, match=re.escape("prefetch: method must be 'process' (or 'multiprocessing'), 'thread', 'ray', "
                                                   "or a ProcessWorkers, ThreadWorkers or RayWorkers (got 'threads')")):
        sl.prefetch(range(3), 2, method="threads")


def test_the_thread_backend_in_a_fresh_interpreter_leaves_torch_unimported():
    code = ("import sys\n"
            "from seqloader import prefetch, smap\n"
            "with prefetch(smap(abs, range(-20, 0)), num_workers=3, method='thread') as p:\n"
            "    assert list(p) == list(range(20, 0, -1))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
