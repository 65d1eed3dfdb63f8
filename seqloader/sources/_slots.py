"""Where a process's decoded blocks live: one buffer per column, one slot per block, one ``take`` per batch.

The arena (:mod:`seqloader.sources._arena`) gives each block it decodes one of ``capacity``
slot numbers. :class:`Slots` keeps, per column, one numpy array of ``capacity * rows`` rows
(``rows``: the most rows a block holds), allocated on the first block that needs it; block
``b`` in slot ``s`` is copied to rows ``[s * rows, s * rows + len(b))`` (a copy the decoding
thread makes without the GIL, once per block). A batch spanning several blocks of the arena is
then one ``numpy.take`` per column of those buffers, with positions ``s * rows + row``, instead
of one gather per block and column and a scatter into the batch.

A column goes in the buffers when its values are numbers, booleans or times (1-D), or rows of
one length (2-D, see :func:`~seqloader.sources._table.to_numpy`), and the block agrees with the
buffer's dtype and row shape; anything else (strings, ragged lists, a block of other dtype, or
a block without a slot) stays as decoded, and a batch reading it is gathered block by block. A
source whose blocks differ much in size (the largest more than twice the mean) uses no buffers:
they would waste more memory than they save time.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, cast

import numpy as np

from seqloader.sources._arena import Arena

__all__ = ["Block", "Slots", "slot_rows"]


class Block:
    """A decoded block: ``cols`` (name -> array: a view of the buffer for the columns in
    ``slotted``), its ``slot`` (``None``: none), and its number of rows ``n``."""

    __slots__ = ("cols", "slot", "slotted", "n")

    def __init__(self, cols: dict[str, np.ndarray], slot: Optional[int], slotted: frozenset[str], n: int):
        self.cols, self.slot, self.slotted, self.n = cols, slot, slotted, n


class Slots:
    """This process's arena of decoded blocks and the column buffers behind its slots.

    Args:
        capacity: blocks kept (``cache_blocks``).
        op: the source's name, for messages.

    Example:
        >>> slots = Slots(2, op="demo")
        >>> a = slots.store({"x": np.array([1, 2, 3])}, slot=1, rows=3)
        >>> b = slots.store({"x": np.array([7, 8])}, slot=0, rows=3)
        >>> a.slotted, slots.take("x", [a, b], np.array([0, 1, 0]), np.array([2, 1, 0])).tolist()
        (frozenset({'x'}), [3, 8, 1])
        >>> slots.take("x", [a, Block({"x": np.array([5])}, None, frozenset(), 1)], np.array([0]), np.array([0]))
    """

    def __init__(self, capacity: int, op: str):
        self.arena: Arena[Block] = Arena(capacity, op)
        self.capacity = capacity
        self.rows: Optional[int] = None   # rows per slot: set by the first store (every store passes the same)
        self._buffers: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def _buffer(self, name: str, like: np.ndarray, rows: int) -> np.ndarray | None:
        """The buffer of column ``name`` (allocated like ``like``'s rows), or ``None`` if ``like``
        cannot go there (object dtype, more than 2-D, another dtype or row shape)."""
        if like.dtype.hasobject or like.ndim > 2 or rows == 0 or len(like) > rows:
            return None
        with self._lock:
            self.rows = rows
            buf = self._buffers.get(name)
            if buf is None:
                buf = self._buffers[name] = np.empty((self.capacity * rows, *like.shape[1:]), like.dtype)
        return buf if buf.dtype == like.dtype and buf.shape[1:] == like.shape[1:] else None

    def store(self, cols: dict[str, np.ndarray], slot: Optional[int], rows: int) -> Block:
        """Block of ``cols``, copied into the buffers at ``slot`` where they fit (called by the
        decoding thread: the arena has reserved the slot for it). ``rows``: rows per slot (see
        :func:`slot_rows`; 0: no buffers), the same in every call."""
        n = len(next(iter(cols.values()))) if cols else 0
        if slot is None:
            return Block(cols, None, frozenset(), n)
        out, slotted = dict(cols), []
        for name, col in cols.items():
            buf = self._buffer(name, col, rows)
            if buf is not None:
                view = buf[slot * rows:slot * rows + n]
                np.copyto(view, col)
                out[name] = view
                slotted.append(name)
        return Block(out, slot, frozenset(slotted), n)

    def take(self, name: str, blocks: list[Block], which: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
        """Column ``name`` at rows ``rows[i]`` of blocks ``blocks[which[i]]``: one ``take`` from the
        column's buffer, or ``None`` when a block does not hold the column there."""
        if self.rows is None or not all(name in b.slotted for b in blocks):
            return None
        base = np.fromiter((b.slot for b in blocks), dtype=np.int64, count=len(blocks)) * self.rows
        return cast(np.ndarray, np.take(self._buffers[name], base[which] + rows, axis=0))


def slot_rows(lengths: Any) -> int:
    """Rows per slot for blocks of ``lengths`` rows: the largest, or 0 (no buffers) when it is more
    than twice the mean of the non-empty blocks.

    Example:
        >>> slot_rows([100, 100, 37]), slot_rows([1000, 10, 10, 10]), slot_rows([])
        (100, 0, 0)
    """
    a = np.asarray(lengths, dtype=np.int64)
    a = a[a > 0]
    if not a.size:
        return 0
    top = int(a.max())
    return top if top * a.size <= 2 * int(a.sum()) else 0
