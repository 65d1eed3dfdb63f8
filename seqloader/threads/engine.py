"""The one thread engine of seqloader: a process's lock, job queues and threads (:class:`Runtime`),
the jobs, and what a thread does (:func:`serve`).

Three adapters sit on it, each a few verbs over one :class:`Runtime`:
:class:`~seqloader.threads.ThreadPool` (the sources' ``map``: one queue, threads started on
demand), :class:`~seqloader.prefetcher.threads.ThreadExecutor` (thread workers of the training
process: queue ``w`` served by thread ``w`` alone, a per-thread ``worker_init_fn``) and
:class:`~seqloader.prefetcher.processes.runner.Runner` (threads inside a worker process: one
queue, a per-thread init, ``alone`` jobs).

A runtime has ``lanes`` FIFO queues; thread ``k`` serves lane ``k % lanes``. A thread first runs
``init(k)`` when one is given (its error is the thread's set-up failure: reported, and the
thread ends), then takes jobs from its lane in order. A job's :class:`Sink` may skip it when it
is taken (a stale generation; the sink replies for it) and receives its :class:`Outcome`. An
``alone`` job starts only when no other job of the runtime runs, and no job starts until it is
done (healing uses it to tell which job killed a process). Every piece of shared state (queues,
counters, the stop flag, the sinks' bookkeeping) is behind one lock, so nothing relies on the GIL.

NOTE [thread shutdown]
1. ``stop()`` (an adapter's ``close()``: explicit, ``with``, or the owner's; idempotent) sets the
   stop flag, drops the queued jobs (never called), wakes every thread and every waiter (a waiter
   sees the flag and raises or returns), then joins the threads against one deadline of
   :data:`CLOSE_TIMEOUT` seconds. A thread inside a long call cannot be interrupted: it is left to
   finish that call alone (it is a daemon), its result is discarded, and it exits.
2. Garbage collection and interpreter exit (an owner's ``weakref.finalize``) call
   ``stop_nowait()``, which only does what cannot block: set the stop flag, and clear the queues
   and notify if the lock is free at that instant (a non-blocking acquire). Idle threads wait at
   most :data:`CHECK_INTERVAL` seconds at a time, so they see the flag within that bound. The gc
   path never joins: a finalizer that blocks can swallow a ``KeyboardInterrupt`` (one raised
   inside a finalizer run by gc is printed and ignored).
3. Every wait is bounded: threads and waiters sleep at most :data:`CHECK_INTERVAL` seconds at a
   time, then check the stop flag and the threads' liveness. A job's exception,
   ``BaseException`` included, is its outcome: it goes to its sink and never kills a thread. A
   thread that ends anyway (or whose ``init`` failed) is reported once by :meth:`Runtime.ended`
   (an executor's ``Died``).
4. A runtime belongs to the process that made it. After ``os.fork()`` a child holds a copy but
   none of its threads, and never touches the copy's lock (a parent thread may have held it at
   the fork): ``stop`` and ``stop_nowait`` do nothing there, and the adapter makes a fresh
   runtime for the child.
5. What the threads' set-up changes process-wide lasts as long as the threads: a context manager
   given to :meth:`Runtime.keep` (entered by the adapter before the first thread starts) is left
   by whoever sees the runtime stopped with no thread alive: ``stop`` or ``stop_nowait`` when
   every thread has ended already, else the last thread as it ends (after ``stop`` has joined
   them, or within :data:`CHECK_INTERVAL` of a ``stop_nowait``; a thread inside a long call keeps
   it until that call is done).
6. What a thread's set-up switched on in that thread is switched off there as it ends: the
   ``on_exit(k)`` hook runs last in each thread, its ``init`` failed or not.
7. Interpreter exit joins: the runtimes of this process are kept in a weak set, and one ``atexit``
   handler (registered at import) stops each that still has threads, joining them against
   :data:`CLOSE_TIMEOUT`, before the interpreter finalizes. A daemon thread still inside native
   code when the interpreter tears down is ended by force, which aborts the process ("terminate
   called without an active exception", exit code 134: a script whose loader raised, with thread
   workers finishing their items, ended that way). ``atexit`` is not a gc finalizer: it may block,
   and it is bounded.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

__all__ = ["CHECK_INTERVAL", "CLOSE_TIMEOUT", "Job", "Outcome", "Runtime", "Sink", "serve"]

R = TypeVar("R")

#: The longest a waiting thread sleeps before it checks the stop flag and the threads' liveness.
CHECK_INTERVAL = 1.0
#: ``stop()`` joins the threads against one deadline this many seconds away.
CLOSE_TIMEOUT = 5.0


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """What one job produced: its ``value``, or the exception it raised (``error``), and the name
    of the ``thread`` that ran it."""

    value: R | None
    error: BaseException | None
    thread: str


class Sink:
    """Where jobs' outcomes go (a map call, an executor); every method runs under the lock."""

    def wants(self, job: Job) -> bool:
        """Whether a queued ``job`` is still wanted (:meth:`Runtime.purge` removes the others)."""
        return True

    def start(self, job: Job) -> bool:
        """A thread took ``job``: ``False`` skips it without calling it."""
        return self.wants(job)

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:
        """``job`` ran: ``outcome`` is its value or error."""

    def discarded(self, jobs: list[Job]) -> None:
        """Queued ``jobs`` that ``wants`` no longer wanted were removed from the queue."""


@dataclass(eq=False)
class Job:
    sink: Sink
    gen: int
    key: int
    fn: Callable[[], Any]
    lane: int = 0
    alone: bool = False  # starts with no other job running; none starts until it is done


class Runtime:
    """One process's threads: the lock, the lanes' queues, the threads, the stop flag.

    Args:
        name: thread ``k`` is named ``f"{name}-{k}"``.
        threads: the most threads (``elastic``: started by :meth:`push` as jobs wait) or the
            number :meth:`start` may start.
        lanes: queues; thread ``k`` serves lane ``k % lanes``.
        init: ``init(k)`` run first in thread ``k``; an error ends the thread (set-up failure).
        on_setup: ``on_setup(k, error)`` under the lock once ``init`` returned or raised.
        on_exit: ``on_exit(k)`` last in thread ``k`` (the NOTE, 6).
        elastic: :meth:`push` starts threads, as many as queued jobs find no idle one.
        idle_exit: a thread ends as soon as its lane has no job for it (with ``elastic``: a burst
            of jobs starts threads, and none is left waiting once they are done).
    """

    def __init__(self, name: str, threads: int, *, lanes: int = 1, init: Optional[Callable[[int], None]] = None,
                 on_setup: Optional[Callable[[int, Optional[BaseException]], None]] = None,
                 on_exit: Optional[Callable[[int], None]] = None, elastic: bool = False, idle_exit: bool = False):
        self.pid = os.getpid()
        self.name, self.num_threads, self.elastic, self.idle_exit = name, threads, elastic, idle_exit
        self.serving = 0  # threads started that still take jobs (idle_exit: they end when none is left)
        self.init, self.on_setup, self.on_exit = init, on_setup, on_exit
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)  # waiters (readers, map calls) wait here
        self.wakeup = [threading.Condition(self.lock) for _ in range(lanes)]  # lane l's threads wait here
        self.queues: list[collections.deque[Job]] = [collections.deque() for _ in range(lanes)]
        self.threads: list[Optional[threading.Thread]] = []
        self.reported: list[bool] = []  # thread k's end was reported by ended()
        self.idle = 0  # threads waiting for a job
        self.active = 0  # jobs being computed
        self.exclusive = False  # an ``alone`` job is being computed
        self.starting = 0  # threads whose init has not returned
        self.setup_error: Optional[BaseException] = None  # the first init error
        self.live = 0  # threads started and not ended
        self.hold: Any = None  # a context manager left once stopped with no thread alive (NOTE, 5)
        self.stopping = False
        _RUNTIMES.add(self)  # joined at interpreter exit (NOTE, 7)

    # -- threads (under the lock) ------------------------------------------------------------------

    def start_locked(self, k: int) -> None:
        """Start (or restart, after it ended) thread ``k``."""
        while len(self.threads) <= k:
            self.threads.append(None)
            self.reported.append(False)
        t = threading.Thread(target=serve, args=(self, k), name=f"{self.name}-{k}", daemon=True)
        self.threads[k], self.reported[k] = t, False
        self.live += 1
        self.starting += 1
        self.serving += 1
        try:
            t.start()  # start() waits for the thread's bootstrap only, which does not take the lock
        except BaseException:
            self.live -= 1
            self.starting -= 1
            self.serving -= 1
            raise

    def start(self, k: int) -> None:
        with self.lock:
            self.start_locked(k)

    def ended(self) -> list[int]:
        """The threads that ended since the last call, unless stopping (each reported once)."""
        out = []
        for k, t in enumerate(self.threads):
            if t is not None and not t.is_alive() and not self.reported[k] and not self.stopping:
                self.reported[k] = True
                out.append(k)
        return out

    def has_live_thread(self) -> bool:
        return any(t is not None and t.is_alive() for t in self.threads)

    def set_up(self, k: int, error: Optional[BaseException]) -> None:
        self.starting -= 1
        if error is not None and self.setup_error is None:
            self.setup_error = error
        if self.on_setup is not None:
            self.on_setup(k, error)
        self.done.notify_all()

    # -- jobs (under the lock) ---------------------------------------------------------------------

    def push(self, jobs: list[Job]) -> None:
        lanes = set()
        for job in jobs:
            self.queues[job.lane].append(job)
            lanes.add(job.lane)
        if self.elastic and self.idle_exit:   # threads end when idle: start one per job no thread takes
            queued = sum(len(q) for q in self.queues)
            while self.serving - self.active < queued and self.serving < self.num_threads:
                free = [k for k, t in enumerate(self.threads) if t is None or not t.is_alive()]
                self.start_locked(free[0] if free else len(self.threads))
        elif self.elastic:
            queued = sum(len(q) for q in self.queues)
            want = min(self.num_threads, len(self.threads) + max(0, queued - self.idle))
            while len(self.threads) < want:
                self.start_locked(len(self.threads))
        for lane in lanes:
            self.wakeup[lane].notify(len(jobs))

    def purge(self, sink: Sink) -> list[Job]:
        """Remove the queued jobs of ``sink`` it no longer wants; the caller drops them after
        unlocking (dropping a job may run arbitrary finalizers)."""
        gone: list[Job] = []
        for lane, queue in enumerate(self.queues):
            keep: collections.deque[Job] = collections.deque()
            for job in queue:
                (keep if job.sink is not sink or sink.wants(job) else gone).append(job)
            self.queues[lane] = keep
        sink.discarded(gone)
        return gone

    def clear(self, lane: int) -> collections.deque[Job]:
        gone, self.queues[lane] = self.queues[lane], collections.deque()
        return gone

    def next_job(self, lane: int) -> Optional[Job]:
        """The next job of ``lane`` to run (``None``: stop), waiting at most CHECK_INTERVAL at a time."""
        while True:
            if self.stopping:
                return None
            queue = self.queues[lane]
            if queue and not self.exclusive and (self.active == 0 or not queue[0].alone):
                job = queue.popleft()
                if job.sink.start(job):
                    self.active += 1
                    self.exclusive = job.alone
                    return job
                self.done.notify_all()  # a waiter may be waiting for its skipped jobs
                continue
            if self.idle_exit:
                self.serving -= 1
                return None
            self.idle += 1
            try:
                self.wakeup[lane].wait(CHECK_INTERVAL)
            finally:
                self.idle -= 1

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:
        self.active -= 1
        self.exclusive = False
        job.sink.finished(job, outcome)
        self.done.notify_all()
        if self.queues[job.lane]:
            self.wakeup[job.lane].notify_all()  # an ``alone`` job may start now, or the jobs after it

    # -- shutdown (see the NOTE at the top) ----------------------------------------------------------

    def keep(self, hold: Any) -> None:
        """Leave the entered context manager ``hold`` once stopped with no thread alive (NOTE, 5)."""
        with self.lock:
            self.hold = hold

    def _halt_locked(self) -> tuple[list[collections.deque[Job]], Any]:
        self.stopping = True
        gone, self.queues = self.queues, [collections.deque() for _ in self.queues]
        for c in self.wakeup:
            c.notify_all()
        self.done.notify_all()
        return gone, self._take_hold_locked()

    def _take_hold_locked(self) -> Any:
        if self.hold is None or not self.stopping or self.live:
            return None
        hold, self.hold = self.hold, None
        return hold

    def halt(self) -> bool:
        """Set the stop flag and drop the queued jobs without joining (a thread may call it);
        returns whether the runtime was stopping already."""
        if os.getpid() != self.pid:
            return True
        with self.lock:
            was = self.stopping
            gone, hold = self._halt_locked()
        del gone
        _let_go(hold)
        return was

    def stop(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """The NOTE, 1: stop, then join every thread against one deadline."""
        if os.getpid() != self.pid:
            return
        self.halt()
        with self.lock:
            threads = list(self.threads)
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for t in threads:
            if t is not None and t is not me:
                t.join(max(0.0, deadline - time.monotonic()))

    def stop_nowait(self) -> None:
        """The gc path (the NOTE, 2): never blocks."""
        if os.getpid() != self.pid:
            return
        self.stopping = True  # seen by each thread within CHECK_INTERVAL
        gone, hold = None, None
        if self.lock.acquire(blocking=False):
            try:
                gone, hold = self._halt_locked()
            finally:
                self.lock.release()
        del gone
        _let_go(hold)

    def thread_ended(self) -> None:
        with self.lock:
            self.live -= 1
            hold = self._take_hold_locked()
        _let_go(hold)


#: the runtimes of this process, for the exit join (NOTE, 7); weak: a runtime's owner decides its life
_RUNTIMES: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


def _join_at_exit() -> None:
    """The NOTE, 7: stop every runtime of this process that still has threads, joining them (bounded)."""
    for rt in list(_RUNTIMES):
        if rt.pid == os.getpid() and rt.has_live_thread():
            rt.stop(CLOSE_TIMEOUT)


atexit.register(_join_at_exit)


def _let_go(hold: Any) -> None:
    if hold is not None:
        hold.__exit__(None, None, None)


def serve(rt: Runtime, k: int) -> None:
    """Thread ``k``: its ``init``, then jobs of its lane until the stop flag is set."""
    name, lane = threading.current_thread().name, k % len(rt.queues)
    try:
        error: Optional[BaseException] = None
        if rt.init is not None:
            try:
                rt.init(k)
            except BaseException as exc:  # the thread's set-up failure: reported, then it ends
                error = exc
        with rt.lock:
            rt.set_up(k, error)
        if error is not None:
            return
        while True:
            with rt.lock:
                job = rt.next_job(lane)
            if job is None:
                return
            try:
                outcome: Outcome[Any] = Outcome(job.fn(), None, name)
            except BaseException as exc:  # a job's error is its result; it never kills the thread
                outcome = Outcome(None, exc, name)
            with rt.lock:
                rt.finished(job, outcome)
            del job, outcome
    finally:
        try:
            if rt.on_exit is not None:
                rt.on_exit(k)
        finally:
            rt.thread_ended()
