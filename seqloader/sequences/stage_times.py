"""Opt-in timing of a pipeline's stages in one process (``DataLoader(profile_stages=True)``).

A :class:`StageTimes` sums, per stage name (``"fetch"``, ``"collate"``, ``"smap(decode)"``, ...),
the seconds spent inside that stage *exclusive* of the stages nested in it: an ``smap`` read
inside the dataset's ``__getitem__`` counts for the ``smap``, not twice. Code that can be timed
asks :func:`current` for the collecting instance (``None`` when nobody collects) and brackets
its work with :meth:`StageTimes.begin` and :meth:`StageTimes.end`.

Who collects is one module attribute, :data:`ACTIVE`, so a hook costs one attribute check when
timing is off. It is set by whoever owns the process's work: the loader's worker set-up for the
whole life of a worker process (:func:`enable`), or the loader around each batch it computes in
the main process at ``num_workers=0`` (:func:`collecting`). It never leaks into a child process:
a forked child starts with nothing active (``os.register_at_fork``), a spawned one imports this
module afresh. Only the thread that enabled it is timed; other threads (a source's read pool)
fall inside whichever stage waits for them.
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
_ident = threading.get_ident


class StageTimes:
    """Seconds per stage, exclusive of nested stages; see the module docstring.

    Example:
        >>> t = StageTimes()
        >>> outer = t.begin(); inner = t.begin(); t.end("inner", inner); t.end("outer", outer)
        >>> sorted(t.take()), t.take()  # take() empties it
        (['inner', 'outer'], {})
    """

    __slots__ = ("seconds", "owner", "_inner")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.owner = _ident()  # the only thread whose stages are timed
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


#: The instance collecting in this process, or ``None`` (timing off: every hook's one check).
ACTIVE: Optional[StageTimes] = None


def current() -> Optional[StageTimes]:
    """The collecting :class:`StageTimes` if this thread is timed, else ``None``.

    Example:
        >>> current() is None
        True
        >>> with collecting(StageTimes()) as t:
        ...     current() is t
        True
    """
    times = ACTIVE
    return times if times is not None and times.owner == _ident() else None


def enable(times: Optional[StageTimes] = None) -> StageTimes:
    """Time this process's stages (in this thread) from now on, into ``times`` (or a new one)."""
    global ACTIVE
    ACTIVE = times if times is not None else StageTimes()
    return ACTIVE


def disable() -> None:
    """Stop timing in this process."""
    global ACTIVE
    ACTIVE = None


@contextlib.contextmanager
def collecting(times: StageTimes) -> Iterator[StageTimes]:
    """Time this thread's stages into ``times`` inside the block; what was active before comes back."""
    global ACTIVE
    saved, ACTIVE = ACTIVE, times
    times.owner = _ident()
    try:
        yield times
    finally:
        ACTIVE = saved


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=disable)
