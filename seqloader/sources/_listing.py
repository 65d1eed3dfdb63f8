"""Which files a source reads and how each is recognised later: :func:`resolve`, :class:`FileInfo`.

:func:`resolve` turns what the user passed (a file, a folder, a glob, a list of them; local
paths or fsspec URLs such as ``s3://bucket/prefix``) into a :class:`Listing`: a sorted tuple of
:class:`FileInfo` ``(path, size, version)``, the fsspec protocol, and the *root* (the folder the
files are named relative to in a fingerprint: the common folder of the arguments).

``version`` is a *validator*, what a later ``stat`` or ``info`` must return for the file to count
as unchanged. A modification time alone is weak: ``cp -p``, ``rsync -t``, fixed
``SOURCE_DATE_EPOCH`` mtimes and coarse clocks give a replaced file the old one's mtime. Locally
the validator adds what ``utime`` cannot set back: the inode number and the status-change time
(``ctime``), ``mtime_ns:<m>,ctime_ns:<c>,ino:<i>``. Remotely it is the object's version id and
ETag (``version:<id>,etag:<etag>``). A filesystem that offers neither (``memory://``, some fsspec
backends) falls back to its modification time or nothing, and :func:`resolve` warns once per
process and filesystem that a same-size replacement cannot be detected there.
"""

from __future__ import annotations

import dataclasses
import errno
import glob as _glob
import os
import posixpath
import threading
import warnings
from typing import Any, Callable, Sequence

from seqloader.sources._process import optional_import

__all__ = ["FileInfo", "Listing", "resolve", "local_info", "local_version", "remote_version", "warn_weak",
           "common_root", "content_identity"]

_GLOB_CHARS = ("*", "?", "[")
#: Keys of an fsspec ``info`` dict that hold a strong validator, in order of preference.
_VERSION_KEYS = ("VersionId", "version_id", "generation")
_ETAG_KEYS = ("ETag", "etag", "Etag", "md5Hash")
_MTIME_KEYS = ("LastModified", "last_modified", "mtime", "updated", "modified", "created")
_WARNED: set[tuple[int, str]] = set()
_WARN_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One file of a source: ``path`` (absolute local path or URL), ``size`` in bytes, ``version``
    (its validator, see the module docstring)."""

    path: str
    size: int
    version: str


@dataclasses.dataclass(frozen=True)
class Listing:
    """What :func:`resolve` found: the files, the fsspec protocol (``None``: local), the root folder."""

    infos: tuple[FileInfo, ...]
    protocol: str | None
    root: str


def _is_url(p: str) -> bool:
    return "://" in p


def local_version(st: os.stat_result) -> str:
    """The validator of a local file from its ``stat``: mtime, and what ``utime`` cannot set back."""
    return f"mtime_ns:{st.st_mtime_ns},ctime_ns:{st.st_ctime_ns},ino:{st.st_ino}"


def local_info(path: str) -> FileInfo:
    """The :class:`FileInfo` of a local file (``stat`` follows symbolic links)."""
    st = os.stat(path)
    return FileInfo(path, st.st_size, local_version(st))


def content_identity(version: str) -> bool:
    """Whether a validator names the content itself (an object store's version id or ETag, which
    change with every write), so that reading the file again to compare adds nothing."""
    return version.startswith(("version:", "etag:"))


def remote_version(info: dict[str, Any]) -> tuple[str, bool]:
    """``(validator, strong)`` from an fsspec ``info`` dict: version id and ETag (strong), inode,
    ctime and mtime (strong: a local filesystem behind fsspec), else the modification time (weak),
    else ``""``.

    Example:
        >>> remote_version({"ETag": '"abc"', "VersionId": "v2"}), remote_version({"created": 5})
        (('version:v2,etag:abc', True), ('mtime:5', False))
    """
    parts = [f"version:{info[k]}" for k in _VERSION_KEYS if info.get(k)][:1]
    parts += [f"etag:{str(info[k]).strip(chr(34))}" for k in _ETAG_KEYS if info.get(k)][:1]
    if parts:
        return ",".join(parts), True
    if info.get("ino") and info.get("mtime") and info.get("created"):   # a local filesystem behind fsspec
        return f"mtime:{info['mtime']},ctime:{info['created']},ino:{info['ino']}", True
    for key in _MTIME_KEYS:
        value = info.get(key)
        if value:   # (one filesystem gives a datetime from info() and a float from find(): compare numbers)
            return f"mtime:{value.timestamp() if hasattr(value, 'timestamp') else value}", False
    return "", False


def warn_weak(op: str, protocol: str, path: str) -> None:
    """Warn, once per process and filesystem, that ``protocol`` has no strong validator."""
    key = (os.getpid(), protocol)
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(f"{op}: the {protocol}:// filesystem gives no ETag or version id for {path}: a file replaced "
                  "by one of the same size (and modification time) cannot be detected there; see 'What "
                  "seqloader checks, and what it cannot' in docs/data.md", UserWarning, stacklevel=4)


def _missing(op: str, path: str, what: str = "no such file or directory") -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, f"{op}: {what}", path)


def _matches(name: str, suffixes: Sequence[str] | None) -> bool:
    base = name.rsplit("/", 1)[-1]
    if base.startswith((".", "_")):  # hidden files, _SUCCESS, _metadata, our own index caches
        return False
    return suffixes is None or name.lower().endswith(tuple(suffixes))


def _glob_base(p: str) -> str:
    """The folder part of a glob before its first wildcard."""
    cut = min(p.index(c) for c in _GLOB_CHARS if c in p)
    return p[:cut].rsplit("/", 1)[0] or "/"


Explain = Callable[[str, list[str]], Exception | None]


def _nothing_matched(op: str, folder: str, names: list[str], suffixes: Sequence[str] | None,
                     explain: Explain | None) -> Exception:
    error = explain(folder, names) if explain is not None else None
    return error or _missing(op, folder, f"the folder holds no file ending in {', '.join(suffixes or ())}")


def _resolve_local(op: str, p: str, suffixes: Sequence[str] | None,
                   explain: Explain | None) -> tuple[list[FileInfo], str]:
    p = os.path.abspath(os.path.expanduser(p))
    if any(c in p for c in _GLOB_CHARS):
        names = sorted(n for n in _glob.glob(p, recursive=True) if os.path.isfile(n))
        if not names:
            raise _missing(op, p, "the pattern matched no file")
        return [local_info(n) for n in names], _glob_base(p)
    if os.path.isdir(p):
        names, others = [], []
        for d, dirs, files in os.walk(p):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            names += [os.path.join(d, f) for f in files if _matches(f, suffixes)]
            others += [os.path.join(d, f) for f in files if _matches(f, None)]
        if not names:
            raise _nothing_matched(op, p, sorted(others), suffixes, explain)
        return [local_info(n) for n in sorted(names)], p
    if not os.path.exists(p):
        raise _missing(op, p)
    return [local_info(p)], os.path.dirname(p)


def _resolve_remote(op: str, fs: Any, url: str, p: str, suffixes: Sequence[str] | None,
                    explain: Explain | None) -> tuple[list[FileInfo], str]:
    if any(c in p for c in _GLOB_CHARS):
        found = fs.glob(p, detail=True)
        infos = [i for i in found.values() if i.get("type") != "directory"]
        if not infos:
            raise _missing(op, url, "the pattern matched no file")
        base = _glob_base(p)
    else:
        try:
            top = fs.info(p)
        except FileNotFoundError:
            raise _missing(op, url) from None
        if top.get("type") == "directory":
            every = [i for i in fs.find(p, detail=True).values()]
            infos = [i for i in every if _matches(i["name"], suffixes)]
            if not infos:
                others = sorted(fs.unstrip_protocol(i["name"]) for i in every if _matches(i["name"], None))
                raise _nothing_matched(op, url, others, suffixes, explain)
            base = p.rstrip("/")
        else:
            infos, base = [top], posixpath.dirname(p.rstrip("/"))
    out = []
    for i in infos:
        version, strong = remote_version(i)
        path = fs.unstrip_protocol(i["name"])
        if not strong:
            warn_weak(op, url.split("://", 1)[0], path)
        out.append(FileInfo(path, int(i["size"]), version))
    return sorted(out, key=lambda f: f.path), fs.unstrip_protocol(base)


def common_root(folders: Sequence[str]) -> str:
    """The deepest folder holding every one of ``folders`` (local paths or URLs of one protocol).

    Example:
        >>> common_root(["/d/a/x", "/d/a/y", "/d/a"]), common_root(["s3://b/p/q", "s3://b/p/r"])
        ('/d/a', 's3://b/p')
    """
    if not folders:
        return ""
    scheme = folders[0].split("://", 1)[0] + "://" if _is_url(folders[0]) else ""
    parts = [f[len(scheme):].rstrip("/").split("/") for f in folders]
    common = parts[0]
    for p in parts[1:]:
        n = 0
        while n < min(len(common), len(p)) and common[n] == p[n]:
            n += 1
        common = common[:n]
    joined = "/".join(common)
    return scheme + (joined or "/")


def resolve(op: str, paths: Any, suffixes: Sequence[str] | None, storage_options: dict[str, Any] | None = None,
            explain: Explain | None = None) -> Listing:
    """The files named by ``paths``, the fsspec protocol (``None`` for local files) and their root.

    Args:
        op: the source's name, for messages.
        paths: a path, folder, glob or URL, or a list of them (each expanded and sorted; the
            list keeps its order).
        suffixes: the file endings a folder is filtered by (lower case), or ``None``.
        storage_options: keyword arguments of the fsspec filesystem (remote URLs only).
        explain: called with a folder and its other files when none has a suffix; returns the
            error to raise instead of ``FileNotFoundError`` (e.g. "these shards are compressed").

    Returns:
        A :class:`Listing`; its ``root`` is the common folder of the arguments (a folder itself,
        a file's or a glob's folder).

    Raises:
        FileNotFoundError: a path does not exist, or a folder/pattern matches no file.
        TypeError, ValueError: ``paths`` is empty or mixes local paths and URLs.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "b.txt").write_text("hi"); _ = (d / "a.txt").write_text("")
        >>> listing = resolve("demo", str(d), (".txt",))
        >>> [pathlib.Path(f.path).name for f in listing.infos], listing.root == str(d)
        (['a.txt', 'b.txt'], True)
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
    out: list[FileInfo] = []
    bases: list[str] = []
    if remote == {False}:
        for n in names:
            found, base = _resolve_local(op, n[len("file://"):] if n.startswith("file://") else n, suffixes, explain)
            out += found
            bases.append(base)
        return Listing(tuple(out), None, common_root(bases))
    fsspec = optional_import("fsspec", "remote", op)
    protocol = None
    for n in names:
        fs, p = fsspec.core.url_to_fs(n, **(storage_options or {}))
        protocol = protocol or n.split("://", 1)[0]
        found, base = _resolve_remote(op, fs, n, p, suffixes, explain)
        out += found
        bases.append(base)
    return Listing(tuple(out), protocol, common_root(bases))
