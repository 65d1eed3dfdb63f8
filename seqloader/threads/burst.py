"""``Burst``: calls run in the background on at most ``num_threads`` threads that end when idle.

A source that decodes ahead of need (:mod:`seqloader.sources._arena`, ``Arena.ahead``) hands each
block's decode to a burst: the call returns at once, a thread of this process runs it. Threads
start as calls are queued, up to ``num_threads``, and each ends as soon as no call is queued, so
between bursts (and after the last) no thread waits for work. Outcomes are not collected: a call
reports its own result (the arena publishes a decoded block, or its error, to the threads that
wait for it). The engine's NOTE [thread shutdown] (:mod:`seqloader.threads.engine`) applies:
``close()`` drops queued calls and joins, the interpreter's exit joins, a forked child's copy is
inert (the owner makes a new burst there: an arena is per process).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from seqloader.errors import check_positive_int
from seqloader.threads.engine import Job, Outcome, Runtime, Sink

__all__ = ["Burst"]


class _Unread(Sink):
    """Outcomes nobody reads: each call reports its own (see the module docstring)."""

    def finished(self, job: Job, outcome: Outcome[Any]) -> None:
        pass


class Burst:
    """Run calls in the background on at most ``num_threads`` daemon threads (see the module docstring).

    Example:
        >>> import threading
        >>> done = threading.Event()
        >>> burst = Burst("demo", 2)
        >>> burst.submit(done.set)
        >>> done.wait(10), burst.idle(10)    # the call ran, and its thread ended
        (True, True)
        >>> burst.close()
    """

    def __init__(self, name: str, num_threads: int):
        self.num_threads = check_positive_int("Burst", "num_threads", num_threads)
        self._rt = Runtime(name, self.num_threads, elastic=True, idle_exit=True)
        self._sink = _Unread()
        weakref.finalize(self, self._rt.stop_nowait)

    def submit(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn()``; a thread starts for it unless one is free to take it."""
        with self._rt.lock:
            if not self._rt.stopping:
                self._rt.push([Job(self._sink, 0, 0, fn)])

    def idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no call is queued or running and every thread has
        ended; whether that happened (for tests and for ``close``)."""
        for t in list(self._rt.threads):
            if t is not None:
                t.join(timeout)
        with self._rt.lock:
            return not any(self._rt.queues) and self._rt.active == 0 and not self._rt.has_live_thread()

    def close(self) -> None:
        """Drop the queued calls and join the threads (the engine's NOTE, 1); idempotent."""
        self._rt.stop()
