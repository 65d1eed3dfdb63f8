"""``ThreadPool``: at most ``num_threads`` daemon threads of this process, and its ordered ``map``."""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import Any, Callable, Iterable, TypeVar, cast

from seqloader.errors import add_note, check_positive_int
from seqloader.threads.engine import CHECK_INTERVAL, CLOSE_TIMEOUT, Job, Outcome, Runtime, Sink

__all__ = ["ThreadPool"]

T = TypeVar("T")
R = TypeVar("R")


def _fname(fn: Callable[..., object]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return str(name).rsplit("<locals>.", 1)[-1]


class _MapCall(Sink):
    """The bookkeeping of one :meth:`ThreadPool.map` call."""

    def __init__(self, n: int):
        self.results: list[Outcome[Any] | None] = [None] * n
        self.first_error = n  # the smallest index that failed so far
        self.outstanding = n  # jobs neither finished nor dropped
        self.cancelled = False

    def wants(self, job: Job) -> bool:
        return not self.cancelled and job.key < self.first_error

    def start(self, job: Job) -> bool:
        if self.wants(job):
            return True
        self.outstanding -= 1
        return False

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:
        self.outstanding -= 1
        self.results[job.key] = outcome
        if outcome.error is not None and job.key < self.first_error:
            self.first_error = job.key

    def discarded(self, jobs: list[Job]) -> None:
        self.outstanding -= len(jobs)


class ThreadPool:
    """At most ``num_threads`` daemon threads of this process, started on first use.

    See :mod:`seqloader.threads` for fork and pickling and the NOTE in
    :mod:`seqloader.threads.engine` for shutdown. A pool may be used from
    several threads at once; :meth:`map` called from one of the pool's own threads (a nested map)
    runs its items in that thread, one after another, instead of waiting for a free thread.

    Args:
        num_threads: the most calls running at once, ``>= 1``.
        name: the threads are named ``f"{name}-{k}"``.

    Raises:
        TypeError: ``num_threads`` is not an int or ``name`` is not a non-empty str.
        ValueError: ``num_threads < 1``.

    Example:
        >>> with ThreadPool(4) as pool:
        ...     pool.map(abs, [-3, 1, -2])
        ...     pool.map(abs, [])
        [3, 1, 2]
        []
        >>> pool.map(abs, [1])
        Traceback (most recent call last):
        ValueError: ThreadPool(num_threads=4, name='seqloader-thread'): map after close(); create a new ThreadPool
    """

    def __init__(self, num_threads: int, *, name: str = "seqloader-thread"):
        self._num_threads = check_positive_int("ThreadPool", "num_threads", num_threads)
        if not isinstance(name, str) or not name:
            raise TypeError(f"ThreadPool: name must be a non-empty str (got {type(name).__name__} {name!r})")
        self._name = name
        self._runtimes: dict[int, Runtime] = {}  # pid -> runtime; setdefault makes creation race-free
        self._closed = False

    def _runtime(self, op: str) -> Runtime:
        if self._closed:
            raise ValueError(f"{self!r}: {op} after close(); create a new ThreadPool")
        pid = os.getpid()
        rt = self._runtimes.get(pid)
        if rt is None:
            for other in list(self._runtimes):  # a parent's runtime, inherited through fork: never touched
                if other != pid:
                    self._runtimes.pop(other, None)
            fresh = Runtime(self._name, self._num_threads, elastic=True)
            rt = self._runtimes.setdefault(pid, fresh)
            if rt is fresh:
                weakref.finalize(self, fresh.stop_nowait)
        return rt

    @property
    def num_threads(self) -> int:
        return self._num_threads

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (or the pool's owner was garbage-collected)."""
        return self._closed

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]``, with at most ``num_threads`` calls running at once.

        When calls raise, the error of the first failing item *in item order* is re-raised (the
        one the list comprehension would raise) with its type and message, and a note naming the
        item's index and the thread; queued items after it are not started. ``map`` returns or
        raises only once none of its calls is running (on ``KeyboardInterrupt``: at once, with
        its queued items dropped).

        Args:
            fn: called as ``fn(item)`` in a pool thread.
            items: an iterable, read in full before anything is queued.

        Returns:
            The results, in item order.

        Raises:
            TypeError: ``fn`` is not callable.
            ValueError: the pool is closed (also while waiting).
            RuntimeError: the pool's threads are gone (not expected; never a hang).
            BaseException: the first failing item's own exception, with a note.

        Example:
            >>> def inverse(x):
            ...     return 1 / x
            >>> with ThreadPool(2) as pool:
            ...     pool.map(inverse, [1, 2, 4])
            ...     try:
            ...         pool.map(inverse, [1, 0, 2, 0])
            ...     except ZeroDivisionError as exc:
            ...         print(exc, "|", exc.__notes__[0].split(" (thread")[0])
            [1.0, 0.5, 0.25]
            division by zero | seqloader: raised in ThreadPool.map(inverse) at item 1
        """
        if not callable(fn):
            raise TypeError(f"ThreadPool.map: fn must be callable (got {type(fn).__name__} {fn!r})")
        items = list(items)
        rt = self._runtime("map")
        if not items:
            return []
        if threading.current_thread() in rt.threads:
            return self._map_inline(fn, items)
        call = _MapCall(len(items))
        jobs = [Job(call, 0, k, functools.partial(fn, x)) for k, x in enumerate(items)]
        del items
        gone: list[list[Job]] = []
        with rt.lock:
            rt.push(jobs)
            del jobs
            try:
                purged_at = len(call.results)
                while call.outstanding:
                    if rt.stopping:
                        raise ValueError(f"{self!r}: closed while map was waiting; create a new ThreadPool")
                    if call.first_error < purged_at:
                        purged_at = call.first_error
                        gone.append(rt.purge(call))
                        continue
                    if not rt.done.wait(CHECK_INTERVAL) and call.outstanding and not rt.has_live_thread():
                        raise RuntimeError(f"{self!r}: every thread of the pool is gone with {call.outstanding} "
                                           "items of map unfinished")
            except BaseException:
                call.cancelled = True
                gone.append(rt.purge(call))
                raise
        gone.clear()
        failed = call.results[call.first_error] if call.first_error < len(call.results) else None
        if failed is not None and failed.error is not None:
            exc = failed.error
            add_note(exc, f"seqloader: raised in ThreadPool.map({_fname(fn)}) at item {call.first_error} "
                          f"(thread {failed.thread})")
            raise exc
        return [cast(R, out.value) for out in call.results if out is not None]  # all finished, none failed

    def _map_inline(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        out = []
        for k, x in enumerate(items):
            try:
                out.append(fn(x))
            except BaseException as exc:
                add_note(exc, f"seqloader: raised in ThreadPool.map({_fname(fn)}) at item {k} "
                              f"(thread {threading.current_thread().name}, nested map run inline)")
                raise
        return out

    def close(self) -> None:
        """Stop the threads; idempotent. Queued jobs are dropped unread; running ones finish.

        Joins the threads against one deadline of :data:`CLOSE_TIMEOUT` seconds (see the NOTE in
        :mod:`seqloader.threads.engine`); a thread still inside a call then is left to finish it and exit.

        Example:
            >>> pool = ThreadPool(2)
            >>> pool.map(len, ["ab", ""])
            [2, 0]
            >>> pool.close(); pool.close(); pool.closed
            True
        """
        self._closed = True
        rt = self._runtimes.get(os.getpid())
        if rt is not None:
            rt.stop(CLOSE_TIMEOUT)

    def stop_nowait(self) -> None:
        """Mark the pool closed and tell its threads to stop, without waiting: what an owner's
        ``weakref.finalize`` may call (the gc path must never block; see the NOTE in
        :mod:`seqloader.threads.engine`)."""
        self._closed = True
        rt = self._runtimes.get(os.getpid())
        if rt is not None:
            rt.stop_nowait()

    def __enter__(self) -> ThreadPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} owns threads and cannot be pickled; an object that holds a pool drops it "
                        "in __getstate__ and makes a new one when it first needs it")

    def __repr__(self) -> str:
        return f"ThreadPool(num_threads={self._num_threads}, name={self._name!r})"
