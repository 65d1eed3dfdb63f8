"""Parquet files as a position-addressable sequence of rows: :func:`parquet`.

The index is the row count of every row group, read from the files' footers: one read per
file (a local ``pread``, or one range request for the last 64 KiB, plus one more only for a
footer larger than that), ``num_threads`` files at a time. Position ``p`` is row
``p - starts[g]`` of row group ``g`` (a bisection over the cumulative counts, vectorised over
a batch). A batch reads each of its row groups once (remote ones concurrently, one range
request per row group covering the selected columns' chunks), decodes it with pyarrow and keeps
the last ``cache_blocks`` decoded row groups per process; rows are sliced out of the decoded
columns (see :mod:`seqloader.sources._table`).
"""

from __future__ import annotations

import collections
import struct
import threading
from typing import Any, Callable, Sequence

from seqloader.sources._process import ProcessLocal, Threads, optional_import
from seqloader.sources._storage import Files, RangeFile, resolve
from seqloader.sources._table import TableSource
from seqloader.sources.base import BlockIndex

__all__ = ["parquet"]

_OP = "parquet"
_SUFFIXES = (".parquet", ".parq", ".pq")
#: Bytes read from the end of a remote file to find its footer in one request.
TAIL_BYTES = 64 * 1024


def _pq() -> Any:
    return optional_import("pyarrow.parquet", "parquet", _OP)


def _remote_footer(files: Files, k: int) -> bytes:
    """The last bytes of remote file ``k``, footer included: one request (two for a large footer)."""
    size = files.infos[k].size
    if size < 12:
        raise ValueError(f"{_OP}: {files.infos[k].path} is not a Parquet file ({size} bytes)")
    tail = files.read(k, max(0, size - TAIL_BYTES), size, check=False)  # listed a moment ago
    if tail[-4:] != b"PAR1":
        raise ValueError(f"{_OP}: {files.infos[k].path} is not a Parquet file (no PAR1 magic at its end)")
    need = struct.unpack("<i", tail[-8:-4])[0] + 8
    if need > len(tail):
        tail = files.read(k, size - need, size, check=False)
    return tail


def _read_footer(files: Files, k: int) -> Any:
    """The ``FileMetaData`` of file ``k``; errors name the file."""
    path = files.infos[k].path
    try:
        if files.remote:
            size = files.infos[k].size
            tail = _remote_footer(files, k)
            return _pq().read_metadata(RangeFile(size, [(size - len(tail), tail)]))
        files.check(k)
        return _pq().read_metadata(path)
    except (FileNotFoundError, RuntimeError):
        raise
    except Exception as exc:
        if "Parquet" in type(exc).__name__ or "magic" in str(exc).lower() or isinstance(exc, OSError):
            raise ValueError(f"{_OP}: {path} is not a readable Parquet file ({exc})") from exc
        raise


def _check_schemas(files: Files, schemas: Sequence[Any], columns: list[str] | None) -> list[str]:
    """The names of the columns read; ``ValueError`` naming both files and the column where two
    files disagree, or the file that lacks a selected column."""
    first, path0 = schemas[0], files.infos[0].path
    names = list(first.names) if columns is None else columns
    for c in names:
        if first.get_field_index(c) < 0:
            raise ValueError(f"{_OP}: column {c!r} is not in {path0} (its columns: {', '.join(first.names)})")
    for k, schema in enumerate(schemas[1:], start=1):
        path = files.infos[k].path
        if columns is None and list(schema.names) != names:
            extra = [c for c in schema.names if c not in names] or [c for c in names if c not in schema.names]
            col = extra[0] if extra else next(a for a, b in zip(names, schema.names) if a != b)
            raise ValueError(f"{_OP}: {path0} and {path} have different columns (first difference: {col!r}); "
                             "pass columns=[...] present in every file, or group files by schema")
        for c in names:
            i = schema.get_field_index(c)
            if i < 0:
                raise ValueError(f"{_OP}: column {c!r} is in {path0} but not in {path}")
            if not schema.field(i).type.equals(first.field(c).type):
                raise ValueError(f"{_OP}: column {c!r} is {first.field(c).type} in {path0} but "
                                 f"{schema.field(i).type} in {path}")
    return names


class _Open:
    """Per process: open ``ParquetFile`` objects (local files) and parsed footers (remote ones)."""

    def __init__(self) -> None:
        self.files: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self.lock = threading.Lock()


class _Parquet(TableSource):
    _op = _OP

    def __init__(self, paths: Any, columns: Sequence[str] | None, transform: Callable | None, columnar: bool,
                 cache_blocks: int, num_threads: int, storage_options: dict | None):
        self._init_output(columns, transform, columnar, cache_blocks)
        self._threads = Threads(_OP, num_threads)
        infos, protocol = resolve(_OP, paths, _SUFFIXES, storage_options)
        self._files = Files(_OP, infos, protocol, storage_options)
        metas = self._threads.map(lambda k: _read_footer(self._files, k), range(len(infos)))
        schemas = [m.schema.to_arrow_schema() for m in metas]
        self._schema_names = _check_schemas(self._files, schemas, self._columns)
        self._metas = metas if self._files.remote else None  # FileMetaData pickles (as its footer)
        counts, where = [], []
        for k, meta in enumerate(metas):
            for g in range(meta.num_row_groups):
                counts.append(meta.row_group(g).num_rows)
                where.append((k, g))
        self._index = BlockIndex(counts)
        self._where = where
        self._open: ProcessLocal[_Open] = ProcessLocal(_Open)

    def _file(self, k: int) -> Any:
        """This process's ``ParquetFile`` (local) or ``FileMetaData`` (remote) of file ``k``."""
        if self._metas is not None:
            return self._metas[k]
        state = self._open.get()
        with state.lock:
            if k in state.files:
                state.files.move_to_end(k)
                return state.files[k]
        value = _pq().ParquetFile(self._files.local_path(k))
        with state.lock:
            state.files[k] = value
            while len(state.files) > 64:
                state.files.popitem(last=False)
        return value

    def _read_local(self, b: int) -> Any:
        k, g = self._where[b]
        pf = self._file(k)
        self._files.check(k)
        return pf.read_row_group(g, columns=self._schema_names, use_threads=False)

    def _read_remote(self, b: int) -> Any:
        k, g = self._where[b]
        meta = self._file(k)
        rg = meta.row_group(g)
        spans = []
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema.split(".")[0] not in self._schema_names:
                continue
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset:
                start = min(start, col.dictionary_page_offset)
            spans.append((start, start + col.total_compressed_size))
        start, end = min(s for s, _ in spans), max(e for _, e in spans)
        size = self._files.infos[k].size
        data = self._files.read(k, start, end)
        f = RangeFile(size, [(start, data)], fetch=lambda s, e: self._files.read(k, s, e))
        return _pq().ParquetFile(f, metadata=meta).read_row_group(g, columns=self._schema_names)

    def _read_blocks(self, blocks: list[int]) -> list[Any]:
        if self._files.remote:
            return self._threads.map(self._read_remote, blocks)
        return [self._read_local(b) for b in blocks]

    def __repr__(self) -> str:
        return f"parquet({self._repr_args()})"


def parquet(paths: Any, *, columns: Sequence[str] | None = None, transform: Callable | None = None,
            columnar: bool = False, cache_blocks: int = 8, num_threads: int = 16,
            storage_options: dict | None = None) -> TableSource:
    """The rows of Parquet files as a lazy, position-addressable sequence.

    Item ``p`` is row ``p`` of the files laid end to end (in the order given; a folder or a glob
    is sorted by path). Only the footers are read here; a row group is decoded when one of its
    rows is first read, once per batch, and the last ``cache_blocks`` decoded row groups are
    kept per process. ``blocks()`` are the row groups: give them to a block shuffle so that an
    epoch decodes each row group about once.

    Args:
        paths: a file, a folder (its ``*.parquet``/``*.parq``/``*.pq`` files, recursively), a
            glob, or a list of them; local paths or fsspec URLs (``s3://bucket/data/``).
        columns: the columns to read (default: all).
        transform: called on each row (a dict) when it is read; must be picklable for ``spawn``.
        columnar: make ``__getitems__`` (what the loader calls with each batch's indices)
            return one dict of numpy column arrays instead of a list of rows; pass
            ``collate_fn=torch.utils.data.default_convert`` to the loader to turn it into a dict
            of tensors. The fast path: no Python step per row.
        cache_blocks: decoded row groups kept per process (at least a block shuffle's window).
        num_threads: footers read at once while indexing, row groups fetched at once in a
            batch (remote files).
        storage_options: keyword arguments for the fsspec filesystem (e.g. ``endpoint_url``).

    Returns:
        A :class:`seqloader.sources.Source` of ``sum(num_rows)`` rows.

    Raises:
        ImportError: pyarrow is missing (``pip install seqloader[parquet]``).
        FileNotFoundError: a path does not exist or a folder holds no Parquet file.
        ValueError: a file is not Parquet; files disagree on a column (both files and the
            column are named); a selected column is missing.
        TypeError: a bad argument (``transform`` with ``columnar=True``: transform batches in
            the ``collate_fn``).

    Example:
        >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
        >>> pq.write_table(pa.table({"x": [0, 1, 2, 3, 4], "y": list("abcde")}), path, row_group_size=2)
        >>> rows = parquet(path)
        >>> len(rows), rows.blocks().tolist(), rows[-1]["y"], int(rows[3]["x"])
        (5, [2, 4, 5], 'e', 3)
        >>> batch = parquet(path, columnar=True).__getitems__([4, 0, 1])
        >>> batch["x"].tolist(), batch["y"].tolist()
        ([4, 0, 1], ['e', 'a', 'b'])
        >>> parquet(path, columns=["z"])
        Traceback (most recent call last):
        ValueError: parquet: column 'z' is not in .../a.parquet (its columns: x, y)
    """
    return _Parquet(paths, columns, transform, columnar, cache_blocks, num_threads, storage_options)
