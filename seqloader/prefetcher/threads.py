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

Shutdown, fork, the hold of ``worker_init_fn.while_workers_live()`` and its ``thread_ended``
hook follow the engine's NOTE [thread shutdown] in :mod:`seqloader.threads.engine` (the executor
is an adapter over its :class:`~seqloader.threads.engine.Runtime`): ``close()`` joins against
:data:`CLOSE_TIMEOUT` (1), the owner's finalizer calls :meth:`ThreadExecutor.stop_nowait` (2), a
thread that ends is reported :class:`~seqloader.prefetcher.executor.Died` (3), a forked child
reads with :meth:`ThreadExecutor.forked` (4), a ``worker_init_fn`` with a
``while_workers_live()`` method (the loader's: torch's ``get_worker_info`` made thread-aware) has
the context manager it returns entered by ``launch`` and held while the threads live (5), and
one with a ``thread_ended(worker_id)`` method (the loader's stage timing) has it called last in
each worker thread, ``worker_init_fn`` failed or not (6).

An item's ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit``) is its outcome like any error; the reader reports it as a ``RuntimeError``
naming the item (:func:`seqloader.prefetcher.inbox.item_exit_error`), as for worker processes,
so it never ends the training process.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Optional, Sequence, cast

from seqloader.prefetcher.executor import Died, Done, Event, SetupFailed, Started
from seqloader.sequences import stage_times
from seqloader.threads.engine import CHECK_INTERVAL, CLOSE_TIMEOUT, Job, Outcome, Runtime, Sink

__all__ = ["CHECK_INTERVAL", "CLOSE_TIMEOUT", "ThreadExecutor"]


class ThreadExecutor:
    """``num_workers`` threads of this process (see the module docstring).

    Args:
        num_workers: threads, ``>= 1``.
        worker_init_fn: ``worker_init_fn(worker_id)``, run first in each thread, or ``None``; with a
            ``while_workers_live()`` method, its context manager is held while the threads live
            (the engine's NOTE, 5).
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
        self._rt = Runtime(name, num_workers, lanes=num_workers, init=worker_init_fn, on_setup=self._set_up,
                           on_exit=getattr(worker_init_fn, "thread_ended", None))
        self._sink = _Replies()
        self._seq: Sequence[Any] = ()
        self._closed = False
        self._held = False  # while_workers_live() entered once already (never again)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- starting ----------------------------------------------------------------------------------

    def launch(self, seq: Sequence[Any], gen: int) -> None:
        self._enter_hold()
        with self._rt.lock:
            self._seq, self._sink.latest = seq, max(self._sink.latest, gen)
            for w in range(self.num_workers):
                self._rt.start_locked(w)

    def _enter_hold(self) -> None:
        """Enter ``worker_init_fn.while_workers_live()``, once (the engine's NOTE, 5)."""
        lifetime = getattr(self._init, "while_workers_live", None)
        if lifetime is None or self._held or self._rt.stopping:
            return
        hold = lifetime()
        hold.__enter__()
        self._held = True
        self._rt.keep(hold)

    def _set_up(self, w: int, error: Optional[BaseException]) -> None:
        self._sink.events.append(Started(w) if error is None else SetupFailed(w, "worker_init_fn", error))

    def replace(self, worker: int, seq: Sequence[Any]) -> None:
        with self._rt.lock:
            self._seq = seq
            gone = self._rt.clear(worker)
            self._rt.start_locked(worker)
        del gone

    # -- jobs --------------------------------------------------------------------------------------

    def accepting(self, worker: int) -> bool:
        return not self._rt.stopping

    def submit(self, worker: int, gen: int, index: int) -> None:
        with self._rt.lock:
            self._sink.latest = max(self._sink.latest, gen)
            fn = functools.partial(_compute, worker, gen, index, self._seq)
            self._rt.push([Job(self._sink, gen, index, fn, lane=worker)])

    def new_generation(self, gen: int) -> None:
        """Skip the queued jobs of older generations now (each reported done, unread)."""
        with self._rt.lock:
            self._sink.latest = max(self._sink.latest, gen)
            gone = self._rt.purge(self._sink)
            self._rt.done.notify_all()
        del gone

    def reset(self, seq: Sequence[Any], gen: int) -> None:
        with self._rt.lock:
            self._seq = seq
            self._sink.latest = max(self._sink.latest, gen)

    # -- the reader's side -----------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Event]:
        sink = self._sink
        with self._rt.lock:
            if not sink.events and not self._rt.stopping:
                self._rt.done.wait(timeout)
            events, sink.events = sink.events, []
            if not events:
                events = [Died(w) for w in self._rt.ended()]
        return events

    def forked(self) -> "ThreadExecutor":
        """A fresh executor with the same settings, for a forked child (the engine's NOTE, 4)."""
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
        """Stop the threads (the engine's NOTE, 1); idempotent."""
        if self._closed or os.getpid() != self._rt.pid:
            return
        self._closed = True
        self._rt.stop(CLOSE_TIMEOUT)

    def stop_nowait(self) -> None:
        """What a finalizer may call (the engine's NOTE, 2): never blocks."""
        if os.getpid() != self._rt.pid:
            return
        self._closed = True
        self._rt.stop_nowait()


class _Replies(Sink):
    """The executor's side of its jobs: the newest generation and the events for the reader."""

    def __init__(self) -> None:
        self.latest = -1  # the newest generation submitted
        self.events: list[Event] = []

    def wants(self, job: Job) -> bool:
        return job.gen >= self.latest

    def start(self, job: Job) -> bool:
        if job.gen >= self.latest:
            return True
        self.events.append(Done(job.lane, job.gen, job.key, None))  # skipped: done, unread
        return False

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:
        if outcome.error is None:
            self.events.append(cast(Done, outcome.value))
        else:  # (_compute catches every error of the item; this is a backstop)
            self.events.append(Done(job.lane, job.gen, job.key, (False, outcome.error)))

    def discarded(self, jobs: list[Job]) -> None:
        self.events.extend(Done(job.lane, job.gen, job.key, None) for job in jobs)


def _compute(w: int, gen: int, index: int, seq: Sequence[Any]) -> Done:
    """Worker ``w``'s job: ``seq[index]`` as a :class:`Done`, timed; its error is its outcome."""
    times = stage_times.current()
    start, cpu = time.perf_counter_ns(), time.thread_time()
    try:
        outcome: tuple[bool, Any] = (True, seq[index])
    except BaseException as exc:  # the job's outcome; never kills the thread
        outcome = (False, exc)
    seconds, cpu = (time.perf_counter_ns() - start) * 1e-9, time.thread_time() - cpu
    stages = () if times is None else tuple(times.take().items())
    return Done(w, gen, index, outcome, seconds, stages, cpu, start)
