"""Parquet files as a position-addressable sequence of rows: :func:`parquet`.

The index is the row count of every row group, read from the files' footers: one read per
file (a local ``pread``, or one range request for the last 64 KiB, plus one more only for a
footer larger than that), ``num_threads`` files at a time (threads stopped once the index is
built: reading local files starts none). Position ``p`` is row
``p - starts[g]`` of row group ``g`` (a bisection over the cumulative counts, vectorised over
a batch). A batch reads each of its row groups once (remote ones concurrently, one range
request per row group covering the selected columns' chunks), decodes it with pyarrow and keeps
the last ``cache_blocks`` decoded row groups per process (sized by the loader unless given);
rows are sliced out of the decoded columns (see :mod:`seqloader.sources._table`).

What is checked: the footer must be whole (:mod:`seqloader.sources._footer`); its digest is the
file's content in a fingerprint, and every process that opens a local file reads the footer
again and compares it with the index's before its first read (a remote file is read with the
index's own footer, its ETag checked once per process). Pages are read with pyarrow's
``page_checksum_verification`` on, so a page whose CRC the writer recorded
(``write_page_checksum=True``) is checked when it is decoded. A decoded row group must have the
rows its footer promised. An error while decoding keeps its type and gains a note naming the
file and the row group. Hive partition folders (``year=2024/``) become columns
(:mod:`seqloader.sources._hive`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from seqloader.errors import add_note
from seqloader.sources._footer import Footer, parquet_footer
from seqloader.sources._hive import Partitions, partitions
from seqloader.sources._listing import resolve
from seqloader.sources._handles import HandleCache
from seqloader.sources._process import Threads, optional_import
from seqloader.sources._schema import check_schemas
from seqloader.sources._progress import Progress, log
from seqloader.sources._sample import sample_digest
from seqloader.sources._storage import Files, RangeFile
from seqloader.sources._table import TableSource
from seqloader.sources.base import BlockIndex

__all__ = ["parquet"]

_OP = "parquet"
_SUFFIXES = (".parquet", ".parq", ".pq")


def _pq() -> Any:
    return optional_import("pyarrow.parquet", "parquet", _OP)


def _parse(files: Files, k: int, footer: Footer) -> Any:
    """The ``FileMetaData`` in ``footer``; a footer pyarrow cannot parse raises ``ValueError`` naming the file."""
    try:
        return _pq().read_metadata(RangeFile(files.infos[k].size, [(footer.start, footer.tail)]))
    except Exception as exc:
        if isinstance(exc, (OSError, ValueError)) or "Arrow" in type(exc).__name__:
            raise ValueError(f"{_OP}: {files.infos[k].path} is not a readable Parquet file ({exc})") from exc
        raise add_note(exc, f"{_OP}: while reading the footer of {files.infos[k].path}")


def _read_footer(files: Files, k: int) -> tuple[Any, str, str]:
    """The ``FileMetaData`` of file ``k``, the digest of its footer (one read; errors name the file) and
    the digest of its first and last bytes (one more read: ``_sample``)."""
    footer = parquet_footer(_OP, files, k)
    return _parse(files, k, footer), footer.digest, sample_digest(files, k, footer.tail)


def _row_counts(files: Files, k: int, meta: Any) -> list[int]:
    """The row counts of file ``k``'s row groups, which must add up to the file's (pyarrow reads as many
    rows as a row group claims: a corrupt count would drop or shift rows). (Not the column chunks'
    value counts: pyarrow aborts the process on some corrupt column chunk metadata.)"""
    counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    if sum(counts) != meta.num_rows or min(counts, default=0) < 0:
        raise ValueError(f"{_OP}: {files.infos[k].path} is corrupt: its footer says {meta.num_rows} rows but its row "
                         f"groups {sum(counts)} ({', '.join(map(str, counts[:8]))}{', ...' if len(counts) > 8 else ''}); "
                         "write it again")
    return counts


class _Parquet(TableSource):
    _op = _OP
    _block_word = "row group"

    def __init__(self, paths: Any, columns: Sequence[str] | None, transform: Callable[..., Any] | None, columnar: bool,
                 cache_blocks: int | None, num_threads: int, storage_options: dict[str, Any] | None, partitioning: str | None):
        self._init_output(columns, transform, columnar, cache_blocks)
        if partitioning not in ("hive", None):
            raise ValueError(f"{_OP}: partitioning must be 'hive' or None (got {partitioning!r})")
        self._threads = Threads(_OP, num_threads)
        self._files = Files(_OP, resolve(_OP, paths, _SUFFIXES, storage_options), storage_options)
        infos = self._files.infos
        self._parts: Partitions | None = None
        if partitioning == "hive":
            self._parts = partitions(_OP, self._files.names(), [f.path for f in infos])
        progress = Progress(_OP, len(infos), "footers")

        def footer(k: int) -> tuple[Any, str, str]:
            out = _read_footer(self._files, k)
            progress.update("read")
            log.debug("%s: %s: footer read (%d row groups)", _OP, infos[k].path, out[0].num_row_groups)
            return out

        try:
            footers = self._threads.map(footer, range(len(infos)))
        finally:
            progress.close()
            self._threads.release()   # (local files use no thread from here on; remote reads start their own)
        metas = [m for m, _, _ in footers]
        self._digests = [d for _, d, _ in footers]
        self._files.contents = [f"footer:{d}+data:{sample}" for _, d, sample in footers]
        self._init_columns([m.schema.to_arrow_schema() for m in metas])
        self._metas = metas if self._files.remote else None  # FileMetaData pickles (as its footer)
        counts, where = [], []
        for k, meta in enumerate(metas):
            counts += _row_counts(self._files, k, meta)
            where += [(k, g) for g in range(meta.num_row_groups)]
        self._index = BlockIndex(counts)
        self._where = where
        self._cap_cache()
        self._open: HandleCache[Any] = HandleCache()  # per process and thread: open ParquetFile objects (local)

    def _init_columns(self, schemas: list[Any]) -> None:
        """The columns read from the files and the partition columns added to them."""
        parts = self._parts.names if self._parts is not None else []
        for name in parts:
            if schemas[0].get_field_index(name) >= 0:
                raise ValueError(f"{_OP}: {name!r} is both a column of {self._files.infos[0].path} and a hive "
                                 "partition folder; pass partitioning=None to read the column of the files only")
        wanted = None if self._columns is None else [c for c in self._columns if c not in parts]
        self._file_columns = check_schemas(_OP, [f.path for f in self._files.infos], schemas, wanted)
        self._schema_names = self._file_columns + parts if self._columns is None else list(self._columns)

    def _file(self, k: int) -> Any:
        """This process's ``ParquetFile`` (local) or ``FileMetaData`` (remote) of file ``k``. A local
        file's footer is read again and compared with the index's once per process and thread."""
        if self._metas is not None:
            return self._metas[k]
        # one ParquetFile per thread: pyarrow's must not be read from two threads at once (eight threads
        # reading one crash the process, or raise "ReadRangeCache did not find matching cache entry")
        return self._open.get((k, threading.get_ident()), lambda: self._open_file(k))

    def _open_file(self, k: int) -> Any:
        footer = parquet_footer(_OP, self._files, k, check=True)
        if footer.digest != self._digests[k]:
            raise self._files.changed_content(k, f"its footer's digest is {footer.digest}, the index's "
                                                 f"{self._digests[k]}")
        return _pq().ParquetFile(self._files.infos[k].path, metadata=_parse(self._files, k, footer),
                                 page_checksum_verification=True)

    def _read_local(self, b: int) -> Any:
        k, g = self._where[b]
        pf = self._file(k)
        self._files.check(k)
        try:
            table = pf.read_row_group(g, columns=self._file_columns, use_threads=False)
        except Exception as exc:
            raise self._noted(exc, b)
        return self._with_partitions(table, k)

    def _read_remote(self, b: int) -> Any:
        k, g = self._where[b]
        meta = self._file(k)
        rg = meta.row_group(g)
        spans = []
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema.split(".")[0] not in self._file_columns:
                continue
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset:
                start = min(start, col.dictionary_page_offset)
            spans.append((start, start + col.total_compressed_size))
        size = self._files.infos[k].size
        start, end = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0, 0)
        data = self._files.read(k, start, end)
        f = RangeFile(size, [(start, data)], fetch=lambda s, e: self._files.read(k, s, e))
        try:
            table = _pq().ParquetFile(f, metadata=meta, page_checksum_verification=True).read_row_group(
                g, columns=self._file_columns)
        except Exception as exc:
            raise self._noted(exc, b)
        return self._with_partitions(table, k)

    def _with_partitions(self, table: Any, k: int) -> Any:
        if self._parts is None:
            return table
        for name, column in self._parts.columns(k, table.num_rows):
            table = table.append_column(name, column)
        return table

    def _read_blocks(self, blocks: list[int]) -> list[Any]:
        if self._files.remote:
            return self._threads.map(self._read_remote, blocks)
        return [self._read_local(b) for b in blocks]

    def __repr__(self) -> str:
        return f"parquet({self._repr_args()})"


def parquet(paths: Any, *, columns: Sequence[str] | None = None, transform: Callable[..., Any] | None = None,
            columnar: bool = False, cache_blocks: int | None = None, num_threads: int = 16,
            storage_options: dict[str, Any] | None = None, partitioning: str | None = "hive") -> TableSource:
    """The rows of Parquet files as a lazy, position-addressable sequence.

    Item ``p`` is row ``p`` of the files laid end to end (in the order given; a folder or a glob
    is sorted by path). Only the footers are read here; a row group is decoded when one of its
    rows is first read, once per batch, and the last ``cache_blocks`` decoded row groups are
    kept per process. ``blocks()`` are the row groups: give them to a block shuffle so that an
    epoch decodes each row group once per process (``seqloader.DataLoader`` sizes the cache). Folders named ``key=value`` below ``paths`` (hive
    partitions) become columns after the files' own, as ``pyarrow.parquet.read_table`` reads
    them. Each process checks a file's footer against the index before its first read, and page
    checksums are verified where the writer wrote them; an error while decoding names the file
    and the row group.

    Args:
        paths: a file, a folder (its ``*.parquet``/``*.parq``/``*.pq`` files, recursively), a
            glob, or a list of them; local paths or fsspec URLs (``s3://bucket/data/``).
        columns: the columns to read (default: all).
        transform: called on each row (a dict) when it is read; must be picklable for ``spawn``.
        columnar: make ``__getitems__`` (what the loader calls with each batch's indices)
            return one dict of numpy column arrays instead of a list of rows (a list column
            whose rows all have one length, such as tokens, as one 2-D array); pass
            ``collate_fn=torch.utils.data.default_convert`` to the loader to turn it into a dict
            of tensors. The fast path: no Python step per row.
        cache_blocks: decoded row groups kept per process, shared by its threads. ``None``
            (default): ``seqloader.DataLoader`` sizes it when an epoch opens, from its
            ``BlockShuffleSampler``'s ``window`` and ``lanes``, its executor and its workers, so
            that each row group is decoded once per epoch per process (a block shuffle's
            ``window`` per worker process, ``2 * window`` with ``threads_per_worker``, ``window *
            (num_workers + 1)`` with thread workers); 8 until then and for other orders. An int
            is kept as given (a cap on memory: fewer decodes row groups again).
        num_threads: footers read at once while indexing, row groups fetched at once in a
            batch (remote files).
        storage_options: keyword arguments for the fsspec filesystem (e.g. ``endpoint_url``).
        partitioning: ``"hive"`` reads ``key=value`` folders as columns (``int32`` when every
            value is an integer, else ``string``); ``None`` ignores the folder names.

    Returns:
        A :class:`seqloader.sources.Source` of ``sum(num_rows)`` rows.

    Raises:
        ImportError: pyarrow is missing (``pip install seqloader[parquet]``).
        FileNotFoundError: a path does not exist or a folder holds no Parquet file.
        ValueError: a file is not Parquet, is empty or truncated (no footer); files disagree on
            a column or on their partition folders (both files and the column are named); a
            selected column is missing; a partition key is also a column of the files.
        RuntimeError: at read time, a file changed since it was indexed (naming it).
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
    return _Parquet(paths, columns, transform, columnar, cache_blocks, num_threads, storage_options, partitioning)
