"""The thread executor: workers that are threads of this process, results handed over by reference.

:class:`ThreadExecutor` implements :class:`~seqloader.prefetcher.executor.Executor` with one
daemon thread per worker. Nothing is pickled or copied: a worker computes ``seq[index]`` and the
reader gets that very object. Code that releases the GIL while it works (pyarrow, PIL, numpy,
torch, file and network reads) runs in parallel; pure-Python work does not (one thread holds the
GIL at a time), so for Python-heavy items worker processes stay the faster choice.

Worker ``w`` runs ``worker_init_fn(w)`` in its own thread first (the loader installs a per-thread
``WorkerInfo`` and per-thread generators there), then takes its jobs in the order they were
submitted. A job whose generation is older than the newest submitted is skipped. Every piece of
state the threads share (the job queues, the replies, the stop flag) is behind one lock, so
correctness does not depend on the GIL (free-threaded CPython included).

NOTE [ thread executor: shutdown ]
1. ``close()`` (explicit, or the owner's ``close()``; idempotent) marks the executor closed, sets
   the stop flag, drops the queued jobs (never computed), wakes every thread, then joins them
   against one deadline of :data:`CLOSE_TIMEOUT` seconds. A thread inside a long item cannot be
   interrupted: it finishes that item alone (it is a daemon), its result is discarded, and it
   exits.
2. Garbage collection and interpreter exit (the owner's ``weakref.finalize``) call
   :meth:`ThreadExecutor.stop_nowait`, which does only what cannot block: set the flag, clear the
   queues and notify if the lock is free at that instant. Idle threads wait at most
   :data:`CHECK_INTERVAL` seconds at a time, so they see the flag within that bound. A finalizer
   that blocks could swallow a ``KeyboardInterrupt`` (one raised inside a finalizer run by gc is
   printed and ignored).
3. Every wait is bounded: the reader's :meth:`ThreadExecutor.poll` by its timeout, idle threads by
   :data:`CHECK_INTERVAL`. A job's exception, ``BaseException`` included, is its outcome: it is
   re-raised in the reader and never kills a thread. A thread that ends anyway is reported
   :class:`~seqloader.prefetcher.executor.Died`.
4. After ``os.fork()`` a child holds a copy of the executor but none of its threads; it never
   touches the copy's lock (it may have been held at the fork): ``close`` there does nothing, and
   the owner reads with :meth:`ThreadExecutor.forked`, a fresh executor of the child's own.
5. What the workers' set-up changes process-wide lasts as long as the threads: a
   ``worker_init_fn`` with a ``while_workers_live()`` method (the loader's: torch's
   ``get_worker_info`` made thread-aware) has the context manager it returns entered by
   ``launch`` before the first thread starts, and left by whoever sees the executor stopped with
   no thread alive: ``close`` or ``stop_nowait`` when every thread has ended already, else the
   last thread as it ends (after ``close`` has joined them, or within :data:`CHECK_INTERVAL` of a
   ``stop_nowait``; a thread inside a long item keeps it until that item is done).
6. What a worker's set-up switched on in its own thread is switched off there as it ends: a
   ``worker_init_fn`` with a ``thread_ended(worker_id)`` method (the loader's: stage timing, whose
   count of collecting threads is process-wide) has it called last in each worker thread,
   ``worker_init_fn`` failed or not.
7. An item's ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``,
   ``GeneratorExit``) is its outcome like any error; the reader reports it as a ``RuntimeError``
   naming the item (:func:`seqloader.prefetcher.inbox.item_exit_error`), as for worker processes,
   so it never ends the training process.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Callable, Optional, Sequence

from seqloader.prefetcher.executor import Died, Done, Event, SetupFailed, Started
from seqloader.sequences import stage_times

__all__ = ["CHECK_INTERVAL", "CLOSE_TIMEOUT", "ThreadExecutor"]

#: The longest an idle worker thread sleeps before it checks the stop flag.
CHECK_INTERVAL = 1.0
#: ``close()`` joins the threads against one deadline this many seconds away.
CLOSE_TIMEOUT = 5.0


class ThreadExecutor:
    """``num_workers`` threads of this process (see the module docstring).

    Args:
        num_workers: threads, ``>= 1``.
        worker_init_fn: ``worker_init_fn(worker_id)``, run first in each thread, or ``None``; with a
            ``while_workers_live()`` method, its context manager is held while the threads live
            (the NOTE above, 5).
        name: threads are named ``f"{name}-{worker_id}"``.

    Example:
        >>> ex = ThreadExecutor(2)
        >>> ex.launch(["a", "b", "c"], gen=0)
        >>> ex.submit(1, 0, 2)
        >>> got = []
        >>> while not any(type(e).__name__ == "Done" for e in got):
        ...     got += ex.poll(1.0)
        >>> done = [e for e in got if type(e).__name__ == "Done"][0]
        >>> done.index, ex.outcome(done.reply), ex.who(1)
        (2, (True, 'c'), 'worker 1 (thread seqloader-worker-1)')
        >>> ex.close(); ex.closed
        True
    """

    kind = "thread"
    concurrency = 1

    def __init__(self, num_workers: int, worker_init_fn: Optional[Callable[[int], None]] = None,
                 name: str = "seqloader-worker"):
        self.num_workers = num_workers
        self._init, self._name = worker_init_fn, name
        self._lock = threading.Lock()
        self._reader = threading.Condition(self._lock)  # the reader waits here for events
        self._wakeup = [threading.Condition(self._lock) for _ in range(num_workers)]  # worker w waits here
        self._queues: list[collections.deque] = [collections.deque() for _ in range(num_workers)]
        self._events: list[Event] = []
        self._threads: list[Optional[threading.Thread]] = [None] * num_workers
        self._reported = [False] * num_workers
        self._seq: Sequence[Any] = ()
        self._latest = -1  # the newest generation submitted
        self._stopping = False
        self._closed = False
        self._owner_pid = os.getpid()
        self._live = 0  # threads started and not ended
        self._hold: Any = None  # what worker_init_fn.while_workers_live() returned, while entered (NOTE, 5)
        self._held = False  # entered once already (never again)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- starting ----------------------------------------------------------------------------------

    def launch(self, seq: Sequence[Any], gen: int) -> None:
        self._enter_hold()
        with self._lock:
            self._seq, self._latest = seq, max(self._latest, gen)
        for w in range(self.num_workers):
            self._start(w)

    def _enter_hold(self) -> None:
        """Enter ``worker_init_fn.while_workers_live()``, once (the NOTE above, 5)."""
        lifetime = getattr(self._init, "while_workers_live", None)
        if lifetime is None or self._held or self._stopping:
            return
        hold = lifetime()
        hold.__enter__()
        with self._lock:
            self._hold, self._held = hold, True

    def _start(self, w: int) -> None:
        t = threading.Thread(target=self._run, args=(w,), name=f"{self._name}-{w}", daemon=True)
        with self._lock:
            self._threads[w] = t
            self._reported[w] = False
            self._live += 1
        try:
            t.start()
        except BaseException:
            self._ended()
            raise

    def replace(self, worker: int, seq: Sequence[Any]) -> None:
        with self._lock:
            self._seq = seq
            self._queues[worker].clear()
        self._start(worker)

    # -- jobs --------------------------------------------------------------------------------------

    def accepting(self, worker: int) -> bool:
        return not self._stopping

    def submit(self, worker: int, gen: int, index: int) -> None:
        with self._lock:
            if gen > self._latest:
                self._latest = gen
            self._queues[worker].append((gen, index, self._seq))
            self._wakeup[worker].notify()

    def new_generation(self, gen: int) -> None:
        """Skip the queued jobs of older generations now (each reported done, unread)."""
        with self._lock:
            self._latest = max(self._latest, gen)
            for w, q in enumerate(self._queues):
                while q and q[0][0] < gen:
                    old = q.popleft()
                    self._events.append(Done(w, old[0], old[1], None))
            self._reader.notify()

    def reset(self, seq: Sequence[Any], gen: int) -> None:
        with self._lock:
            self._seq = seq
            if gen > self._latest:
                self._latest = gen

    # -- a worker thread -----------------------------------------------------------------------------

    def _run(self, w: int) -> None:
        try:
            self._work(w)
        finally:
            try:
                ended = getattr(self._init, "thread_ended", None)
                if ended is not None:  # the NOTE above, 6
                    ended(w)
            finally:
                self._ended()

    def _ended(self) -> None:
        """A thread ended (or failed to start): the last one of a stopped executor lets go of the hold."""
        with self._lock:
            self._live -= 1
            hold = self._take_hold_locked()
        self._let_go(hold)

    def _work(self, w: int) -> None:
        try:
            if self._init is not None:
                self._init(w)
        except BaseException as exc:
            self._post(SetupFailed(w, "worker_init_fn", exc))
            return
        self._post(Started(w))
        while True:
            job = self._next_job(w)
            if job is None:
                return
            gen, index, seq = job
            times = stage_times.current()
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                outcome: tuple[bool, Any] = (True, seq[index])
            except BaseException as exc:  # the job's outcome; never kills the thread
                outcome = (False, exc)
            seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
            stages = () if times is None else tuple(times.take().items())
            self._post(Done(w, gen, index, outcome, seconds, stages, cpu))
            del outcome

    def _next_job(self, w: int) -> Optional[tuple]:
        """The next job of worker ``w`` to compute (reporting the stale ones skipped), or ``None``
        once the executor stops."""
        queue, wakeup = self._queues[w], self._wakeup[w]
        with self._lock:
            while True:
                if self._stopping:
                    return None
                if not queue:
                    wakeup.wait(CHECK_INTERVAL)
                    continue
                job = queue.popleft()
                if job[0] >= self._latest:
                    return job
                self._events.append(Done(w, job[0], job[1], None))
                self._reader.notify()

    def _post(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
            self._reader.notify()

    # -- the reader's side -----------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Event]:
        with self._lock:
            if not self._events and not self._stopping:
                self._reader.wait(timeout)
            events, self._events = self._events, []
            if not events:
                for w, t in enumerate(self._threads):
                    if t is not None and not t.is_alive() and not self._reported[w] and not self._stopping:
                        self._reported[w] = True
                        events.append(Died(w))
        return events

    def forked(self) -> "ThreadExecutor":
        """A fresh executor with the same settings, for a forked child (see the NOTE, 4)."""
        return ThreadExecutor(self.num_workers, self._init, self._name)

    def outcome(self, reply: Any) -> tuple[bool, Any]:
        return reply

    def drop(self, reply: Any) -> None:
        pass

    def who(self, worker: int) -> str:
        return f"worker {worker} (thread {self._name}-{worker})"

    def pid(self, worker: int) -> Optional[int]:
        return None

    def death(self, worker: int) -> tuple[str, Optional[int]]:
        return "ended unexpectedly", None

    def counters(self) -> dict:
        return {}

    # -- closing ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the threads (the NOTE above, 1); idempotent."""
        if self._closed or os.getpid() != self._owner_pid:
            return
        self._closed = True
        with self._lock:
            self._stop_locked()
            hold = self._take_hold_locked()
        self._let_go(hold)
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for t in self._threads:
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def stop_nowait(self) -> None:
        """What a finalizer may call (the NOTE above, 2): never blocks."""
        if os.getpid() != self._owner_pid:
            return
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._stop_locked()
                hold = self._take_hold_locked()
            finally:
                self._lock.release()
            self._let_go(hold)
        else:
            self._stopping = True  # seen by each thread within CHECK_INTERVAL

    def _stop_locked(self) -> None:
        self._stopping = True
        for q in self._queues:
            q.clear()
        for c in self._wakeup:
            c.notify_all()
        self._reader.notify_all()

    def _take_hold_locked(self) -> Any:
        """The hold, taken once the executor stopped with no thread alive (else ``None``)."""
        if self._hold is None or not self._stopping or self._live:
            return None
        hold, self._hold = self._hold, None
        return hold

    @staticmethod
    def _let_go(hold: Any) -> None:
        if hold is not None:
            hold.__exit__(None, None, None)
