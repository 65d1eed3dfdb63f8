"""Opt-in timing of a pipeline's stages in one process (``DataLoader(profile_stages=True)``).

A :class:`StageTimes` sums, per stage name (``"fetch"``, ``"collate"``, ``"smap(decode)"``, ...),
the seconds spent inside that stage *exclusive* of the stages nested in it: an ``smap`` read
inside the dataset's ``__getitem__`` counts for the ``smap``, not twice. Code that can be timed
asks :func:`current` for the collecting instance (``None`` when nobody collects) and brackets
its work with :meth:`StageTimes.begin` and :meth:`StageTimes.end`.

Whether anything collects is one module attribute, :data:`ACTIVE` (the number of threads that
collect, or ``None``), so a hook costs one attribute check when timing is off. Each collecting
thread has its own :class:`StageTimes` (thread-local): a worker thread's stages are its own, so
several threads computing items at once (thread workers, threads inside a worker process) are
timed each apart, and :func:`current` returns ``None`` in threads that do not collect (a source's
read pool: they fall inside whichever stage waits for them). Collecting is switched on by whoever
owns the thread's work: the loader's worker set-up for the whole life of a worker (:func:`enable`),
or the loader around each batch it computes in the main process at ``num_workers=0``
(:func:`collecting`). It never leaks into a child process: a forked child starts with nothing
active (``os.register_at_fork``), a spawned one imports this module afresh.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

__all__ = ["ACTIVE", "StageTimes", "collecting", "current", "disable", "enable"]

R = TypeVar("R")

_perf = time.perf_counter


class StageTimes:
    """Seconds per stage, exclusive of nested stages; see the module docstring.

    Example:
        >>> t = StageTimes()
        >>> outer = t.begin(); inner = t.begin(); t.end("inner", inner); t.end("outer", outer)
        >>> sorted(t.take()), t.take()  # take() empties it
        (['inner', 'outer'], {})
    """

    __slots__ = ("seconds", "_inner")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._inner = 0.0  # seconds of stages nested in the one being timed

    def begin(self) -> tuple[float, float]:
        """Start timing a stage; pass the token to :meth:`end`."""
        saved, self._inner = self._inner, 0.0
        return _perf(), saved

    def end(self, name: str, token: tuple[float, float]) -> None:
        """The stage begun with ``token`` ended: add its time less its nested stages' to ``name``."""
        start, saved = token
        spent = _perf() - start
        seconds = self.seconds
        seconds[name] = seconds.get(name, 0.0) + spent - self._inner
        self._inner = saved + spent

    def call(self, name: str, f: Callable[..., R], *args: Any) -> R:
        """``f(*args)``, timed as the stage ``name``."""
        token = self.begin()
        try:
            return f(*args)
        finally:
            self.end(name, token)

    def take(self) -> dict[str, float]:
        """The totals since the last call (and start afresh)."""
        out, self.seconds = self.seconds, {}
        return out


#: How many threads of this process collect (``None``: none; every hook's one check).
ACTIVE: Optional[int] = None
_lock = threading.Lock()
_local = threading.local()  # .times: this thread's StageTimes, if it collects


def current() -> Optional[StageTimes]:
    """The collecting :class:`StageTimes` of this thread, else ``None``.

    Example:
        >>> current() is None
        True
        >>> with collecting(StageTimes()) as t:
        ...     current() is t
        True
    """
    return getattr(_local, "times", None) if ACTIVE is not None else None


def _count(delta: int) -> None:
    global ACTIVE
    with _lock:
        n = (ACTIVE or 0) + delta
        ACTIVE = n if n > 0 else None


def enable(times: Optional[StageTimes] = None) -> StageTimes:
    """Time this thread's stages from now on, into ``times`` (or a new one)."""
    if getattr(_local, "times", None) is None:
        _count(1)
    mine = times if times is not None else StageTimes()
    _local.times = mine
    return mine


def disable() -> None:
    """Stop timing in this thread."""
    if getattr(_local, "times", None) is not None:
        _local.times = None
        _count(-1)


@contextlib.contextmanager
def collecting(times: StageTimes) -> Iterator[StageTimes]:
    """Time this thread's stages into ``times`` inside the block; what was active before comes back."""
    saved = getattr(_local, "times", None)
    if saved is None:
        _count(1)
    _local.times = times
    try:
        yield times
    finally:
        _local.times = saved
        if saved is None:
            _count(-1)


def _forget_after_fork() -> None:
    global ACTIVE, _lock, _local
    ACTIVE, _lock, _local = None, threading.Lock(), threading.local()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_forget_after_fork)
