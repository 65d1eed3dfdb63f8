"""The thread executor (``prefetch(method="thread")``): the process backend's semantics on threads.

Ordered reads with random seeks against a list oracle; stale items never computed; concurrency
bounds; errors, timeouts, shutdown, garbage collection, fork; and that the thread backend never
imports torch. Blocked items wait on events the test controls; nothing asserts timing.
"""

from __future__ import annotations

import gc
import os
import pickle
import re
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from forking import BOUND, run_in_fork, wait_until
from seqloader.prefetcher.faults import ItemTimeout
from strategies import tag


def ThreadPrefetch(seq, num_threads, **kwargs):
    return sl.prefetch(seq, num_threads, method="thread", **kwargs)


def read_patiently(p, i):
    """``p[i]``, retried on ``ItemTimeout`` (a short ``timeout`` may expire on a loaded machine)."""
    deadline = time.monotonic() + BOUND
    while True:
        try:
            return p[i]
        except ItemTimeout:
            if time.monotonic() > deadline:
                raise


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


# -- errors and timeouts --------------------------------------------------------------------------

class Fails:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("bad record 3")
        return i


def test_an_item_error_keeps_its_type_gains_a_note_and_the_prefetch_stays_usable():
    with ThreadPrefetch(Fails(), num_threads=2) as p:
        assert [p[0], p[1], p[2]] == [0, 1, 2]
        with pytest.raises(ValueError) as info:
            p[3]
        exc = info.value
        assert type(exc) is ValueError and str(exc) == "bad record 3" and exc.seqloader_index == 3
        assert re.fullmatch(r"seqloader: raised while computing item 3 of prefetch\(method='thread', num_workers=2, "
                            r"prefetch_factor=2, len=6\) in worker 1 \(thread seqloader-worker-1\)", exc.__notes__[-1])
        assert [p[4], p[5], p[0]] == [4, 5, 0]
        with pytest.raises(ValueError, match="bad record 3"):
            p[3]


def test_a_timeout_raises_names_the_item_and_leaves_the_prefetch_usable():
    gate = threading.Event()
    rec = Recorder(10, {2: lambda: gate.wait(BOUND)})
    p = ThreadPrefetch(rec, num_threads=2, timeout=0.01)
    try:
        assert [p[0], p[1]] == [0, 10]
        with pytest.raises(ItemTimeout, match=r"timed out after 0.01 seconds waiting for item 2 from worker 0 "
                                              r"\(thread seqloader-worker-0\)") as info:
            p[2]
        assert isinstance(info.value, RuntimeError) and info.value.item == 2
        assert read_patiently(p, 5) == 50  # another read seeks; the other thread computes it
        gate.set()
        assert [read_patiently(p, i) for i in (2, 3)] == [20, 30]
    finally:
        gate.set()
        p.close()


def test_reading_the_timed_out_item_again_does_not_recompute_it():
    gate = threading.Event()
    rec = Recorder(4, {0: lambda: gate.wait(BOUND)})
    with ThreadPrefetch(rec, num_threads=1, timeout=0.01) as p:
        with pytest.raises(ItemTimeout, match="waiting for item 0"):
            p[0]
        gate.set()
        assert read_patiently(p, 0) == 0  # the read position is unchanged: the same computation
    assert rec.computed.count(0) == 1


# -- lifecycle ----------------------------------------------------------------------------------

def test_close_is_idempotent_reads_after_it_raise_and_no_thread_outlives_it():
    before = set(threading.enumerate())
    p = ThreadPrefetch(range(50), num_threads=4)
    assert list(p) == list(range(50))
    mine = [t for t in set(threading.enumerate()) - before if t.name.startswith("seqloader-worker-")]
    assert mine
    p.close()
    p.close()
    assert p.closed
    assert wait_until(lambda: not any(t.is_alive() for t in mine))
    for call in [lambda: p[0], lambda: p.seek(0), lambda: p.reset([1])]:
        with pytest.raises(ValueError, match=re.escape(f"{p!r}: read or reset after close(); create a new prefetch")):
            call()


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


def test_pickling_repr_context_manager_and_reset():
    with sl.prefetch(range(5), num_workers=2, method="thread") as p:
        assert isinstance(p, sl.Prefetch) and p.executor.kind == "thread"
        assert repr(p) == "prefetch(method='thread', num_workers=2, prefetch_factor=2, len=5)"
        with pytest.raises(TypeError, match="owns its workers and cannot be pickled; pickle the sequence"):
            pickle.dumps(p)
        assert p[1] == 1
        p.reset(["a", "b"])
        assert len(p) == 2 and list(p) == ["a", "b"]
    assert p.closed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_prefetch_inherited_through_fork_reads_with_the_childs_own_threads():
    with ThreadPrefetch(range(30), num_threads=3) as p:
        assert [p[0], p[1]] == [0, 1]  # items 2..7 in flight in the parent
        assert run_in_fork(lambda: [p[i] for i in range(2, 30)]) == repr(list(range(2, 30)))
        assert [p[i] for i in range(2, 30)] == list(range(2, 30))


# -- prefetch(method="thread") --------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [("multiprocessing_context", "spawn"), ("shared", [1]), ("restarts", 1),
                                         ("threads_per_worker", 2), ("thread_init_fn", print)])
def test_process_only_arguments_are_refused_with_threads(name, value):
    with pytest.raises(ValueError, match=f"^prefetch: {name} applies to worker processes only"):
        sl.prefetch(range(3), 2, method="thread", **{name: value})


def test_method_is_validated_and_thread_arguments_are_checked():
    with pytest.raises(ValueError, match=re.escape("prefetch: method must be 'process' (or 'multiprocessing'), 'thread', 'ray', "
                                                   "or a ProcessWorkers, ThreadWorkers or RayWorkers (got 'threads')")):
        sl.prefetch(range(3), 2, method="threads")
    with pytest.raises(ValueError, match="prefetch: num_workers must be a positive int"):
        sl.prefetch(range(3), 0, method="thread")
    with pytest.raises(ValueError, match=re.escape("prefetch: prefetch_factor must be a positive int (got 0)")):
        sl.prefetch(range(3), 1, method="thread", prefetch_factor=0)
    with pytest.raises(ValueError, match=re.escape("prefetch: timeout must be >= 0 (got -1)")):
        sl.prefetch(range(3), 1, method="thread", timeout=-1)
    with pytest.raises(TypeError, match="prefetch: seq must be a sequence"):
        sl.prefetch(iter([]), 1, method="thread")


def test_the_thread_backend_in_a_fresh_interpreter_leaves_torch_unimported():
    code = ("import sys\n"
            "from seqloader import prefetch, smap\n"
            "with prefetch(smap(abs, range(-20, 0)), num_workers=3, method='thread') as p:\n"
            "    assert list(p) == list(range(20, 0, -1))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
