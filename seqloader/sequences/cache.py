"""A bounded cache of the items last read from an expensive sequence: :func:`add_cache`.

The one op with per-item mutable state, which its name says (STYLE.md). The state is per process:
it is never pickled (a worker starts with an empty cache of its own) and a forked child, which sees
its parent's cache with another pid, starts a new one instead of reusing the parent's lock, which
another thread may have held at the fork. Items are computed outside the lock, so threads that read
different items compute them in parallel; threads that read the same item wait for the first one.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from typing import Any, Generic, Sequence, TypeVar

from seqloader.errors import check_positive_int
from seqloader.sequences._util import check_sequence, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage

__all__ = ["add_cache"]

T = TypeVar("T")


class _Pending(Generic[T]):
    """An item being computed by one thread; other readers of the same item wait on ``done``."""

    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: T | None = None


class _State(Generic[T]):
    """The cache of one process: recently read items (least recently read first) and the items
    being computed, both guarded by ``lock``."""

    __slots__ = ("pid", "lock", "items", "pending")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.items: collections.OrderedDict[int, T] = collections.OrderedDict()
        self.pending: dict[int, _Pending[T]] = {}


class _Cache(LazySequence[T]):
    def __init__(self, seq: Sequence[T], cache_size: int):
        self._len = check_sequence("add_cache", "seq", seq)
        self._cache_size = check_positive_int("add_cache", "cache_size", cache_size)
        if self._cache_size > sys.maxsize:
            raise ValueError(f"add_cache: cache_size must be < 2**63 (got {self._cache_size})")
        self._seq = seq
        self._state: _State[T] = _State()


    def _position_stage(self) -> Stage:
        return Stage("add_cache", {}, (self._seq,))

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> T:
        state = self._state
        if state.pid != os.getpid():  # a forked child: a cache (and a lock) of its own
            state = self._state = _State()
        while True:
            with state.lock:
                if i in state.items:
                    state.items.move_to_end(i)
                    return state.items[i]
                pending = state.pending.get(i)
                if pending is None:  # this thread computes item i
                    mine: _Pending[T] = _Pending()
                    state.pending[i] = mine
                    break
            pending.done.wait()
            if pending.ok:
                return pending.value  # type: ignore[return-value]  # ok: the value of seq[i]
            # the other thread's computation raised: compute here, and raise its error here
        try:
            value = read(self._seq, i)
        except BaseException:
            with state.lock:
                del state.pending[i]
            mine.done.set()
            raise
        with state.lock:
            del state.pending[i]
            state.items[i] = value
            while len(state.items) > self._cache_size:
                state.items.popitem(last=False)
        mine.value, mine.ok = value, True
        mine.done.set()
        return value

    def __getstate__(self) -> dict[str, Any]:
        return {"seq": self._seq, "cache_size": self._cache_size, "len": self._len}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._seq, self._cache_size, self._len = state["seq"], state["cache_size"], state["len"]
        self._state = _State()

    def __repr__(self) -> str:
        return f"add_cache(cache_size={self._cache_size}, len={self._len})"


def add_cache(seq: Sequence[T], cache_size: int = 1) -> LazySequence[T]:
    """Keep the ``cache_size`` items of ``seq`` read last, so that reading one again costs nothing.

    For an expensive lazy stage read several times in a row: each item of ``unbatch(batches, k)``
    reads its whole batch, so ``unbatch(add_cache(batches), k)`` computes each batch once; a
    function given to ``smap`` twice (``smap(f, c, c[::-1])``) reads ``c`` once per item.

    A cache never changes a value, only when it is computed: ``add_cache(seq)[i]`` is ``seq[i]``
    (the same object while it is cached, so do not mutate items read from a cache). The least
    recently read item is evicted first, and errors are not cached. The cache belongs to one
    process: a copy sent to a worker (pickled, or forked) starts empty and caches for that worker
    alone. Reads from several threads (``prefetch(..., method="thread")``) are safe; a thread
    that reads an item another thread is computing waits for it instead of computing it again.

    Args:
        seq: the sequence to cache.
        cache_size: how many items to keep, a positive int (default 1).

    Returns:
        A lazy sequence of ``len(seq)`` items: the items of ``seq``.

    Raises:
        TypeError: ``seq`` is not a sequence or ``cache_size`` is not an int.
        ValueError: ``cache_size`` is below 1 or ``2**63`` or more.

    Example:
        >>> calls = []
        >>> def work(x):
        ...     calls.append(x)
        ...     return x * 2
        >>> from seqloader import smap
        >>> c = add_cache(smap(work, range(5)), cache_size=2)
        >>> c[3], c[3], c[-2], c[4], c[3], calls   # c[-2] is c[3]: computed once
        (6, 6, 6, 8, 6, [3, 4])
        >>> add_cache(range(5), cache_size=0)
        Traceback (most recent call last):
        ValueError: add_cache: cache_size must be a positive int (got 0)
    """
    return _Cache(seq, cache_size)
