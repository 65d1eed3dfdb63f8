"""Several threads inside one worker process: jobs run ``threads`` at a time (SPDL's
"multi-threading in a subprocess", Grain's read threads per worker process).

A worker process with ``WorkerConfig.threads > 1`` hands each :class:`~seqloader.prefetcher.processes.messages.Job`
to a :class:`Runner` instead of computing it in its message loop. The runner's threads take jobs
in the order they came, skip a job whose generation is older than the newest the worker has seen
(replying ``Cancelled``, as the loop does), compute the others into their own slots (one slot per
job: threads never share one) and send each reply as soon as it is ready, so replies come out of
order. Decoders that release the GIL (pyarrow, PIL, numpy, torch) then run in parallel inside the
process while the training process only receives. The state the threads share (the queue, the
stop flag) is behind one lock, and the result pipe is written by one thread at a time.

Each thread calls ``thread_init_fn(worker_id, thread)`` first when one is given (the loader
installs a per-thread ``WorkerInfo`` and per-thread generators there); :meth:`Runner.wait_ready`
returns once every thread has done so, or raises the first error, so a failing set-up is
reported as the worker's set-up failure, before any job. A thread cannot be killed:
at :meth:`Runner.stop` the queued jobs are dropped, and a thread inside a long job finishes it
alone while the process exits (the threads are daemons).

What is running is never a guess: each thread announces a job before computing it (the worker
sends :class:`~seqloader.prefetcher.processes.messages.Began`), so when the process dies the
parent knows every job it was computing. When that was several, the parent cannot tell which one
ended the process, so a replacement computes each of them with ``Job.alone``: the runner starts
such a job only when no other job runs, and starts no other job until it is done. A death during
it is then that job's alone (the healing NOTE in :mod:`seqloader.prefetcher.processes.executor`).
Jobs start in the order they came, an ``alone`` job included.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Optional

__all__ = ["Runner"]

#: How long an idle runner thread waits before it checks the stop flag again (seconds).
IDLE_CHECK = 0.25


class Runner:
    """``threads`` threads computing jobs for one worker process; see the module docstring.

    Args:
        threads: how many, ``>= 2``.
        work: ``work(job, seq)`` computes a job and sends its reply (called in a runner thread).
        worker_id: passed to ``thread_init_fn``.
        thread_init_fn: ``thread_init_fn(worker_id, thread)`` run first in each thread, or ``None``.
        on_error: called with an exception ``work`` raised (it reports the worker as failed);
            the thread then stops.
    """

    def __init__(self, threads: int, work: Callable[[Any, Any], None], worker_id: int,
                 thread_init_fn: Optional[Callable[[int, int], None]], on_error: Callable[[str, BaseException], None]):
        self._work, self._worker_id, self._init, self._on_error = work, worker_id, thread_init_fn, on_error
        self._cv = threading.Condition(threading.Lock())
        self._queue: collections.deque = collections.deque()  # (job, seq)
        self._stopping = False
        self._active = 0  # jobs being computed
        self._exclusive = False  # an ``alone`` job is being computed
        self._starting = threads  # threads whose thread_init_fn has not returned
        self._init_error: Optional[BaseException] = None
        self._threads = [threading.Thread(target=self._run, args=(t,), name=f"seqloader-worker-{worker_id}-{t}",
                                          daemon=True) for t in range(threads)]
        for t in self._threads:
            t.start()

    def wait_ready(self, check: Callable[[], bool]) -> None:
        """Wait until every thread ran ``thread_init_fn``, checking ``check()`` (the parent is
        alive) every :data:`IDLE_CHECK` seconds; raise the first set-up error (or ``RuntimeError``
        when ``check()`` fails)."""
        with self._cv:
            while self._starting and self._init_error is None:
                if not check():
                    raise RuntimeError("seqloader worker: the parent process is gone")
                self._cv.wait(IDLE_CHECK)
            if self._init_error is not None:
                raise self._init_error

    def put(self, job: Any, seq: Any) -> None:
        """Queue ``job`` of ``seq`` (the sequence the worker read when the job came)."""
        with self._cv:
            self._queue.append((job, seq))
            self._cv.notify()

    def stop(self) -> None:
        """Drop the queued jobs and tell the threads to exit (never waits for a running job)."""
        with self._cv:
            self._stopping = True
            self._queue.clear()
            self._cv.notify_all()

    def _next(self) -> Optional[tuple[Any, Any]]:
        """The next job to start (the oldest queued), once it may start: an ``alone`` job when no
        other runs, any job when no ``alone`` one runs; ``None`` once stopping."""
        with self._cv:
            while True:
                if self._stopping:
                    return None
                if self._queue and not self._exclusive and (self._active == 0 or
                                                            not getattr(self._queue[0][0], "alone", False)):
                    job, seq = self._queue.popleft()
                    self._active += 1
                    self._exclusive = bool(getattr(job, "alone", False))
                    return job, seq
                self._cv.wait(IDLE_CHECK)

    def _finished(self) -> None:
        with self._cv:
            self._active -= 1
            self._exclusive = False
            self._cv.notify_all()

    def _run(self, thread: int) -> None:
        try:
            if self._init is not None:
                self._init(self._worker_id, thread)
        except BaseException as exc:  # raised by wait_ready in the worker's main thread
            with self._cv:
                self._init_error = self._init_error or exc
                self._cv.notify_all()
            return
        with self._cv:
            self._starting -= 1
            self._cv.notify_all()
        try:
            while True:
                got = self._next()
                if got is None:
                    return
                try:
                    self._work(*got)
                finally:
                    self._finished()
        except BaseException as exc:  # reported; the worker process then exits
            with self._cv:
                stopping, self._stopping = self._stopping, True
                self._queue.clear()
                self._cv.notify_all()
            if not stopping:  # (after stop(), the process is exiting and its pipes closing)
                self._on_error("computing a job", exc)
