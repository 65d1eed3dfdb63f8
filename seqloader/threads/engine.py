"""The machinery under :class:`~seqloader.threads.ThreadPool`:
one process's lock, job queue and threads (:class:`Runtime`), the jobs, and what a thread does.

NOTE [thread shutdown]
1. ``close()`` (explicit, ``with``; idempotent) marks the pool closed (a later call raises
   ``ValueError``), sets the stop flag, drops the queued jobs (never called), wakes every thread
   and every waiter (a waiter raises ``ValueError``), then joins the threads against one deadline
   of :data:`CLOSE_TIMEOUT` seconds. A thread inside a long call cannot be interrupted: it is left
   to finish that call (it is a daemon), its result is discarded, and it exits.
2. Garbage collection and interpreter exit (``weakref.finalize``) only do what cannot block: set
   the stop flag, and clear the queue and notify if the lock is free at that instant (a
   non-blocking acquire). Idle threads wait at most :data:`CHECK_INTERVAL` seconds at a time, so
   they see the flag within that bound. The gc path never joins: a finalizer that blocks can
   swallow a ``KeyboardInterrupt`` (one raised inside a finalizer run by gc is printed and ignored).
3. Every wait is bounded: waiters sleep at most :data:`CHECK_INTERVAL` seconds at a time, then
   check the stop flag and that the thread running their job (or, for a queued job, some thread of
   the pool) is alive. A job's exception, ``BaseException`` included, is its result: it is
   re-raised in the waiter and never kills a thread.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

__all__ = ["CHECK_INTERVAL", "CLOSE_TIMEOUT", "Job", "Outcome", "Runtime", "Sink", "serve"]

R = TypeVar("R")

#: The longest a waiting thread sleeps before it checks the stop flag and the threads' liveness.
CHECK_INTERVAL = 1.0
#: ``close()`` joins the threads against one deadline this many seconds away.
CLOSE_TIMEOUT = 5.0


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """What one job produced: its ``value``, or the exception it raised (``error``), and the name
    of the ``thread`` that ran it."""

    value: R | None
    error: BaseException | None
    thread: str


class Sink:
    """Where jobs' outcomes go (a map call); every method runs under the lock."""

    def wants(self, job: Job) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self, job: Job) -> bool:
        """A thread took ``job``: ``False`` drops it without calling it."""
        raise NotImplementedError  # pragma: no cover - abstract

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def discarded(self, count: int) -> None:
        """``count`` queued jobs that ``wants`` no longer wanted were removed from the queue."""


@dataclass(eq=False)
class Job:
    sink: Sink
    gen: int
    key: int
    fn: Callable[[], Any]


class Runtime:
    """One process's part of a pool: the lock, the job queue, the threads, the stop flag."""

    def __init__(self, num_threads: int, name: str):
        self.pid = os.getpid()
        self.num_threads, self.name = num_threads, name
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)  # threads wait here for jobs
        self.done = threading.Condition(self.lock)  # readers wait here for outcomes
        self.queue: collections.deque[Job] = collections.deque()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.stopping = False

    # -- under the lock -------------------------------------------------------------------------

    def push(self, jobs: list[Job]) -> None:
        self.queue.extend(jobs)
        want = min(self.num_threads, len(self.threads) + max(0, len(self.queue) - self.idle))
        while len(self.threads) < want:
            t = threading.Thread(target=serve, args=(self,), name=f"{self.name}-{len(self.threads)}", daemon=True)
            t.start()  # start() waits for the thread's bootstrap only, which does not take the lock
            self.threads.append(t)
        self.work.notify(len(jobs))

    def purge(self, sink: Sink) -> collections.deque[Job]:
        """Remove the queued jobs ``sink`` no longer wants; the caller drops them after unlocking
        (dropping a job may run arbitrary finalizers)."""
        keep: collections.deque[Job] = collections.deque()
        gone: collections.deque[Job] = collections.deque()
        for job in self.queue:
            (keep if job.sink is not sink or sink.wants(job) else gone).append(job)
        self.queue = keep
        sink.discarded(len(gone))
        return gone

    def next_job(self) -> Job | None:
        """The next job to run (``None``: stop), waiting at most CHECK_INTERVAL at a time."""
        while True:
            while not self.queue and not self.stopping:
                self.idle += 1
                try:
                    self.work.wait(CHECK_INTERVAL)
                finally:
                    self.idle -= 1
            if self.stopping:
                return None
            job = self.queue.popleft()
            if job.sink.start(job):
                return job
            self.done.notify_all()  # a map call may be waiting for its dropped jobs

    def has_live_thread(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    # -- shutdown (see the NOTE at the top) ---------------------------------------------------------

    def stop_nowait(self) -> None:
        """The gc path: never blocks."""
        self.stopping = True
        gone: collections.deque[Job] | None = None
        if self.lock.acquire(blocking=False):
            try:
                gone, self.queue = self.queue, collections.deque()
                self.work.notify_all()
                self.done.notify_all()
            finally:
                self.lock.release()
        del gone

    def stop(self, timeout: float) -> None:
        with self.lock:
            self.stopping = True
            gone, self.queue = self.queue, collections.deque()
            self.work.notify_all()
            self.done.notify_all()
            threads = list(self.threads)
        del gone
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))


def serve(rt: Runtime) -> None:
    """A pool thread: run jobs until the stop flag is set."""
    name = threading.current_thread().name
    while True:
        with rt.lock:
            job = rt.next_job()
        if job is None:
            return
        try:
            outcome: Outcome[Any] = Outcome(job.fn(), None, name)
        except BaseException as exc:  # a job's error is its result; it never kills the thread
            outcome = Outcome(None, exc, name)
        with rt.lock:
            job.sink.finished(job, outcome)
            rt.done.notify_all()
        del job, outcome
