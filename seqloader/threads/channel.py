"""``Channel``: jobs keyed by an int under a generation number (the engine of the thread prefetch)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Generic, TypeVar

from seqloader.errors import check_int
from seqloader.threads.engine import CHECK_INTERVAL, Job, Outcome, Runtime, Sink
from seqloader.threads.pool import ThreadPool

__all__ = ["Channel"]

R = TypeVar("R")


class Channel(Sink, Generic[R]):
    """Jobs keyed by an int under a generation number, read back by key; one reader.

    :meth:`submit` queues ``fn`` for ``key`` in the current generation; :meth:`collect` waits for
    a key's outcome and removes it; :meth:`retarget` starts a new generation: queued jobs of
    older generations are removed unread (never called) and outcomes of running ones are
    discarded when they finish. The channel keeps its pool alive; close the pool to stop it.

    Args:
        pool: the pool whose threads run the jobs.

    Example:
        >>> with ThreadPool(2) as pool:
        ...     ch = Channel(pool)
        ...     ch.submit(7, lambda: "seven")
        ...     ch.collect(7, timeout=None).value, ch.generation, ch.retarget()
        ('seven', 1, 2)
        >>> ch.collect(7, timeout=None)
        Traceback (most recent call last):
        ValueError: ThreadPool(num_threads=2, name='seqloader-thread'): collect after close(); create a new ThreadPool
    """

    def __init__(self, pool: ThreadPool):
        if not isinstance(pool, ThreadPool):
            raise TypeError(f"Channel: pool must be a ThreadPool (got {type(pool).__name__})")
        self._pool = pool
        self._rt: Runtime | None = None
        self._gen = 0
        self._outcomes: dict[int, Outcome[R]] = {}
        self._queued: set[int] = set()
        self._running: dict[int, threading.Thread] = {}

    def _runtime(self, op: str) -> Runtime:
        rt = self._pool._runtime(op)
        if rt is not self._rt:  # first use, or the first call in a forked child: start empty
            self._rt = rt
            self._gen += 1
            self._outcomes, self._queued, self._running = {}, set(), {}
        return rt

    # -- Sink, under the lock --------------------------------------------------------------------

    def wants(self, job: Job) -> bool:
        return job.gen == self._gen

    def start(self, job: Job) -> bool:
        if job.gen != self._gen:
            return False
        self._queued.discard(job.key)
        self._running[job.key] = threading.current_thread()
        return True

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:
        if job.gen == self._gen:
            del self._running[job.key]
            self._outcomes[job.key] = outcome

    # -- the reader's side ------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The current generation (it also changes on the first call after a fork)."""
        self._runtime("generation")
        return self._gen

    def submit(self, key: int, fn: Callable[[], R]) -> None:
        """Queue ``fn()`` as the job of ``key`` in the current generation.

        Raises:
            ValueError: ``key`` is already queued, running or uncollected in this generation, or
                the pool is closed.
        """
        key = check_int("Channel.submit", "key", key)
        rt = self._runtime("submit")
        with rt.lock:
            if key in self._queued or key in self._running or key in self._outcomes:
                raise ValueError(f"Channel.submit: key {key} is already pending in generation {self._gen}")
            self._queued.add(key)
            rt.push([Job(self, self._gen, key, fn)])

    def retarget(self) -> int:
        """Start a new generation and return its number; nothing pending survives it."""
        rt = self._runtime("retarget")
        with rt.lock:
            self._gen += 1
            old = self._outcomes
            self._outcomes, self._queued, self._running = {}, set(), {}
            gone = rt.purge(self)
        del old, gone
        return self._gen

    def thread_of(self, key: int) -> str | None:
        """The name of the thread computing ``key`` now, or ``None``."""
        rt = self._runtime("thread_of")
        with rt.lock:
            t = self._running.get(key)
            return None if t is None else t.name

    def collect(self, key: int, timeout: float | None) -> Outcome[R] | None:
        """Wait for the outcome of ``key`` and remove it; ``None`` if ``timeout`` seconds pass first.

        Raises:
            KeyError: ``key`` was not submitted in this generation (or was collected already).
            ValueError: the pool is closed (also while waiting).
            RuntimeError: the thread running the job, or every thread of the pool, is gone.
        """
        rt = self._runtime("collect")
        deadline = None if timeout is None else time.monotonic() + timeout
        with rt.lock:
            while key not in self._outcomes:
                if rt.stopping:
                    raise ValueError(f"{self._pool!r}: closed while waiting for item {key}")
                running = self._running.get(key)
                if running is None and key not in self._queued:
                    raise KeyError(f"Channel.collect: key {key} is not pending in generation {self._gen}")
                wait_s = CHECK_INTERVAL if deadline is None else min(CHECK_INTERVAL, deadline - time.monotonic())
                if wait_s <= 0:
                    return None
                if not rt.done.wait(wait_s) and key not in self._outcomes:
                    if running is not None and not running.is_alive() or not rt.has_live_thread():
                        raise RuntimeError(f"{self._pool!r}: the thread for item {key} is gone")
            return self._outcomes.pop(key)
