"""Where a process's decoded blocks live: one buffer per column, one slot per block, one ``take`` per batch.

The arena (:mod:`seqloader.sources._arena`) gives each block it decodes one of ``capacity``
slot numbers. :class:`Slots` keeps, per column, one numpy array of ``capacity * rows`` rows
(``rows``: the most rows a block holds), allocated on the first block that needs it; block
``b`` in slot ``s`` is copied to rows ``[s * rows, s * rows + len(b))`` (a copy the decoding
thread makes without the GIL, once per block), and ``base[b] = s * rows`` is noted in an array
of one int per block of the source. A columnar batch (:meth:`Slots.gather`) is then, per column,
one native call: ``numpy.take(buffer, base[blocks] + rows, axis=0, mode="clip")``, written
straight into the array the batch holds (``mode="clip"``: numpy's default ``"raise"`` gathers
into a scratch buffer and copies it; the positions are in range by construction), whatever
the number of blocks the batch spans, into an array reused once the training loop has dropped
the batch it was (:mod:`seqloader.sources._batch_buffers`: pages already touched; a column under
:data:`POOLED_BYTES` is allocated instead). The Python per batch is a few numpy calls, none per row
or per block; ``benchmarks/threads.py`` measures it (``threads_parquet``, "Python per batch").

A column goes in the buffers when its values are numbers, booleans or times (1-D), or rows of
one length (2-D, see :func:`~seqloader.sources._to_numpy.to_numpy`), and the block agrees with the
buffer's dtype and row shape; anything else (strings, ragged lists, a block of other dtype, or
a block without a slot) stays as decoded, and a batch reading it is gathered block by block. A
source whose blocks differ much in size (the largest more than twice the mean) uses no buffers:
they would waste more memory than they save time.

**Shared buffers.** A ``Slots(shared=True)`` allocates its column buffers in memory that other
processes can map: an anonymous file (``os.memfd_create``; it has no name, so nothing is left in
``/dev/shm`` by a crash), its descriptor kept (:meth:`Slots.shared_buffers`) so that decode
processes (:mod:`seqloader.prefetcher.decoders`) are sent it and write decoded blocks straight
into their slots; :meth:`Slots.store` then takes the columns ``written`` there as views, and
copies the rest. :meth:`Slots.unshare` closes the descriptors (the mappings, and the views of
them, stay valid).
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from typing import Any, Optional

import numpy as np

from seqloader.sources._arena import Arena
from seqloader.sources._batch_buffers import BatchBuffers

__all__ = ["POOLED_BYTES", "Block", "Slots", "slot_rows"]

#: A gathered column of at least this many bytes goes into a reused array
#: (:mod:`seqloader.sources._batch_buffers`); a smaller one is allocated (glibc serves it from its
#: free lists, without ``mmap`` or page faults).
POOLED_BYTES = 32 << 10


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
        >>> a = slots.store({"x": np.array([1, 2, 3])}, slot=1, rows=3, block=4, num_blocks=6)
        >>> b = slots.store({"x": np.array([7, 8])}, slot=0, rows=3, block=2, num_blocks=6)
        >>> a.slotted, slots.gather(["x"], {4: a, 2: b}, [2, 4], np.array([4, 2, 4]), np.array([2, 1, 0]))["x"].tolist()
        (frozenset({'x'}), [3, 8, 1])
        >>> c = Block({"x": np.array([5])}, None, frozenset(), 1)             # a block without a slot
        >>> slots.gather(["x"], {4: a, 5: c}, [4, 5], np.array([5, 4]), np.array([0, 0]))["x"].tolist()
        [5, 1]
    """

    def __init__(self, capacity: int, op: str, counters: Optional[dict[str, int]] = None, shared: bool = False):
        self.arena: Arena[Block] = Arena(capacity, op, counters)
        self.capacity, self.op = capacity, op
        self.rows: Optional[int] = None   # rows per slot: set by the first store (every store passes the same)
        self._buffers: dict[str, np.ndarray] = {}
        self._base: Optional[np.ndarray] = None   # per block of the source: its first row in the buffers
        #: the arrays batches are gathered into, reused once released
        self.buffers = BatchBuffers()
        self._lock = threading.Lock()
        #: column -> (key, descriptor) of a shared buffer; ``None``: buffers are private memory
        self._shared: Optional[dict[str, tuple[int, int]]] = {} if shared else None

    @property
    def shared(self) -> bool:
        """Whether new buffers go in memory other processes can map (until :meth:`unshare`)."""
        return self._shared is not None

    def shared_buffers(self) -> dict[str, tuple[int, int, str, tuple[int, ...]]]:
        """Column -> ``(key, fd, dtype, shape)`` of each shared buffer (``key``: unique while the
        buffer lives), for the processes that write blocks into them."""
        with self._lock:
            shared = dict(self._shared or {})
            return {name: (key, fd, self._buffers[name].dtype.str, self._buffers[name].shape)
                    for name, (key, fd) in shared.items()}

    def unshare(self) -> None:
        """Close the shared buffers' descriptors (no process is sent them any more); their memory
        stays mapped here while a view of it lives. New buffers are private memory."""
        with self._lock:
            shared, self._shared = self._shared or {}, None
        for _, fd in shared.values():
            os.close(fd)

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised buffer (under the lock): private, or in an anonymous shared file."""
        if self._shared is None:
            return np.empty(shape, dtype)
        fd = _anonymous_file(f"seqloader-{self.op}-{name}", _nbytes(shape, dtype))
        self._shared[name] = (next(_KEYS), fd)
        return shared_array(fd, shape, dtype)

    def _buffer(self, name: str, like: np.ndarray, rows: int) -> np.ndarray | None:
        """The buffer of column ``name`` (allocated like ``like``'s rows), or ``None`` if ``like``
        cannot go there (object dtype, more than 2-D, another dtype or row shape)."""
        if like.dtype.hasobject or like.ndim > 2 or rows == 0 or len(like) > rows:
            return None
        with self._lock:
            self.rows = rows
            buf = self._buffers.get(name)
            if buf is None:
                buf = self._buffers[name] = self._allocate(name, (self.capacity * rows, *like.shape[1:]), like.dtype)
        return buf if fits(buf, like, rows) else None

    def store(self, cols: dict[str, np.ndarray], slot: Optional[int], rows: int, block: int = 0,
              num_blocks: int = 1, written: tuple[str, ...] = (), n: Optional[int] = None) -> Block:
        """Block ``block`` (of ``num_blocks``) of ``cols``, copied into the buffers at ``slot`` where
        they fit (called by the decoding thread: the arena has reserved the slot for it). ``rows``:
        rows per slot (see :func:`slot_rows`; 0: no buffers), the same in every call. ``written``:
        columns another process already wrote at ``slot`` of the shared buffers (``n`` rows)."""
        if n is None:
            n = len(next(iter(cols.values()))) if cols else 0
        if slot is None:
            return Block(cols, None, frozenset(), n)
        out, slotted = dict(cols), list(written)
        for name in written:
            out[name] = self._buffers[name][slot * rows:slot * rows + n]
        for name, col in cols.items():
            buf = self._buffer(name, col, rows)
            if buf is not None:
                view = buf[slot * rows:slot * rows + n]
                np.copyto(view, col)
                out[name] = view
                slotted.append(name)
        if slotted:
            with self._lock:
                if self._base is None:
                    self._base = np.zeros(num_blocks, dtype=np.int64)
            # (written before the arena publishes the block; read only while it is pinned)
            self._base[block] = slot * rows
        return Block(out, slot, frozenset(slotted), n)

    def gather(self, names: list[str], decoded: dict[int, Block], keys: list[int], blocks: np.ndarray,
               rows: np.ndarray) -> dict[str, np.ndarray]:
        """Columns ``names`` at rows ``rows[i]`` of blocks ``blocks[i]`` (``keys``: the distinct
        blocks, all in ``decoded`` and pinned): per column one ``take``, from the block itself
        when the batch reads one block, else from the column's buffer; a column some block does
        not hold in the buffers is gathered block by block."""
        if len(keys) == 1:
            return {name: self._take(col, rows) for name, col in decoded[keys[0]].cols.items()}
        parts = [decoded[b] for b in keys]
        slotted = parts[0].slotted.intersection(*[p.slotted for p in parts])   # (one C call for the batch)
        index: Optional[np.ndarray] = None
        out = {}
        for name in names:
            if self._base is not None and name in slotted:
                if index is None:
                    index = self._base[blocks] + rows
                out[name] = self._take(self._buffers[name], index)
            else:
                which = np.searchsorted(np.asarray(keys), blocks)
                out[name] = _gather([p.cols[name] for p in parts], which, rows, int(blocks.size))
        return out


    def _take(self, col: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``col[index]`` (rows), written into a reused array of :attr:`buffers` when it is large
        (:data:`POOLED_BYTES`: a small one comes from the allocator's free lists, cheaper than a
        search of the pool)."""
        if col.dtype.hasobject:
            return np.take(col, index, axis=0)
        if col.nbytes // max(len(col), 1) * index.size < POOLED_BYTES:   # (bytes per row x rows)
            return np.take(col, index, axis=0, mode="clip")
        out = self.buffers.empty((index.size, *col.shape[1:]), col.dtype)
        return np.take(col, index, axis=0, out=out, mode="clip")


_KEYS = itertools.count(1)   # (keys of shared buffers: unique in this process)


def fits(buf: np.ndarray, col: np.ndarray, rows: int) -> bool:
    """Whether a block's column ``col`` goes in the slot buffer ``buf`` of ``rows`` rows per slot.

    Example:
        >>> buf = np.zeros((6, 2), np.int32)
        >>> fits(buf, np.ones((3, 2), np.int32), 3), fits(buf, np.ones((3, 2), np.int64), 3), fits(buf, np.ones((4, 2), np.int32), 3)
        (True, False, False)
    """
    return len(col) <= rows and buf.dtype == col.dtype and buf.shape[1:] == col.shape[1:]


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)


def shared_array(fd: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` over a mapping of the shared file ``fd`` (the mapping
    keeps its own descriptor: ``fd`` may be closed after)."""
    dtype = np.dtype(dtype)
    return np.ndarray(shape, dtype, buffer=mmap.mmap(fd, _nbytes(shape, dtype)))


def _anonymous_file(name: str, nbytes: int) -> int:
    """A descriptor of a new shared file of ``nbytes`` (sparse) that has no name in any file system."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def _gather(parts: list[np.ndarray], which: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """Row ``rows[i]`` of ``parts[which[i]]`` for each ``i``, block by block: one array when the
    parts agree on dtype and row shape, else an object array of rows."""
    first = parts[0]
    same = all(p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts)
    dst = np.empty((n, *first.shape[1:]) if same else n, dtype=first.dtype if same else object)
    for k, col in enumerate(parts):
        where = np.flatnonzero(which == k)
        if same or col.ndim == 1:
            dst[where] = col[rows[where]]
        else:  # (rows of another length than another block's: one object per row)
            for w, row in zip(where.tolist(), col[rows[where]]):
                dst[w] = row
    return dst
