"""Columnar sources (Parquet, Arrow IPC): decoded blocks, rows, and the columnar fast path.

A subclass supplies its index and ``_read_blocks(blocks) -> list[pyarrow.Table]``. This base
turns each decoded block into numpy columns once (zero-copy where Arrow allows; see
:func:`to_numpy`), keeps the last ``cache_blocks`` of them per process in an
:class:`~seqloader.sources._arena.Arena` shared by the process's threads (a block is decoded
once even when several threads need it at once, and different blocks decode in parallel), and
answers:

* ``src[i]``: a row, ``{column: value}`` (numpy scalars; arrays for list columns), or
  ``transform(row)``;
* ``src.__getitems__(positions)``: a list of rows, or, with ``columnar=True``, one dict of
  column arrays in the order of ``positions`` (sliced out of the decoded blocks with one numpy
  ``take`` per column and block, no Python step per row). A list column whose rows all have
  the same length (and a fixed-size list) is a 2-D array, so
  ``torch.utils.data.default_convert`` turns the dict into tensors, a token column into one
  ``(batch, length)`` tensor: ``collate_fn=default_convert`` is the matching collate.

How many blocks to keep (``cache_blocks``): a block shuffle (``BlockShuffleSampler(window=w)``)
reads the ``w`` blocks of one window at a time in each lane, and with ``lanes`` equal to the
loader's ``num_workers`` each worker reads its own lane, one window after another. So:

* worker processes: ``cache_blocks >= w`` (each process has its own arena and lane);
* ``threads_per_worker=k``: ``>= 2 * w`` (the threads of a process read the batches of its lane:
  while some finish a window, others begin the next);
* thread workers (``worker_method="thread"``, one arena for every lane):
  ``>= w * (num_workers + 1)``: a window per thread, and one for the thread that moves on to its
  next window while the others read theirs (with ``w * num_workers`` the least recently used
  blocks evicted then can be another thread's current window, decoded again).

Fewer, and a window's blocks are decoded again while it is read.

A decoded block must hold as many rows as the index says (a footer that promises other counts
than its pages hold is refused, naming the file and the block), and an error raised while
decoding one keeps its type and gains a note naming the file and the block.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, cast

import numpy as np

from seqloader.errors import add_note, annotate, check_positive_int, note_stage
from seqloader.sequences._util import check_bool, check_callable, fname
from seqloader.sources._slots import Block, Slots, slot_rows
from seqloader.sources._process import ProcessLocal
from seqloader.sources.base import Positions, Source, group_by_block

__all__ = ["TableSource", "to_numpy"]


def to_numpy(column: Any) -> np.ndarray:
    """A pyarrow (chunked) array as numpy: zero-copy for primitive columns without nulls; a 2-D
    array for fixed-size lists and for lists whose rows all have the same length (of integers or
    floats, without nulls: zero-copy of the values); an object array otherwise (str, bytes,
    ragged lists, structs, nulls).

    Example:
        >>> import pyarrow as pa
        >>> to_numpy(pa.array([1, 2])).tolist(), to_numpy(pa.array([1, None])).tolist()
        ([1, 2], [1, None])
        >>> to_numpy(pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0]), 2)).shape
        (2, 2)
        >>> tokens = to_numpy(pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.int32())))
        >>> tokens.dtype, tokens.shape
        (dtype('int32'), (2, 3))
        >>> ragged = to_numpy(pa.array([[1, 2, 3], [4]]))     # rows of different lengths
        >>> ragged.dtype, [r.tolist() for r in ragged]
        (dtype('O'), [[1, 2, 3], [4]])
    """
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks != 1:  # (combine_chunks copies even a single chunk: avoid it)
            parts = [to_numpy(c) for c in column.chunks]
            if parts and all(p.dtype != object and p.shape[1:] == parts[0].shape[1:] and p.dtype == parts[0].dtype
                             for p in parts):
                return np.concatenate(parts)
            return _rows_of(parts, len(column))
        column = column.chunk(0)
    arr = column
    typ = arr.type
    square = _square(arr)
    if square is not None:
        return square
    if arr.null_count == 0 and (t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ)
                                or t.is_temporal(typ)):
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))
    if t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ) or (
            (t.is_list(typ) or t.is_large_list(typ)) and arr.null_count == 0 and arr.flatten().null_count == 0):
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))   # (a list with a null value goes by to_pylist: None, not NaN)
    out = np.empty(len(arr), dtype=object)
    out[:] = arr.to_pylist()
    return out


def _square(arr: Any) -> np.ndarray | None:
    """A list array of numbers without nulls whose rows all have one length, as a 2-D array (a
    view of Arrow's values); else ``None``."""
    import pyarrow.types as t

    typ = arr.type
    fixed = t.is_fixed_size_list(typ)
    if not (fixed or t.is_list(typ) or t.is_large_list(typ)) or arr.null_count or not len(arr):
        return None
    if not (t.is_integer(typ.value_type) or t.is_floating(typ.value_type)):
        return None
    if fixed:
        width = typ.list_size
    else:
        offsets = arr.offsets.to_numpy()
        width = int(offsets[1] - offsets[0])
        if int(offsets[-1] - offsets[0]) != width * len(arr) or (
                len(arr) > 2 and not (np.diff(offsets) == width).all()):
            return None
    flat = arr.flatten()
    if flat.null_count:
        return None
    return cast(np.ndarray, flat.to_numpy().reshape(len(arr), width))


def _rows_of(parts: list[np.ndarray], n: int) -> np.ndarray:
    """The rows of ``parts`` (1-D or 2-D arrays) as one object array of ``n`` rows."""
    out = np.empty(n, dtype=object)
    i = 0
    for p in parts:
        for r in range(len(p)):  # (element by element: a 2-D part must give rows, not be broadcast)
            out[i] = p[r]
            i += 1
    return out


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


class TableSource(Source[Any]):
    """Shared by :func:`~seqloader.parquet` and :func:`~seqloader.arrow_ipc` (see the module docstring)."""

    _op = "table"
    _block_word = "block"
    #: copy decoded blocks into the process's slot buffers (:mod:`seqloader.sources._slots`); a
    #: source whose blocks are views of a memory map keeps them there instead
    _slot_buffers = True

    _schema_names: list[str]  # the columns read, set by the subclass once the files' schemas are known
    _where: list[tuple[int, int]]  # per block: (file, block of that file)

    def _init_output(self, columns: Sequence[str] | None, transform: Callable[..., Any] | None, columnar: bool,
                     cache_blocks: int) -> None:
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"{self._op}: columns must be a list of column names or None (got {columns!r})")
        check_callable(self._op, "transform", transform, allow_none=True)
        self._columnar = check_bool(self._op, "columnar", columnar)
        if columnar and transform is not None:
            raise TypeError(f"{self._op}: transform is called on rows and columnar=True returns batches of "
                            "columns; transform the batch in the loader's collate_fn instead")
        self._columns = None if columns is None else list(columns)
        self._transform = transform
        self._cache_blocks = check_positive_int(self._op, "cache_blocks", cache_blocks)
        self._slots: ProcessLocal[Slots] = ProcessLocal(functools.partial(Slots, self._cache_blocks, self._op))
        self._rows_per_slot: int | None = None   # slot_rows of the index, computed on first use

    @property
    def columns(self) -> list[str]:
        """The columns read, in order."""
        return list(self._schema_names)

    def _read_blocks(self, blocks: list[int]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _block_name(self, b: int) -> str:
        """``"row group 3 of /data/part-0.parquet"``: block ``b``, for messages."""
        k, g = self._where[b]
        return f"{self._block_word} {g} of {self._files.infos[k].path}"

    def _noted(self, exc: BaseException, b: int) -> BaseException:
        """``exc`` with a note naming block ``b`` and its file (unless its message names the file)."""
        k, _ = self._where[b]
        if self._files.infos[k].path not in str(exc):
            add_note(exc, f"{self._op}: while reading {self._block_name(b)}")
        return exc

    def counters(self) -> dict[str, int]:
        """This process's counts: blocks decoded, their bytes (Arrow's ``nbytes``), blocks a thread
        took from another thread's decode (``blocks_waited``), items read."""
        return self._slots.get().arena.counters()

    def _pinned(self, blocks: Sequence[int], items: int = 0) -> Any:
        """``with self._pinned(blocks) as decoded:`` ``{block: Block}``, decoded at most once while
        they stay in the arena, and not reused while the ``with`` block runs (``items``: items read)."""
        return self._slots.get().arena.pinned(blocks, self._decode, self._block_name, items)

    def _decode(self, blocks: list[int], slots: list[int | None]) -> list[tuple[Block, int]]:
        """Read and convert ``blocks``, into their slots (called by the arena without its lock)."""
        if self._rows_per_slot is None:   # (threads racing here compute the same number)
            self._rows_per_slot = slot_rows(self._index.ends - self._index.starts) if self._slot_buffers else 0
        tables = self._read_blocks(blocks)
        state = self._slots.get()
        out = []
        for b, slot, table in zip(blocks, slots, tables):
            want = int(self._index.ends[b] - self._index.starts[b])
            if table.num_rows != want:
                raise ValueError(f"{self._op}: {self._block_name(b)} holds {table.num_rows} rows but the file's "
                                 f"footer says {want}; the file is corrupt: write it again")
            cols = {name: to_numpy(table.column(name)) for name in self._schema_names}
            out.append((state.store(cols, slot, self._rows_per_slot), int(table.nbytes)))
        return out

    def _row(self, cols: dict[str, np.ndarray], r: int) -> dict[str, Any]:
        # a row of a 2-D column is copied: a view would see its slot reused (and be read-only)
        return {name: col[r] if col.ndim == 1 else col[r].copy() for name, col in cols.items()}

    def _item(self, i: int) -> Any:
        b, r = self._index.locate([i])
        block = int(b[0])
        with self._pinned([block], 1) as decoded:
            row = self._row(decoded[block].cols, int(r[0]))
        if self._transform is None:
            return row
        try:
            with annotate(self, i):
                return self._transform(row)
        except Exception as exc:
            add_note(exc, f"{self._op}: row {int(r[0])} of {self._block_name(block)}")
            raise

    def _items(self, positions: Positions) -> Any:
        blocks, rows = self._index.locate(positions)
        if self._columnar:
            return self._columns_of(blocks, rows)
        groups = group_by_block(blocks)
        out: list[Any] = [None] * positions.size
        with self._pinned([b for b, _ in groups], int(positions.size)) as decoded:
            for b, where in groups:
                cols = decoded[b].cols
                for w, r in zip(where.tolist(), rows[where].tolist()):
                    out[w] = self._row(cols, r)
        if self._transform is not None:
            w = 0
            try:  # (one try for the batch rather than a context manager per row)
                for w in range(len(out)):
                    out[w] = self._transform(out[w])
            except Exception as exc:
                note_stage(exc, self, int(positions[w]))
                add_note(exc, f"{self._op}: row {int(rows[w])} of {self._block_name(int(blocks[w]))}")
                raise
        return out

    def _columns_of(self, blocks: Positions, rows: Positions) -> dict[str, np.ndarray]:
        """The batch as columns: one ``take`` per column (from its block, or from the column's slot
        buffer when the batch spans several blocks), else gathered block by block."""
        n = int(blocks.size)
        if n and blocks[0] == blocks[-1] and (blocks == blocks[0]).all():
            b = int(blocks[0])
            with self._pinned([b], n) as decoded:
                return {name: col[rows] for name, col in decoded[b].cols.items()}
        uniq = np.unique(blocks)
        which = np.searchsorted(uniq, blocks)   # (cheaper than unique's return_inverse)
        keys = uniq.tolist()
        state = self._slots.get()
        with self._pinned(keys, n) as decoded:
            parts = [decoded[b] for b in keys]
            out = {}
            for name in self._schema_names:
                col = state.take(name, parts, which, rows)
                out[name] = col if col is not None else _gather([p.cols[name] for p in parts], which, rows, n)
            return out

    def _repr_args(self) -> str:
        extra = ", columnar=True" if self._columnar else ""
        if self._transform is not None:
            extra += f", transform={fname(self._transform)}"
        return f"files={len(self._files)}, blocks={self._index.num_blocks}{extra}, len={len(self)}"
