"""Where a source's bytes come from: the file list, its description, and range reads.

:func:`resolve` turns what the user passed (a file, a folder, a glob, a list of them; local
paths or fsspec URLs such as ``s3://bucket/prefix``) into a sorted tuple of :class:`FileInfo`
``(path, size, version)``, where ``version`` is ``mtime_ns:<int>`` locally and the ETag (else the
modification time) remotely. :class:`Files` reads byte ranges of those files: ``os.pread`` on a
descriptor kept per process (at most :data:`MAX_OPEN` at once) for local files, one
``fs.cat_file(path, start, end)`` (a range request) for remote ones. Before it reads a file it
checks that the file still has the size and version it was indexed with, once per process for
remote files and at every read for local ones (a ``stat``), and raises ``RuntimeError``
naming the file otherwise: a source never returns data that differs from its index.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import glob as _glob
import io
import os
import threading
from typing import Any, Iterable, Sequence

from seqloader.sources._process import ProcessLocal, optional_import

__all__ = ["FileInfo", "Files", "RangeFile", "resolve", "MAX_OPEN"]

#: Local file descriptors a source keeps open per process (least recently used ones are closed).
MAX_OPEN = 64
_GLOB_CHARS = ("*", "?", "[")


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One file of a source: ``path`` (absolute local path or URL), ``size`` in bytes, ``version``."""

    path: str
    size: int
    version: str

    def describe(self) -> list:
        """``[path, size, version]``: JSON types, the file's entry in a file-list description."""
        return [self.path, self.size, self.version]


def _is_url(p: str) -> bool:
    return "://" in p


def _local_info(path: str) -> FileInfo:
    st = os.stat(path)
    return FileInfo(path, st.st_size, f"mtime_ns:{st.st_mtime_ns}")


def _remote_version(info: dict) -> str:
    for key in ("ETag", "etag", "Etag"):
        if info.get(key):
            return "etag:" + str(info[key]).strip('"')
    for key in ("LastModified", "last_modified", "mtime", "updated", "modified"):
        if info.get(key):
            return f"mtime:{info[key]}"
    return ""


def _missing(op: str, path: str, what: str = "no such file or directory") -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, f"{op}: {what}", path)


def _matches(name: str, suffixes: Sequence[str] | None) -> bool:
    base = name.rsplit("/", 1)[-1]
    if base.startswith((".", "_")):  # hidden files, _SUCCESS, _metadata, our own index caches
        return False
    return suffixes is None or name.lower().endswith(tuple(suffixes))


def _resolve_local(op: str, p: str, suffixes: Sequence[str] | None) -> list[FileInfo]:
    p = os.path.abspath(os.path.expanduser(p))
    if any(c in p for c in _GLOB_CHARS):
        names = sorted(n for n in _glob.glob(p, recursive=True) if os.path.isfile(n))
        if not names:
            raise _missing(op, p, "the pattern matched no file")
        return [_local_info(n) for n in names]
    if os.path.isdir(p):
        names = []
        for d, dirs, files in os.walk(p):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            names += [os.path.join(d, f) for f in files if _matches(f, suffixes)]
        if not names:
            raise _missing(op, p, f"the folder holds no file ending in {', '.join(suffixes or ())}")
        return [_local_info(n) for n in sorted(names)]
    if not os.path.exists(p):
        raise _missing(op, p)
    return [_local_info(p)]


def _resolve_remote(op: str, fs: Any, url: str, p: str, suffixes: Sequence[str] | None) -> list[FileInfo]:
    if any(c in p for c in _GLOB_CHARS):
        found = fs.glob(p, detail=True)
        infos = [i for i in found.values() if i.get("type") != "directory"]
        if not infos:
            raise _missing(op, url, "the pattern matched no file")
    else:
        try:
            top = fs.info(p)
        except FileNotFoundError:
            raise _missing(op, url) from None
        if top.get("type") == "directory":
            infos = [i for i in fs.find(p, detail=True).values() if _matches(i["name"], suffixes)]
            if not infos:
                raise _missing(op, url, f"the folder holds no file ending in {', '.join(suffixes or ())}")
        else:
            infos = [top]
    out = [FileInfo(fs.unstrip_protocol(i["name"]), int(i["size"]), _remote_version(i)) for i in infos]
    return sorted(out, key=lambda f: f.path)


def resolve(op: str, paths: Any, suffixes: Sequence[str] | None,
            storage_options: dict | None = None) -> tuple[tuple[FileInfo, ...], str | None]:
    """The files named by ``paths``, and the fsspec protocol (``None`` for local files).

    Args:
        op: the source's name, for messages.
        paths: a path, folder, glob or URL, or a list of them (each expanded and sorted; the
            list keeps its order).
        suffixes: the file endings a folder is filtered by (lower case), or ``None``.
        storage_options: keyword arguments of the fsspec filesystem (remote URLs only).

    Raises:
        FileNotFoundError: a path does not exist, or a folder/pattern matches no file.
        TypeError, ValueError: ``paths`` is empty or mixes local paths and URLs.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "b.txt").write_text("hi"); _ = (d / "a.txt").write_text("")
        >>> [pathlib.Path(f.path).name for f in resolve("demo", str(d), (".txt",))[0]]
        ['a.txt', 'b.txt']
        >>> resolve("demo", str(d / "nope.txt"), None)
        Traceback (most recent call last):
        FileNotFoundError: [Errno 2] demo: no such file or directory: '.../nope.txt'
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not paths:
        raise TypeError(f"{op}: paths must be a path, URL or glob, or a non-empty list of them (got {paths!r})")
    names = [os.fspath(p) for p in paths]
    remote = {_is_url(n) and not n.startswith("file://") for n in names}
    if len(remote) > 1:
        raise ValueError(f"{op}: paths mix local paths and URLs ({names[0]!r}, ...); use one storage per source")
    if remote == {False}:
        names = [n[len("file://"):] if n.startswith("file://") else n for n in names]
        return tuple(f for n in names for f in _resolve_local(op, n, suffixes)), None
    fsspec = optional_import("fsspec", "remote", op)
    out: list[FileInfo] = []
    protocol = None
    for n in names:
        fs, p = fsspec.core.url_to_fs(n, **(storage_options or {}))
        protocol = protocol or n.split("://", 1)[0]
        out += _resolve_remote(op, fs, n, p, suffixes)
    return tuple(out), protocol


class _Handles:
    """Per-process: open local descriptors (LRU), the fsspec filesystem, files already checked."""

    def __init__(self) -> None:
        self.fds: collections.OrderedDict[int, int] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.fs: Any = None
        self.checked: set[int] = set()

    def __del__(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


class Files:
    """Range reads of a resolved file list (see the module docstring). Picklable; handles are per process.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "f.bin")
        >>> with open(path, "wb") as f:
        ...     _ = f.write(b"0123456789")
        >>> files = Files("demo", *resolve("demo", path, None))
        >>> files.read(0, 2, 5), len(files)
        (b'234', 1)
    """

    def __init__(self, op: str, infos: Iterable[FileInfo], protocol: str | None = None,
                 storage_options: dict | None = None):
        self.op = op
        self.infos = tuple(infos)
        self.protocol = protocol
        self.storage_options = dict(storage_options or {})
        self._handles: ProcessLocal[_Handles] = ProcessLocal(_Handles)

    def __len__(self) -> int:
        return len(self.infos)

    @property
    def remote(self) -> bool:
        return self.protocol is not None

    def fs(self) -> Any:
        """This process's fsspec filesystem (remote files only)."""
        h = self._handles.get()
        if h.fs is None:
            fsspec = optional_import("fsspec", "remote", self.op)
            h.fs = fsspec.filesystem(self.protocol, **self.storage_options)
        return h.fs

    def describe(self) -> list[list]:
        """The file-list description: ``[[path, size, version], ...]`` (JSON types)."""
        return [f.describe() for f in self.infos]

    def changed(self, k: int, size: int, version: str) -> RuntimeError:
        f = self.infos[k]
        return RuntimeError(f"{self.op}: {f.path} changed since it was indexed (size {f.size}, {f.version} "
                            f"then; size {size}, {version} now); build the source again to re-index it")

    def _fd(self, k: int) -> int:
        h = self._handles.get()
        with h.lock:
            fd = h.fds.get(k)
            if fd is not None:
                h.fds.move_to_end(k)
                return fd
            path = self.infos[k].path
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise _missing(self.op, path, "file disappeared since it was indexed") from None
            h.fds[k] = fd
            while len(h.fds) > MAX_OPEN:
                os.close(h.fds.popitem(last=False)[1])
            return fd

    def check(self, k: int) -> None:
        """Raise ``RuntimeError`` if file ``k`` no longer has its indexed size and version
        (``FileNotFoundError`` if it is gone): a ``stat`` of a local path at every call, an
        ``info`` request for a remote one once per process."""
        f = self.infos[k]
        if not self.remote:
            try:
                st = os.stat(f.path)
            except FileNotFoundError:
                raise _missing(self.op, f.path, "file disappeared since it was indexed") from None
            if st.st_size != f.size or f"mtime_ns:{st.st_mtime_ns}" != f.version:
                raise self.changed(k, st.st_size, f"mtime_ns:{st.st_mtime_ns}")
            return
        h = self._handles.get()
        if k in h.checked:
            return
        try:
            info = self.fs().info(f.path)
        except FileNotFoundError:
            raise _missing(self.op, f.path, "file disappeared since it was indexed") from None
        size, version = int(info["size"]), _remote_version(info)
        if size != f.size or version != f.version:
            raise self.changed(k, size, version)
        h.checked.add(k)

    def read(self, k: int, start: int, end: int, check: bool = True) -> bytes:
        """Bytes ``[start, end)`` of file ``k``, checked first unless ``check=False`` (while
        indexing, right after the listing); a short read raises ``RuntimeError``."""
        if check:
            self.check(k)
        if self.remote:
            data = self.fs().cat_file(self.infos[k].path, start=start, end=end)
        else:
            data = os.pread(self._fd(k), end - start, start)
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
