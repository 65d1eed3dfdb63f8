"""Columnar sources (Parquet, Arrow IPC): decoded blocks, rows, and the columnar fast path.

A subclass supplies its index and ``_read_blocks(blocks) -> list[pyarrow.Table]``. This base
turns each decoded block into numpy columns once (zero-copy where Arrow allows), keeps the last
``cache_blocks`` of them per process, and answers:

* ``src[i]``: a row, ``{column: value}`` (numpy scalars; arrays for list columns), or
  ``transform(row)``;
* ``src.__getitems__(positions)``: a list of rows, or, with ``columnar=True``, one dict of
  column arrays in the order of ``positions`` (sliced out of the decoded blocks with one numpy
  ``take`` per column and block). ``torch.utils.data.default_convert`` turns that dict into
  tensors without a per-row step, so ``collate_fn=default_convert`` is the matching collate.

A decoded block must hold as many rows as the index says (a footer that promises other counts
than its pages hold is refused, naming the file and the block), and an error raised while
decoding one keeps its type and gains a note naming the file and the block.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Sequence, cast

import numpy as np

from seqloader.errors import add_note, annotate, check_positive_int, note_stage
from seqloader.sequences._util import check_bool, check_callable, fname
from seqloader.sources._process import ProcessLocal
from seqloader.sources.base import Positions, Source, group_by_block

__all__ = ["TableSource", "to_numpy"]


def to_numpy(column: Any) -> np.ndarray:
    """A pyarrow (chunked) array as numpy: zero-copy for primitive columns without nulls, a 2-D
    array for fixed-size lists, an object array otherwise (str, bytes, lists, structs, nulls).

    Example:
        >>> import pyarrow as pa
        >>> to_numpy(pa.array([1, 2])).tolist(), to_numpy(pa.array([1, None])).tolist()
        ([1, 2], [1, None])
        >>> to_numpy(pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0]), 2)).shape
        (2, 2)
    """
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks != 1:  # (combine_chunks copies even a single chunk: avoid it)
            parts = [to_numpy(c) for c in column.chunks]
            if parts and all(p.dtype != object for p in parts):
                return np.concatenate(parts) if parts else np.empty(0)
            out = np.empty(len(column), dtype=object)
            out[:] = [x for p in parts for x in p] if parts else []
            return out
        column = column.chunk(0)
    arr = column
    typ = arr.type
    if t.is_fixed_size_list(typ) and arr.null_count == 0 and (t.is_integer(typ.value_type)
                                                               or t.is_floating(typ.value_type)):
        flat = arr.flatten()
        if flat.null_count == 0:
            return cast(np.ndarray, flat.to_numpy().reshape(len(arr), typ.list_size))
    if arr.null_count == 0 and (t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ)
                                or t.is_temporal(typ)):
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))
    if t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ) or (
            (t.is_list(typ) or t.is_large_list(typ)) and arr.null_count == 0):
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))
    out = np.empty(len(arr), dtype=object)
    out[:] = arr.to_pylist()
    return out


class _Cache:
    """Per process: decoded blocks (block -> {column: array}), least recently used first."""

    def __init__(self) -> None:
        self.blocks: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.counters = {"blocks_decoded": 0, "bytes_decoded": 0, "items_read": 0}


class TableSource(Source[Any]):
    """Shared by :func:`~seqloader.parquet` and :func:`~seqloader.arrow_ipc` (see the module docstring)."""

    _op = "table"
    _block_word = "block"

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
        self._cache: ProcessLocal[_Cache] = ProcessLocal(_Cache)

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
        """This process's counts: blocks decoded, their bytes (Arrow's ``nbytes``), items read."""
        return dict(self._cache.get().counters)

    def _decoded(self, blocks: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
        """Numpy columns of ``blocks`` (decoded at most once while they stay in the cache)."""
        cache = self._cache.get()
        with cache.lock:
            out = {}
            for b in blocks:
                cols = cache.blocks.get(b)
                if cols is not None:
                    cache.blocks.move_to_end(b)
                    out[b] = cols
        missing = [b for b in blocks if b not in out]
        if missing:
            tables = self._read_blocks(missing)
            for b, table in zip(missing, tables):
                want = int(self._index.ends[b] - self._index.starts[b])
                if table.num_rows != want:
                    raise ValueError(f"{self._op}: {self._block_name(b)} holds {table.num_rows} rows but the file's "
                                     f"footer says {want}; the file is corrupt: write it again")
            with cache.lock:
                for b, table in zip(missing, tables):
                    cols = {name: to_numpy(table.column(name)) for name in self._schema_names}
                    cache.counters["blocks_decoded"] += 1
                    cache.counters["bytes_decoded"] += int(table.nbytes)
                    cache.blocks[b] = out[b] = cols
                    while len(cache.blocks) > self._cache_blocks:
                        cache.blocks.popitem(last=False)
        return out

    def _row(self, cols: dict[str, np.ndarray], r: int) -> dict[str, Any]:
        # a row of a 2-D column is copied: a view would keep the block alive and be read-only
        return {name: col[r] if col.ndim == 1 else col[r].copy() for name, col in cols.items()}

    def _item(self, i: int) -> Any:
        b, r = self._index.locate([i])
        row = self._row(self._decoded([int(b[0])])[int(b[0])], int(r[0]))
        self._cache.get().counters["items_read"] += 1
        if self._transform is None:
            return row
        try:
            with annotate(self, i):
                return self._transform(row)
        except Exception as exc:
            add_note(exc, f"{self._op}: row {int(r[0])} of {self._block_name(int(b[0]))}")
            raise

    def _items(self, positions: Positions) -> Any:
        blocks, rows = self._index.locate(positions)
        groups = group_by_block(blocks)
        decoded = self._decoded([b for b, _ in groups])
        self._cache.get().counters["items_read"] += int(positions.size)
        if self._columnar:
            return self._columns_of(decoded, groups, rows, positions.size)
        out: list[Any] = [None] * positions.size
        for b, where in groups:
            cols = decoded[b]
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

    def _columns_of(self, decoded: dict[int, Any], groups: list[Any], rows: Positions, n: int) -> dict[str, np.ndarray]:
        if len(groups) == 1:
            cols = decoded[groups[0][0]]
            return {name: col[rows] for name, col in cols.items()}
        picks = [(decoded[b], where, rows[where]) for b, where in groups]
        out = {}
        for name in self._schema_names:
            first = picks[0][0][name]
            same = all(cols[name].dtype == first.dtype for cols, _, _ in picks)
            dst = np.empty((n, *first.shape[1:]) if same else n, dtype=first.dtype if same else object)
            for cols, where, r in picks:
                dst[where] = cols[name][r]
            out[name] = dst
        return out

    def _repr_args(self) -> str:
        extra = ", columnar=True" if self._columnar else ""
        if self._transform is not None:
            extra += f", transform={fname(self._transform)}"
        return f"files={len(self._files)}, blocks={self._index.num_blocks}{extra}, len={len(self)}"
