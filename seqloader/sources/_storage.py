"""Range reads of a source's files, checked against what they were indexed as: :class:`Files`.

:class:`Files` reads byte ranges of a listed file (:mod:`seqloader.sources._listing`):
``os.pread`` on a descriptor kept per process (at most :data:`MAX_OPEN` at once, in the sources'
one cache of open files, :class:`~seqloader.sources._handles.HandleCache`) for local files, one
``fs.cat_file(path, start, end)`` (a range request) for remote ones. Before it reads a file it
checks that the file still has the size and validator it was indexed with (inode, ctime and
mtime locally; version id or ETag remotely): at every read for local files (one ``stat``), once
per process for remote ones (one ``info`` request), and raises ``RuntimeError`` naming the file
otherwise. Content checks that cost a read (a Parquet or Arrow footer, tar member headers) are
the sources' own, once per file and process.

A file's *description*, what a fingerprint is made of, is ``[name, size, content]``: ``name``
relative to the listing's root (so a copy elsewhere, or the same files downloaded again,
describe the same), and ``content`` a digest of what the source's index depends on, set by the
source once it has read it (``footer:<hex>+data:<hex>``, ``members:<hex>+data:<hex>``, ...). :class:`RangeFile` hands
bytes already fetched to pyarrow as a file.
"""

from __future__ import annotations

import io
import os
from typing import Any, Sequence

from seqloader.sources._handles import MAX_OPEN, HandleCache
from seqloader.sources._listing import Listing, _missing, local_version, remote_version
from seqloader.sources._process import ProcessLocal, optional_import

__all__ = ["Files", "RangeFile", "MAX_OPEN"]

class _Remote:
    """Per process: the fsspec filesystem, and the remote files already checked (once per process)."""

    def __init__(self) -> None:
        self.fs: Any = None
        self.checked: set[int] = set()


class Files:
    """Range reads of a resolved file list (see the module docstring). Picklable; handles are per process.

    Example:
        >>> import tempfile, os
        >>> from seqloader.sources._listing import resolve
        >>> path = os.path.join(tempfile.mkdtemp(), "f.bin")
        >>> with open(path, "wb") as f:
        ...     _ = f.write(b"0123456789")
        >>> files = Files("demo", resolve("demo", path, None))
        >>> files.read(0, 2, 5), len(files), files.describe()
        (b'234', 1, [['f.bin', 10, '']])
    """

    def __init__(self, op: str, listing: Listing, storage_options: dict[str, Any] | None = None):
        self.op = op
        self.infos = tuple(listing.infos)
        self.protocol = listing.protocol
        self.storage_options = dict(storage_options or {})
        #: the folder names are relative to in :meth:`describe` (the listing's root)
        self.root = listing.root
        #: per file, a digest of what the index depends on, set by the source (``""`` until then)
        self.contents = [""] * len(self.infos)
        #: local descriptors, per process (closed when they leave the cache and no read uses them)
        self.descriptors: HandleCache[int] = HandleCache(MAX_OPEN, close=os.close)
        self._remote: ProcessLocal[_Remote] = ProcessLocal(_Remote)

    def __len__(self) -> int:
        return len(self.infos)

    @property
    def remote(self) -> bool:
        return self.protocol is not None

    def fs(self) -> Any:
        """This process's fsspec filesystem (remote files only)."""
        r = self._remote.get()
        if r.fs is None:
            fsspec = optional_import("fsspec", "remote", self.op)
            r.fs = fsspec.filesystem(self.protocol, **self.storage_options)
        return r.fs

    def names(self) -> list[str]:
        """The files' names relative to :attr:`root` (``/``-separated)."""
        root = self.root if self.root.endswith("/") else self.root + "/"
        return [f.path[len(root):] if f.path.startswith(root) else f.path for f in self.infos]

    def describe(self) -> list[list[Any]]:
        """The file-list description: ``[[name, size, content], ...]`` (JSON types; see the module docstring)."""
        return [[n, f.size, c] for n, f, c in zip(self.names(), self.infos, self.contents)]

    def changed(self, k: int, size: int, version: str) -> RuntimeError:
        f = self.infos[k]
        return RuntimeError(f"{self.op}: {f.path} changed since it was indexed (size {f.size}, {f.version} "
                            f"then; size {size}, {version} now); build the source again to re-index it")

    def changed_content(self, k: int, what: str) -> RuntimeError:
        """The error for file ``k`` whose content no longer matches the index (``what`` differs)."""
        return RuntimeError(f"{self.op}: {self.infos[k].path} changed since it was indexed ({what}); build the "
                            "source again to re-index it")

    def _open(self, k: int) -> int:
        path = self.infos[k].path
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise _missing(self.op, path, "file disappeared since it was indexed") from None

    def check(self, k: int) -> None:
        """Raise ``RuntimeError`` if file ``k`` no longer has its indexed size and validator
        (``FileNotFoundError`` if it is gone): a ``stat`` of a local path at every call, an
        ``info`` request for a remote one once per process."""
        f = self.infos[k]
        if not self.remote:
            try:
                st = os.stat(f.path)
            except FileNotFoundError:
                raise _missing(self.op, f.path, "file disappeared since it was indexed") from None
            if st.st_size != f.size or local_version(st) != f.version:
                raise self.changed(k, st.st_size, local_version(st))
            return
        r = self._remote.get()
        if k in r.checked:
            return
        try:
            info = self.fs().info(f.path)
        except FileNotFoundError:
            raise _missing(self.op, f.path, "file disappeared since it was indexed") from None
        size, version = int(info["size"]), remote_version(info)[0]
        if size != f.size or version != f.version:
            raise self.changed(k, size, version)
        r.checked.add(k)

    def read(self, k: int, start: int, end: int, check: bool = True) -> bytes:
        """Bytes ``[start, end)`` of file ``k``, checked first unless ``check=False`` (while
        indexing, right after the listing); a short read raises ``RuntimeError``."""
        if check:
            self.check(k)
        data: bytes
        if self.remote:
            data = self.fs().cat_file(self.infos[k].path, start=start, end=end)
        else:
            with self.descriptors.lease(k, lambda: self._open(k)) as fd:
                data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise RuntimeError(f"{self.op}: {self.infos[k].path}: read {len(data)} bytes at offset {start}, "
                               f"expected {end - start}; the file is shorter than its index says")
        return data

    def local_path(self, k: int) -> str:
        """The local path of file ``k``, checked (local files only)."""
        self.check(k)
        return self.infos[k].path

    def __repr__(self) -> str:
        return f"files({len(self.infos)}, {self.protocol or 'local'})"


class RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which some ranges are already in memory.

    Reads inside a held range cost nothing; any other read calls ``fetch(start, end)`` (a range
    request) and keeps the result. Given to pyarrow, it lets a footer or a row group be parsed
    from the bytes of one request.

    Example:
        >>> f = RangeFile(10, [(6, b"6789")], fetch=lambda s, e: bytes(range(48 + s, 48 + e)))
        >>> _ = f.seek(-3, 2); f.read(), f.seek(1), f.read(2), f.fetches
        (b'789', 1, b'12', 1)
    """

    def __init__(self, size: int, ranges: Sequence[tuple[int, bytes]] = (), fetch: Any = None):
        super().__init__()
        self._size = size
        self._ranges = [(s, memoryview(b)) for s, b in ranges]
        self._fetch = fetch
        self._pos = 0
        self.fetches = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = max(0, min(len(buf), self._size - self._pos))
        start, end = self._pos, self._pos + n
        for s, data in self._ranges:
            if s <= start and end <= s + len(data):
                buf[:n] = data[start - s:end - s]
                self._pos = end
                return n
        if self._fetch is None:
            raise OSError(f"RangeFile: bytes [{start}, {end}) were not fetched")
        data = memoryview(self._fetch(start, end))
        self.fetches += 1
        self._ranges.append((start, data))
        buf[:n] = data
        self._pos = end
        return n
