"""The thread engine (``seqloader/threads.py``): ordered ``map``, generation-numbered channels,
concurrency bounds, errors, shutdown, garbage collection and fork.

Nothing here asserts timing: blocked items wait on events the test controls, every wait has a
generous bound, and concurrency is counted under a lock.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import re
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forking import BOUND, run_in_fork, wait_until
from seqloader.threads import ThreadPool

_names = itertools.count()


def unique_name() -> str:
    return f"test-threads-{os.getpid()}-{next(_names)}"


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name + "-")]


class Gauge:
    """Counts calls running at once, and their peak."""

    def __init__(self):
        self.cond = threading.Condition()
        self.running = self.peak = 0

    def __enter__(self):
        with self.cond:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.cond.notify_all()

    def __exit__(self, *exc):
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def wait_for(self, running: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.running == running, BOUND)


class InThread:
    """Run ``fn()`` in a helper thread; ``result()`` joins it (bounded) and returns or raises."""

    def __init__(self, fn):
        self.value = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except BaseException as exc:
            self.error = exc

    def result(self):
        self.thread.join(BOUND)
        assert not self.thread.is_alive(), "the helper thread did not finish within the bound"
        if self.error is not None:
            raise self.error
        return self.value


def _fail_on(failing):
    def f(item):
        k, x = item
        if k in failing:
            raise ValueError(f"item {k} failed")
        return 2 * x
    return f


# -- map ------------------------------------------------------------------------------------------

@given(st.lists(st.integers(-50, 50), max_size=25), st.integers(1, 5), st.sets(st.integers(0, 30), max_size=4))
def test_map_is_a_list_comprehension_with_the_first_error_in_item_order(items, num_threads, failing):
    with ThreadPool(num_threads) as pool:
        bad = sorted(k for k in failing if k < len(items))
        if not bad:
            assert pool.map(_fail_on(failing), enumerate(items)) == [2 * x for x in items]
            return
        with pytest.raises(ValueError) as info:
            pool.map(_fail_on(failing), enumerate(items))
        assert str(info.value) == f"item {bad[0]} failed"
        assert [n for n in info.value.__notes__ if f"at item {bad[0]} (thread" in n]


def test_map_runs_at_most_num_threads_calls_at_once_and_reaches_it():
    gauge, release = Gauge(), threading.Event()

    def blocked(x):
        with gauge:
            assert release.wait(BOUND)
            return x

    with ThreadPool(3) as pool:
        call = InThread(lambda: pool.map(blocked, range(10)))
        assert gauge.wait_for(3)
        release.set()
        assert call.result() == list(range(10))
    assert gauge.peak == 3


def test_other_items_complete_while_one_blocks():
    done, lock, others_done = set(), threading.Lock(), threading.Event()

    def f(k):
        if k == 0:
            assert others_done.wait(BOUND), "items 1..5 did not complete while item 0 was blocked"
            return "first"
        with lock:
            done.add(k)
            if len(done) == 5:
                others_done.set()
        return k

    with ThreadPool(2) as pool:
        assert pool.map(f, range(6)) == ["first", 1, 2, 3, 4, 5]


def test_the_first_error_in_item_order_wins_even_when_a_later_item_fails_first():
    five_failed = threading.Event()

    def f(k):
        if k == 5:
            five_failed.set()
            raise KeyError("five")
        if k == 3:
            assert five_failed.wait(BOUND)
            raise ValueError("three")
        return k

    with ThreadPool(4) as pool:
        with pytest.raises(ValueError) as info:
            pool.map(f, range(8))
    assert type(info.value) is ValueError and str(info.value) == "three"
    assert [n for n in info.value.__notes__ if re.match(r"seqloader: raised in ThreadPool.map\(.*f\) at item 3 ", n)]


def test_items_queued_after_an_error_are_not_started():
    started = []

    def f(k):
        started.append(k)
        if k == 2:
            raise OSError("range read failed")
        return k

    with ThreadPool(1) as pool:
        with pytest.raises(OSError, match="range read failed"):
            pool.map(f, range(10))
        assert started == [0, 1, 2]
        assert pool.map(f, [7]) == [7]  # the pool stays usable


def test_map_re_raises_base_exceptions_of_items():
    def leave(_):
        raise SystemExit(3)

    with ThreadPool(2) as pool:
        with pytest.raises(SystemExit):
            pool.map(leave, [0])


def test_a_nested_map_from_a_pool_thread_runs_inline_instead_of_deadlocking():
    with ThreadPool(1) as pool:
        assert pool.map(lambda x: pool.map(abs, [x, -x]), [1, 2]) == [[1, 1], [2, 2]]


def test_map_takes_any_iterable_and_an_empty_one():
    with ThreadPool(2) as pool:
        assert pool.map(str, (x for x in range(3))) == ["0", "1", "2"]
        assert pool.map(str, []) == []


def test_threads_start_on_first_use_and_concurrent_first_calls_share_them():
    name, barrier = unique_name(), threading.Barrier(8)
    pool = ThreadPool(2, name=name)
    assert threads_named(name) == []  # nothing started yet

    def caller(k):
        barrier.wait(BOUND)
        return pool.map(lambda x: x + k, range(5))

    calls = [InThread(lambda k=k: caller(k)) for k in range(8)]
    assert [c.result() for c in calls] == [[x + k for x in range(5)] for k in range(8)]
    assert len(pool._runtimes) == 1 and 1 <= len(threads_named(name)) <= 2
    pool.close()


# -- shutdown -----------------------------------------------------------------------------------

def test_close_is_idempotent_and_leaves_no_thread_running():
    name, gauge, release = unique_name(), Gauge(), threading.Event()

    def blocked(x):
        with gauge:
            assert release.wait(BOUND)
            return x

    pool = ThreadPool(4, name=name)
    call = InThread(lambda: pool.map(blocked, range(8)))
    assert gauge.wait_for(4)
    assert len(threads_named(name)) == 4
    release.set()
    assert call.result() == list(range(8))
    pool.close()
    pool.close()
    assert pool.closed
    assert wait_until(lambda: not threads_named(name)), threads_named(name)
    with pytest.raises(ValueError, match=r"^ThreadPool\(num_threads=4, name='.*'\): map after close\(\); create a new"):
        pool.map(abs, [1])


def test_close_wakes_a_waiting_map_with_value_error():
    gate, gauge = threading.Event(), Gauge()

    def blocked(x):
        with gauge:
            gate.wait(BOUND)
            return x

    pool = ThreadPool(2)
    call = InThread(lambda: pool.map(blocked, range(4)))
    assert gauge.wait_for(2)
    closer = InThread(pool.close)
    assert wait_until(lambda: pool.closed)
    with pytest.raises(ValueError, match="closed while map was waiting"):
        call.result()
    gate.set()
    closer.result()


def test_garbage_collection_stops_the_threads_without_joining_them(monkeypatch):
    name = unique_name()
    pool = ThreadPool(3, name=name)
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    assert threads_named(name)
    joined = []
    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "join", lambda self, timeout=None: joined.append(self.name))
        del pool
        gc.collect()
    assert joined == []  # the gc path never blocks (a blocking finalizer can swallow Ctrl-C)
    assert wait_until(lambda: not threads_named(name)), threads_named(name)


def test_a_pool_cannot_be_pickled():
    with pytest.raises(TypeError, match=r"owns threads and cannot be pickled; an object that holds a pool drops it"):
        pickle.dumps(ThreadPool(2))


@pytest.mark.parametrize("args, kwargs, exc, msg", [
    ((0,), {}, ValueError, "ThreadPool: num_threads must be a positive int (got 0)"),
    ((1.5,), {}, TypeError, "ThreadPool: num_threads must be an int (got float 1.5)"),
    ((2,), {"name": ""}, TypeError, "ThreadPool: name must be a non-empty str (got str '')"),
])
def test_argument_errors_name_the_argument(args, kwargs, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        ThreadPool(*args, **kwargs)
    with pytest.raises(TypeError, match=re.escape("ThreadPool.map: fn must be callable (got int 3)")):
        ThreadPool(1).map(3, [])


# -- fork ---------------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_starts_its_own_threads():
    name = unique_name()
    with ThreadPool(2, name=name) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]  # the parent's threads run

        def child():
            return pool.map(abs, [-3, -4]), sorted(t.name for t in threads_named(name))

        assert run_in_fork(child) == repr(([3, 4], [f"{name}-0", f"{name}-1"]))
        assert pool.map(abs, [-5]) == [5]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_never_touches_the_parents_lock():
    """A parent thread may hold the pool's lock at the fork; the child's lock is its own."""
    with ThreadPool(2) as pool:
        assert pool.map(abs, [-1]) == [1]
        parent_lock = pool._runtimes[os.getpid()].lock
        with parent_lock:  # held at the fork, as if by one of the parent's threads
            report = run_in_fork(lambda: pool.map(abs, [-6, -7]))
        assert report == "[6, 7]"
