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
reported as the worker's set-up failure, before any job. The runner is an adapter over the thread
engine's :class:`~seqloader.threads.engine.Runtime`; its shutdown is the engine's NOTE
[thread shutdown] in :mod:`seqloader.threads.engine`, without the join: at :meth:`Runner.stop`
the queued jobs are dropped, and a thread inside a long job finishes it alone while the process
exits (the threads are daemons).

What is running is never a guess: each thread announces a job before computing it (the worker
sends :class:`~seqloader.prefetcher.processes.messages.Began`), so when the process dies the
parent knows every job it was computing. When that was several, the parent cannot tell which one
ended the process, so a replacement computes each of them with ``Job.alone``: the runner starts
such a job only when no other job runs, and starts no other job until it is done. A death during
it is then that job's alone (the healing NOTE in :mod:`seqloader.prefetcher.processes.executor`).
Jobs start in the order they came, an ``alone`` job included.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from seqloader.threads.engine import Job, Runtime, Sink

__all__ = ["Runner"]

#: How long :meth:`Runner.wait_ready` waits before it checks the parent is alive again (seconds).
IDLE_CHECK = 0.25


class Runner:
    """``threads`` threads computing jobs for one worker process; see the module docstring.

    Args:
        threads: how many, ``>= 2``.
        work: ``work(job, seq)`` computes a job and sends its reply (called in a runner thread).
        worker_id: passed to ``thread_init_fn``.
        thread_init_fn: ``thread_init_fn(worker_id, thread)`` run first in each thread, or ``None``.
        on_error: called with an exception ``work`` raised (it reports the worker as failed);
            the threads then stop.
    """

    def __init__(self, threads: int, work: Callable[[Any, Any], None], worker_id: int,
                 thread_init_fn: Optional[Callable[[int, int], None]], on_error: Callable[[str, BaseException], None]):
        self._work, self._on_error = work, on_error
        init = None if thread_init_fn is None else functools.partial(thread_init_fn, worker_id)
        self._rt = Runtime(f"seqloader-worker-{worker_id}", threads, init=init)
        self._sink = Sink()
        with self._rt.lock:
            for t in range(threads):
                self._rt.start_locked(t)

    def wait_ready(self, check: Callable[[], bool]) -> None:
        """Wait until every thread ran ``thread_init_fn``, checking ``check()`` (the parent is
        alive) every :data:`IDLE_CHECK` seconds; raise the first set-up error (or ``RuntimeError``
        when ``check()`` fails)."""
        rt = self._rt
        with rt.lock:
            while rt.starting and rt.setup_error is None:
                if not check():
                    raise RuntimeError("seqloader worker: the parent process is gone")
                rt.done.wait(IDLE_CHECK)
            if rt.setup_error is not None:
                raise rt.setup_error

    def put(self, job: Any, seq: Any) -> None:
        """Queue ``job`` of ``seq`` (the sequence the worker read when the job came)."""
        fn = functools.partial(self._run, job, seq)
        with self._rt.lock:
            self._rt.push([Job(self._sink, job.gen, job.index, fn, alone=bool(getattr(job, "alone", False)))])

    def stop(self) -> None:
        """Drop the queued jobs and tell the threads to exit (never waits for a running job)."""
        self._rt.halt()

    def _run(self, job: Any, seq: Any) -> None:
        try:
            self._work(job, seq)
        except BaseException as exc:  # reported; the threads stop and the worker process exits
            if not self._rt.halt():  # (after stop(), the process is exiting and its pipes closing)
                self._on_error("computing a job", exc)
