"""Arrow IPC files (Feather v2) as a position-addressable sequence of rows: :func:`arrow_ipc`.

The blocks are the files' record batches. A local file is memory-mapped once per process and
its batches are read zero-copy (numeric columns become numpy views of the mapping; compressed
files are decompressed per batch). Rows, the columnar mode and the cache of decoded blocks are
those of :func:`~seqloader.parquet` (:mod:`seqloader.sources._table`). The IPC *file* format
keeps an index of its batches in a footer; the *stream* format does not, and Feather v1 is
another format: both are refused with what to do.

What is checked: the file must start and end with ``ARROW1`` (a truncated copy has no footer:
refused, naming the file); the digest of the footer is the file's content in a fingerprint, and
every process that opens the file compares it with the index's before its first read; each
record batch is validated (``RecordBatch.validate``: buffer sizes and offsets) when it is
decoded and must have the rows the index says; an error keeps its type and gains a note naming
the file and the batch. Arrow IPC has no checksums: a flipped bit in a value is not detected.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Sequence

from seqloader.errors import add_note
from seqloader.sources._footer import Footer, arrow_blocks, arrow_footer
from seqloader.sources._listing import resolve
from seqloader.sources._handles import HandleCache
from seqloader.sources._process import Threads, optional_import
from seqloader.sources._schema import check_schemas
from seqloader.sources._progress import Progress, log
from seqloader.sources._sample import sample_digest
from seqloader.sources._storage import Files, RangeFile
from seqloader.sources._table import TableSource
from seqloader.sources.base import BlockIndex

__all__ = ["arrow_ipc"]

_OP = "arrow_ipc"
_SUFFIXES = (".arrow", ".feather", ".ipc")


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


def _schema_end(path: str, head: bytes, size: int) -> int:
    """Where the schema message that opens the IPC stream of a file ends (``head``: its first 16 bytes)."""
    marker, length = struct.unpack("<iI", head[8:16])
    end: int = 16 + length if marker == -1 else 12 + marker   # (a legacy stream has no continuation marker)
    if not 12 < end <= size:
        raise ValueError(f"{_OP}: {path} is corrupt: its schema message (at offset 8) ends at {end}, outside the file")
    return end


def _check_layout(path: str, size: int, schema_end: int, footer: Footer) -> None:
    """The footer's blocks must tile the file from the schema message to the footer (a corrupt footer
    would otherwise drop or repeat record batches without an error)."""
    start = size - len(footer.footer)
    try:
        blocks = arrow_blocks(footer.footer[:-10])
    except struct.error as exc:
        raise ValueError(f"{_OP}: {path} is corrupt: its footer cannot be parsed ({exc})") from None
    pos = schema_end
    for offset, meta, body in blocks:
        if offset != pos or meta <= 0 or body < 0:
            raise ValueError(f"{_OP}: {path} is corrupt: its footer lists a batch at offset {offset} (metadata "
                             f"{meta}, body {body} bytes) where the previous message ends at {pos}")
        pos = offset + meta + body
    if not 0 <= start - pos <= 8:   # (the end-of-stream marker, 0, 4 or 8 bytes)
        raise ValueError(f"{_OP}: {path} is corrupt: its batches end at offset {pos} but its footer starts at {start}")


class _ArrowIPC(TableSource):
    _op = _OP
    _block_word = "record batch"
    _slot_buffers = False   # batches stay zero-copy views of the memory map (shared page cache)

    def __init__(self, paths: Any, columns: Sequence[str] | None, transform: Callable[..., Any] | None, columnar: bool,
                 cache_blocks: int | None, num_threads: int, storage_options: dict[str, Any] | None):
        self._init_output(columns, transform, columnar, cache_blocks)
        self._threads = Threads(_OP, num_threads)
        self._files = Files(_OP, resolve(_OP, paths, _SUFFIXES, storage_options), storage_options)
        infos = self._files.infos
        self._readers: HandleCache[tuple[Any, str]] = HandleCache()  # per process: (reader, footer digest)
        self._digests: list[str] | None = None
        progress = Progress(_OP, len(infos), "files")

        def index(k: int) -> tuple[Any, list[int], str]:
            reader, digest = self._open_file(k, check=False)
            counts = []
            for g in range(reader.num_record_batches):
                try:
                    counts.append(reader.get_batch(g).num_rows)
                except Exception as exc:
                    raise add_note(exc, f"{_OP}: while indexing record batch {g} of {infos[k].path}")
            progress.update("read")
            log.debug("%s: %s: %d record batches", _OP, infos[k].path, len(counts))
            return reader.schema, counts, f"{digest}+data:{sample_digest(self._files, k)}"

        try:
            opened = self._threads.map(index, range(len(infos)))
        finally:
            progress.close()
            self._threads.release()   # (local files use no thread from here on; remote reads start their own)
        self._schema_names = check_schemas(_OP, [f.path for f in infos], [schema for schema, _, _ in opened],
                                           self._columns)
        self._digests = [d.split("+", 1)[0] for _, _, d in opened]
        self._files.contents = [f"footer:{d}" for _, _, d in opened]
        self._index = BlockIndex([n for _, counts, _ in opened for n in counts])
        self._where = [(k, g) for k, (_, counts, _) in enumerate(opened) for g in range(len(counts))]
        self._cap_cache()

    def _open_file(self, k: int, check: bool = True) -> tuple[Any, str]:
        """This process's reader of file ``k`` (memory-mapped locally; range reads remotely) and the
        digest of its footer; once the index is built, a footer that differs from it raises."""
        return self._readers.get(k, lambda: self._open_reader(k, check))

    def _open_reader(self, k: int, check: bool) -> tuple[Any, str]:
        pa = _pa()
        info = self._files.infos[k]
        head = self._files.read(k, 0, min(info.size, 16), check=check)
        error = _not_a_file(info.path, head)
        if error is not None:
            raise error
        footer = arrow_footer(_OP, self._files, k, check=check)
        if self._digests is not None and footer.digest != self._digests[k]:
            raise self._files.changed_content(k, f"its footer's digest is {footer.digest}, the index's "
                                                 f"{self._digests[k]}")
        if self._files.remote:
            source = RangeFile(info.size, [(0, head), (footer.start, footer.tail)],
                               fetch=lambda s, e: self._files.read(k, s, e))
        else:
            source = pa.memory_map(self._files.local_path(k))
        try:
            reader = pa.ipc.open_file(source)
            if self._digests is None:   # indexing: the footer must agree with the stream it indexes
                schema_end = _schema_end(info.path, head, info.size)
                _check_layout(info.path, info.size, schema_end, footer)
                stream = pa.ipc.read_schema(pa.py_buffer(self._files.read(k, 8, schema_end, check=False)))
                if not stream.equals(reader.schema, check_metadata=True):
                    raise ValueError(f"{_OP}: {info.path} is corrupt: the schema in its footer differs from the one "
                                     f"at its start ({', '.join(map(str, reader.schema))[:120]} vs "
                                     f"{', '.join(map(str, stream))[:120]})")
        except Exception as exc:
            if info.path not in str(exc):
                add_note(exc, f"{_OP}: while opening {info.path}")
            raise
        return reader, footer.digest

    def _read_block(self, b: int) -> Any:
        k, g = self._where[b]
        reader, _ = self._open_file(k)
        self._files.check(k)
        try:
            batch = reader.get_batch(g)
            batch.validate()
        except Exception as exc:
            raise self._noted(exc, b)
        return _pa().Table.from_batches([batch]).select(self._schema_names)

    def _read_blocks(self, blocks: list[int]) -> list[Any]:
        if self._files.remote:
            return self._threads.map(self._read_block, blocks)
        return [self._read_block(b) for b in blocks]

    def __repr__(self) -> str:
        return f"arrow_ipc({self._repr_args()})"


def arrow_ipc(paths: Any, *, columns: Sequence[str] | None = None, transform: Callable[..., Any] | None = None,
              columnar: bool = False, cache_blocks: int | None = None, num_threads: int = 16,
              storage_options: dict[str, Any] | None = None) -> TableSource:
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
        cache_blocks: decoded record batches kept per process; ``None`` (default): sized by
            ``seqloader.DataLoader`` (see :func:`seqloader.parquet`).
        num_threads: files opened at once while indexing; batches fetched at once (remote).
        storage_options: keyword arguments for the fsspec filesystem.

    Returns:
        A :class:`seqloader.sources.Source` of rows.

    Raises:
        ImportError: pyarrow is missing (``pip install seqloader[parquet]``).
        FileNotFoundError: a path does not exist.
        ValueError: a file is an IPC stream, Feather v1, not Arrow, or truncated (no footer);
            files disagree on a column.
        RuntimeError: at read time, a file changed since it was indexed (naming it).

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
