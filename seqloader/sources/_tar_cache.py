"""The cache of tar shard indexes: JSON files, validated fully before they are trusted.

Cache files are data, never code: JSON, written under a temporary name and renamed over the
target (atomic on POSIX), so a process that reads the cache sees a whole index or none. An index
is cached beside the shard (``.<name>.seqloader-index.json``) when that folder is writable, else
in ``cache_dir`` (default :func:`user_cache_dir`); when it can be written nowhere, a warning says
so once (every build will scan the shards again) and names the folders and the option.

A cached index is used only when

* it is a whole index of this format and version, for this path, size and validator (inode and
  ctime locally, ETag or version id remotely): otherwise it is stale and replaced silently;
* every value has its type and range: keys are unique strings, offsets are 512-byte aligned,
  members do not overlap and stay in file order before the end-of-archive marker, the digest of
  the member table is reproduced;
* the probed member headers (:data:`~seqloader.sources._tar_index.PROBES` reads of 512 bytes)
  still hash as they did when the shard was scanned. (Not on object storage, where the ETag or
  version id already changes with every write: there, probes would cost a range request each.)

A file that fails the last two checks was damaged or tampered with: it is ignored with a warning
naming it, and the shard is scanned again. Nothing in a cache file can make a source return
other bytes than the shard's.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from typing import Any

import numpy as np

from seqloader.sources._cache_files import user_cache_dir, write_atomically
from seqloader.sources._listing import FileInfo, content_identity
from seqloader.sources._progress import log
from seqloader.sources._storage import Files
from seqloader.sources._tar_index import BLOCK, ShardIndex, read_probes, scan

__all__ = ["load_or_scan", "cache_paths", "user_cache_dir", "parse", "FORMAT", "VERSION"]

FORMAT = "seqloader.tar_index"
#: 2: validators with inode and ctime, probes and a digest of the member table.
VERSION = 2
_WARNED: set[tuple[int, tuple[str, ...]]] = set()
_WARN_LOCK = threading.Lock()


class Doubt(ValueError):
    """A cache file that is not a valid index (the reason is the message)."""


def cache_paths(info: FileInfo, remote: bool, cache_dir: str | None) -> list[str]:
    """Where the index of a shard may be cached, in the order tried: beside a local shard (when
    no ``cache_dir`` is given), then ``cache_dir`` (default :func:`user_cache_dir`)."""
    digest = hashlib.sha256(info.path.encode()).hexdigest()[:24]
    name = info.path.rsplit("/", 1)[-1]
    out = []
    if not remote and cache_dir is None:
        out.append(os.path.join(os.path.dirname(info.path), f".{name}.seqloader-index.json"))
    out.append(os.path.join(cache_dir or os.path.join(user_cache_dir(), "tar-index"), f"{digest}-{name}.json"))
    return out


def _list(d: dict, key: str, n: int | None = None) -> list:
    v = d.get(key)
    if type(v) is not list or (n is not None and len(v) != n):
        raise Doubt(f"{key!r} is not a list" + ("" if n is None else f" of {n} entries"))
    return v


def _int_rows(rows: list, what: str, n: int, lo: int, hi: int) -> np.ndarray:
    """``rows`` (``len(rows)`` lists of ``n`` ints in ``[lo, hi]``) as an int64 array, or :class:`Doubt`."""
    shape = (len(rows), n)
    if not all(type(row) is list and len(row) == n for row in rows):
        raise Doubt(f"{what!r} is not a table of {shape[0]} x {n} ints")
    if not rows or not n:
        return np.zeros(shape, dtype=np.int64)
    try:
        arr = np.array(rows)
    except (ValueError, TypeError, OverflowError):
        raise Doubt(f"{what!r} is not a table of ints") from None
    if arr.shape != shape or arr.dtype.kind not in "iub":  # (floats, strings, ints past int64, nesting)
        raise Doubt(f"{what!r} is not a table of {shape[0]} x {n} ints")
    arr = arr.astype(np.int64)
    if arr.min() < lo or arr.max() > hi:
        raise Doubt(f"{what!r} holds {int(arr.min() if arr.min() < lo else arr.max())}, outside [{lo}, {hi}]")
    return arr


def parse(d: Any, info: FileInfo) -> ShardIndex | None:
    """The index a cache entry holds; ``None`` when it is stale (another version, path, size or
    validator); :class:`Doubt` when it is not a valid index of a file of ``info.size`` bytes."""
    if type(d) is not dict:
        raise Doubt(f"a JSON {type(d).__name__}, not an object")
    if d.get("format") != FORMAT:
        raise Doubt(f"format {str(d.get('format'))[:40]!r}, not {FORMAT!r}")
    if type(d.get("version")) is not int:
        raise Doubt("no int version")
    if d["version"] != VERSION or d.get("path") != info.path or d.get("size") != info.size \
            or d.get("file_version") != info.version:
        return None
    size = info.size
    keys = _list(d, "keys")
    if len(keys) > size // BLOCK or not all(type(k) is str for k in keys) or len(set(keys)) != len(keys):
        raise Doubt("'keys' are not unique strings, one per sample")
    exts = _list(d, "exts")
    if not all(type(e) is str for e in exts) or len(set(exts)) != len(exts) or (keys and not exts):
        raise Doubt("'exts' are not unique strings")
    n, e = len(keys), len(exts)
    offsets = _int_rows(_list(d, "offsets", e), "offsets", n, -1, size)
    sizes = _int_rows(_list(d, "sizes", e), "sizes", n, -1, size)
    _check_layout(offsets, sizes, size)
    probes = _list(d, "probes")
    index = ShardIndex(np.array(keys, dtype=str), list(exts), offsets, sizes, probes)
    if not all(type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is str for p in probes) \
            or [p[0] for p in probes] != index.header_offsets():
        raise Doubt("'probes' are not the member headers an index probes")
    if d.get("digest") != index.digest():
        raise Doubt("its digest does not match its member table")
    return index


def _check_layout(offsets: np.ndarray, sizes: np.ndarray, size: int) -> None:
    """Members in file order, aligned, not overlapping, before the end-of-archive marker."""
    present = offsets >= 0
    if (present != (sizes >= 0)).any():
        raise Doubt("an offset and its size disagree on a missing member")
    if present.size and not present.any(axis=0).all():
        raise Doubt("a sample has no member")
    off, sz = offsets[present], sizes[present]
    sample = np.broadcast_to(np.arange(offsets.shape[1]), offsets.shape)[present]
    if ((off % BLOCK) != 0).any() or (off < BLOCK).any() or (off + sz > size - 2 * BLOCK).any():
        raise Doubt("a member's offset is not a data offset inside the archive")
    order = np.argsort(off, kind="stable")
    off, sz, sample = off[order], sz[order], sample[order]
    padded_end = off + (sz + BLOCK - 1) // BLOCK * BLOCK
    if (np.diff(sample) < 0).any() or (off[1:] < padded_end[:-1] + BLOCK).any():
        raise Doubt("members overlap or are out of file order")


def _load(path: str, info: FileInfo, files: Files, k: int) -> tuple[ShardIndex | None, str | None]:
    """``(index, None)``, ``(None, None)`` when absent or stale, ``(None, reason)`` when in doubt."""
    try:
        with open(path, "rb") as f:
            text = f.read(64 << 20)
    except OSError:
        return None, None
    try:
        index = parse(json.loads(text), info)
    except Doubt as exc:
        return None, str(exc)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:  # not JSON, too deep, an int of 5000 digits
        return None, f"not JSON ({type(exc).__name__}: {str(exc)[:80]})"
    if index is None or content_identity(info.version):   # (an ETag or version id changes with every write)
        return index, None
    try:
        probes = read_probes(lambda a, b: files.read(k, a, b, check=False), [p[0] for p in index.probes])
    except (OSError, RuntimeError) as exc:
        return None, f"its probes could not be read ({exc})"
    if probes != index.probes:
        bad = next(a[0] for a, b in zip(index.probes, probes) if a != b)
        return None, (f"the member header at offset {bad} differs from the one indexed, although the shard's "
                      "size and validator are the same")
    return index, None


def write_atomic(path: str, data: dict) -> None:
    """Write ``data`` as JSON to a temporary name beside ``path``, then rename it to ``path``."""
    text = json.dumps(data, separators=(",", ":")).encode()
    write_atomically(path, lambda f: f.write(text))


def to_json(index: ShardIndex, info: FileInfo) -> dict:
    return {"format": FORMAT, "version": VERSION, "path": info.path, "size": info.size,
            "file_version": info.version, **index.table(), "digest": index.digest()}


def _warn_unwritable(op: str, shard: str, failures: list[tuple[str, OSError]], explicit: bool) -> None:
    folders = tuple(os.path.dirname(p) for p, _ in failures)
    key = (os.getpid(), folders)
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    tried = "; ".join(f"{os.path.dirname(p)}: {exc.strerror or exc}" for p, exc in failures)
    fix = ("pass a writable cache_dir=" if explicit else
           "pass cache_dir= a writable folder, or set $SEQLOADER_CACHE to one")
    warnings.warn(f"{op}: cannot write the index cache of {shard} (tried {tried}); every build of this "
                  f"source scans its shards again (on object storage, a full read of each); {fix}",
                  UserWarning, stacklevel=2)


def load_or_scan(op: str, files: Files, k: int, cache_dir: str | None, use_cache: bool) -> tuple[ShardIndex, str]:
    """The index of shard ``k`` and how it was obtained (``"cached"`` or ``"scanned"``)."""
    info = files.infos[k]
    places = cache_paths(info, files.remote, cache_dir) if use_cache else []
    for p in places:
        index, doubt = _load(p, info, files, k)
        if index is not None:
            log.debug("%s: %s: index cached in %s", op, info.path, p)
            return index, "cached"
        if doubt is not None:
            warnings.warn(f"{op}: ignoring the cached index {p} of {info.path} ({doubt}); the shard is indexed "
                          "again and the cache file replaced", UserWarning, stacklevel=2)
    index = scan(op, files, k)
    failures: list[tuple[str, OSError]] = []
    for p in places:
        try:
            write_atomic(p, to_json(index, info))
            log.debug("%s: %s: scanned (%d samples), index cached in %s", op, info.path, len(index), p)
            break
        except OSError as exc:
            failures.append((p, exc))  # not writable here: try the next place
    else:
        if places:
            _warn_unwritable(op, info.path, failures, cache_dir is not None)
        log.debug("%s: %s: scanned (%d samples), not cached", op, info.path, len(index))
    return index, "scanned"

