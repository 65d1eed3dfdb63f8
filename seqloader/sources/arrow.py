"""Arrow IPC files (Feather v2) as a position-addressable sequence of rows: :func:`arrow_ipc`.

The blocks are the files' record batches. A local file is memory-mapped once per process and
its batches are read zero-copy (numeric columns become numpy views of the mapping; compressed
files are decompressed per batch). Rows, the columnar mode and the cache of decoded blocks are
those of :func:`~seqloader.parquet` (:mod:`seqloader.sources._table`). The IPC *file* format
keeps an index of its batches in a footer; the *stream* format does not, and Feather v1 is
another format: both are refused with what to do.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Sequence

from seqloader.sources._process import ProcessLocal, Threads, optional_import
from seqloader.sources._storage import Files, RangeFile, resolve
from seqloader.sources._table import TableSource
from seqloader.sources.base import BlockIndex

__all__ = ["arrow_ipc"]

_OP = "arrow_ipc"
_SUFFIXES = (".arrow", ".feather", ".ipc")
TAIL_BYTES = 64 * 1024


def _pa() -> Any:
    return optional_import("pyarrow", "parquet", _OP)


def _not_a_file(path: str, head: bytes) -> ValueError | None:
    if head.startswith(b"ARROW1"):
        return None
    if head.startswith(b"FEA1"):
        what = "a Feather v1 file"
    elif head.startswith(b"\xff\xff\xff\xff"):
        what = "an Arrow IPC *stream*, which has no index of its batches"
    else:
        what = "not an Arrow IPC file"
    return ValueError(f"{_OP}: {path} is {what}; rewrite it in the IPC file format "
                      "(pyarrow.feather.write_feather(table, path), or pyarrow.ipc.new_file)")


class _Readers:
    """Per process: open ``RecordBatchFileReader`` objects, by file."""

    def __init__(self) -> None:
        self.readers: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self.lock = threading.Lock()


class _ArrowIPC(TableSource):
    _op = _OP

    def __init__(self, paths: Any, columns: Sequence[str] | None, transform: Callable | None, columnar: bool,
                 cache_blocks: int, num_threads: int, storage_options: dict | None):
        self._init_output(columns, transform, columnar, cache_blocks)
        self._threads = Threads(_OP, num_threads)
        infos, protocol = resolve(_OP, paths, _SUFFIXES, storage_options)
        self._files = Files(_OP, infos, protocol, storage_options)
        self._readers: ProcessLocal[_Readers] = ProcessLocal(_Readers)
        opened = self._threads.map(lambda k: self._open_file(k, check=False), range(len(infos)))
        first = opened[0].schema
        names = list(first.names) if self._columns is None else self._columns
        for c in names:
            if first.get_field_index(c) < 0:
                raise ValueError(f"{_OP}: column {c!r} is not in {infos[0].path} (its columns: {', '.join(first.names)})")
        for k, reader in enumerate(opened[1:], start=1):
            schema = reader.schema
            for c in names if self._columns is not None else list(dict.fromkeys([*names, *schema.names])):
                i = schema.get_field_index(c)
                if i < 0 or first.get_field_index(c) < 0:
                    missing_in, present_in = ((infos[k].path, infos[0].path) if i < 0
                                              else (infos[0].path, infos[k].path))
                    raise ValueError(f"{_OP}: column {c!r} is in {present_in} but not in {missing_in}")
                if not schema.field(i).type.equals(first.field(c).type):
                    raise ValueError(f"{_OP}: column {c!r} is {first.field(c).type} in {infos[0].path} but "
                                     f"{schema.field(i).type} in {infos[k].path}")
        self._schema_names = names
        counts, where = [], []
        for k, reader in enumerate(opened):
            for g in range(reader.num_record_batches):
                counts.append(reader.get_batch(g).num_rows)
                where.append((k, g))
        self._index = BlockIndex(counts)
        self._where = where

    def _open_file(self, k: int, check: bool = True) -> Any:
        """This process's reader of file ``k`` (memory-mapped locally; range reads remotely)."""
        state = self._readers.get()
        with state.lock:
            if k in state.readers:
                state.readers.move_to_end(k)
                return state.readers[k]
        pa = _pa()
        info = self._files.infos[k]
        head = self._files.read(k, 0, min(info.size, 8), check=check)
        error = _not_a_file(info.path, head)
        if error is not None:
            raise error
        if self._files.remote:
            tail_start = max(0, info.size - TAIL_BYTES)
            tail = self._files.read(k, tail_start, info.size, check=False)
            source = RangeFile(info.size, [(0, head), (tail_start, tail)],
                               fetch=lambda s, e: self._files.read(k, s, e))
        else:
            source = pa.memory_map(self._files.local_path(k))
        reader = pa.ipc.open_file(source)
        with state.lock:
            state.readers[k] = reader
            while len(state.readers) > 64:
                state.readers.popitem(last=False)
        return reader

    def _read_block(self, b: int) -> Any:
        k, g = self._where[b]
        reader = self._open_file(k)
        self._files.check(k)
        batch = reader.get_batch(g)
        return _pa().Table.from_batches([batch]).select(self._schema_names)

    def _read_blocks(self, blocks: list[int]) -> list[Any]:
        if self._files.remote:
            return self._threads.map(self._read_block, blocks)
        return [self._read_block(b) for b in blocks]

    def __repr__(self) -> str:
        return f"arrow_ipc({self._repr_args()})"


def arrow_ipc(paths: Any, *, columns: Sequence[str] | None = None, transform: Callable | None = None,
              columnar: bool = False, cache_blocks: int = 8, num_threads: int = 16,
              storage_options: dict | None = None) -> TableSource:
    """The rows of Arrow IPC files (Feather v2) as a lazy, position-addressable sequence.

    As :func:`seqloader.parquet`, with record batches as blocks. Local files are memory-mapped
    and read without copies where the format allows (uncompressed numeric columns). Arrow's
    footer does not hold the batches' row counts, so indexing a *remote* file reads it once
    whole; prefer Parquet on object storage.

    Args:
        paths: a file, a folder (its ``*.arrow``/``*.feather``/``*.ipc`` files), a glob, or a list;
            local paths or fsspec URLs.
        columns: the columns to read (default: all).
        transform: called on each row (a dict) when it is read.
        columnar: ``__getitems__`` returns one dict of column arrays (see :func:`seqloader.parquet`).
        cache_blocks: decoded record batches kept per process.
        num_threads: files opened at once while indexing; batches fetched at once (remote).
        storage_options: keyword arguments for the fsspec filesystem.

    Returns:
        A :class:`seqloader.sources.Source` of rows.

    Raises:
        ImportError: pyarrow is missing (``pip install seqloader[parquet]``).
        FileNotFoundError: a path does not exist.
        ValueError: a file is an IPC stream, Feather v1 or not Arrow; files disagree on a column.

    Example:
        >>> import os, tempfile, pyarrow as pa, pyarrow.feather as feather
        >>> path = os.path.join(tempfile.mkdtemp(), "a.arrow")
        >>> feather.write_feather(pa.table({"x": list(range(5))}), path, chunksize=2)
        >>> rows = arrow_ipc(path)
        >>> len(rows), rows.blocks().tolist(), int(rows[-1]["x"])
        (5, [2, 4, 5], 4)
        >>> with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, pa.schema([("x", pa.int64())])) as w:
        ...     w.write_table(pa.table({"x": [1]}))
        >>> arrow_ipc(path)
        Traceback (most recent call last):
        ValueError: arrow_ipc: .../a.arrow is an Arrow IPC *stream*, which has no index of its batches; rewrite it in the IPC file format (pyarrow.feather.write_feather(table, path), or pyarrow.ipc.new_file)
    """
    return _ArrowIPC(paths, columns, transform, columnar, cache_blocks, num_threads, storage_options)
