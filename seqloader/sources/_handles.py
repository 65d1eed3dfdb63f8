"""Open files kept per process: :class:`HandleCache`, the one cache of open handles of every source.

A source opens its files lazily, in each process that reads them, and never ships an open file to
another process (STYLE: file handles belong to a process). The handles differ by source: a local
file descriptor (:class:`~seqloader.sources._storage.Files`), a ``pyarrow.parquet.ParquetFile``
(:func:`~seqloader.parquet`), a ``RecordBatchFileReader`` over a memory map
(:func:`~seqloader.arrow_ipc`). The bookkeeping is the same, and is here once: per process
(rebuilt after ``fork``, dropped when pickled: :class:`~seqloader.sources._process.ProcessLocal`),
at most ``capacity`` handles by key (a file number; ``(file, thread)`` for a handle that must not be
read from two threads at once, such as a ``ParquetFile``), the least recently used one dropped first.

A handle that needs closing (``close=``: a descriptor) is *leased* while it is read through
(:meth:`HandleCache.lease`): when it leaves the cache under a reader, the last reader closes it.
Closing it under a reader would let its number be reused for another file, and the reader would
return the other file's bytes. Handles without ``close`` (pyarrow objects) are released by the
garbage collector when the last reference goes; :meth:`HandleCache.get` is enough for them.
"""

from __future__ import annotations

import collections
import functools
import threading
from typing import Any, Callable, Generic, Hashable, Optional, TypeVar

from seqloader.sources._process import ProcessLocal

__all__ = ["MAX_OPEN", "HandleCache", "Lease"]

#: Handles a source keeps open per process by default (least recently used ones are dropped).
MAX_OPEN = 64

V = TypeVar("V")


class _Entry(Generic[V]):
    """One open handle: its value, its readers, and whether it has left the cache."""

    __slots__ = ("value", "users", "evicted")

    def __init__(self, value: V):
        self.value, self.users, self.evicted = value, 0, False


class _Open(Generic[V]):
    """One process's handles (the value of the :class:`HandleCache`'s ``ProcessLocal``)."""

    def __init__(self, close: Optional[Callable[[V], None]]):
        self.entries: collections.OrderedDict[Hashable, _Entry[V]] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.close = close
        self.leftover: list[_Entry[V]] = []  # evicted while leased: closed by their last reader

    def __del__(self) -> None:  # the source (or this process's copy of it) is gone
        if self.close is not None:
            for entry in [*self.entries.values(), *self.leftover]:
                try:
                    self.close(entry.value)
                except OSError:
                    pass


class Lease(Generic[V]):
    """A handle held open while it is read through: ``with cache.lease(k, open_) as handle:``."""

    __slots__ = ("_open", "_entry")

    def __init__(self, state: _Open[V], entry: _Entry[V]):
        self._open, self._entry = state, entry

    def __enter__(self) -> V:
        return self._entry.value

    def __exit__(self, *exc: Any) -> None:
        state, entry = self._open, self._entry
        with state.lock:
            entry.users -= 1
            last = entry.users <= 0 and entry.evicted
            if last:
                state.leftover.remove(entry)
        if last and state.close is not None:
            state.close(entry.value)


class HandleCache(Generic[V]):
    """Per process, at most ``capacity`` open handles by key (a file number); see the module docstring.

    Args:
        capacity: handles kept open per process.
        close: closes a handle that leaves the cache (``None``: the garbage collector does).

    Example:
        >>> opened = []
        >>> cache = HandleCache(capacity=2, close=lambda h: print("closed", h))
        >>> def opener(k):
        ...     return lambda: opened.append(k) or f"file{k}"
        >>> cache.get(0, opener(0)), cache.get(0, opener(0)), opened   # opened once
        ('file0', 'file0', [0])
        >>> with cache.lease(1, opener(1)) as h:
        ...     _ = cache.get(2, opener(2))   # file0 leaves the cache; file1 is leased, stays
        closed file0
        >>> with cache.lease(1, opener(1)) as h:   # an edge case: evicted while leased
        ...     _ = cache.get(3, opener(3))   # file2 leaves; then file1, closed when the lease ends
        ...     _ = cache.get(4, opener(4))
        ...     print("reading", h)
        closed file2
        reading file1
        closed file1
    """

    def __init__(self, capacity: int = MAX_OPEN, close: Optional[Callable[[V], None]] = None):
        self.capacity = capacity
        self._close = close
        self._local: ProcessLocal[_Open[V]] = ProcessLocal(functools.partial(_Open, close))

    def _entry(self, k: Hashable, open_: Callable[[], V], lease: bool) -> _Entry[V]:
        state = self._local.get()
        with state.lock:
            entry = state.entries.get(k)
            if entry is not None:
                state.entries.move_to_end(k)
                entry.users += lease
                return entry
        value = open_()  # outside the lock: opening may read a footer
        closing: list[_Entry[V]] = []
        with state.lock:
            entry = state.entries.get(k)
            if entry is None:
                entry = state.entries[k] = _Entry(value)
            else:  # another thread opened it meanwhile: keep theirs
                state.entries.move_to_end(k)
                closing.append(_Entry(value))
            entry.users += lease
            while len(state.entries) > self.capacity:
                old = state.entries.popitem(last=False)[1]
                if old.users > 0:
                    old.evicted = True
                    state.leftover.append(old)  # closed by its last reader
                else:
                    closing.append(old)
        if self._close is not None:
            for old in closing:
                self._close(old.value)
        return entry

    def get(self, k: Hashable, open_: Callable[[], V]) -> V:
        """The handle of key ``k`` in this process, opened by ``open_()`` when it is not open.

        For handles without ``close``: one with ``close`` may be closed as soon as another file is
        opened, so read through it under :meth:`lease`.
        """
        return self._entry(k, open_, lease=False).value

    def lease(self, k: Hashable, open_: Callable[[], V]) -> Lease[V]:
        """The handle of key ``k``, held open until the ``with`` block ends (see the module docstring)."""
        return Lease(self._local.get(), self._entry(k, open_, lease=True))

    def __len__(self) -> int:
        """Handles open in this process (leased ones that left the cache not counted)."""
        return len(self._local.get().entries)

    def leased(self) -> int:
        """Handles held by a lease in this process now, those that left the cache included."""
        state = self._local.get()
        with state.lock:
            return sum(e.users > 0 for e in state.entries.values()) + len(state.leftover)
