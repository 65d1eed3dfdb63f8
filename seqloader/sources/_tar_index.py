"""The index of one tar shard in the webdataset layout, built in one pass and cached as JSON.

A shard holds samples as consecutive members sharing a *key*: ``a/000123.jpg``,
``a/000123.json`` is sample ``a/000123`` with fields ``jpg`` and ``json`` (the key is the
member name up to the first dot of its base name, the field the rest, lower-cased: webdataset's
rule). :func:`scan` reads the member headers with the standard library's ``tarfile`` (a local
shard is read header by header, seeking over the data; a remote one is streamed once) and
returns a :class:`ShardIndex`: per sample its key, and per field the data offset and size
(``-1``: the sample has no such member).

Cache files are data, never code: JSON, written under a temporary name and renamed over the
target (atomic on POSIX), so a process that reads the cache sees a whole index or none. A cache
entry records the shard's size and version (mtime or ETag) and is used only while both match;
otherwise the shard is scanned again and the entry replaced. It is stored beside the shard
(``.<name>.seqloader-index.json``) when that folder is writable, else in the user cache folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tarfile
import threading
import uuid
from typing import Any

import numpy as np

from seqloader.sources._storage import FileInfo, Files

__all__ = ["ShardIndex", "scan", "load_or_scan", "cache_path", "user_cache_dir", "FORMAT", "VERSION"]

FORMAT = "seqloader.tar_index"
VERSION = 1
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
#: The first bytes of compressed files: gzip, bzip2, xz, zstd, lz4.
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
          b"\x04\x22\x4d\x18": "lz4"}
_COMPRESSED_SUFFIXES = {".gz": "gzip", ".tgz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".lz4": "lz4"}


@dataclasses.dataclass
class ShardIndex:
    """Samples of one shard: ``keys[j]``, and ``offsets[e, j]``/``sizes[e, j]`` of field ``exts[e]``."""

    keys: np.ndarray      # str, one per sample
    exts: list[str]
    offsets: np.ndarray   # int64 [len(exts), len(keys)], -1 where a sample lacks the field
    sizes: np.ndarray     # int64, same shape

    def __len__(self) -> int:
        return len(self.keys)

    def to_json(self, info: FileInfo) -> dict:
        return {"format": FORMAT, "version": VERSION, "path": info.path, "size": info.size,
                "file_version": info.version, "keys": self.keys.tolist(), "exts": self.exts,
                "offsets": self.offsets.tolist(), "sizes": self.sizes.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> ShardIndex:
        n, e = len(d["keys"]), len(d["exts"])
        return cls(np.array(d["keys"], dtype=str), list(d["exts"]),
                   np.array(d["offsets"], dtype=np.int64).reshape(e, n), np.array(d["sizes"], dtype=np.int64).reshape(e, n))


def compression_of(path: str, head: bytes) -> str | None:
    """The compression of a shard from its suffix or first bytes, or ``None``."""
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    lower = path.lower()
    return next((name for suf, name in _COMPRESSED_SUFFIXES.items() if lower.endswith(suf)), None)


def _compressed_error(op: str, path: str, kind: str) -> ValueError:
    return ValueError(f"{op}: {path} is a {kind}-compressed tar, which cannot be read at random positions "
                      "(a compressed stream has no offsets); decompress the shards (e.g. `gunzip`) or write "
                      "them uncompressed, compressing each member instead (.jpg, .npy.gz)")


def _open_stream(files: Files, k: int) -> Any:
    path = files.infos[k].path
    if files.remote:
        return files.fs().open(path, "rb", block_size=8 << 20, cache_type="readahead", size=files.infos[k].size)
    return open(path, "rb")


def scan(op: str, files: Files, k: int) -> ShardIndex:
    """Read the member headers of shard ``k`` once and group them into samples.

    Raises:
        ValueError: the shard is compressed, not a tar, corrupt or truncated (naming the shard and
            the offset), or a sample has two members with the same field.
    """
    info = files.infos[k]
    if not files.remote:  # (a remote shard was listed a moment ago)
        files.check(k)
    keys: list[str] = []
    fields: list[dict[str, tuple[int, int]]] = []
    exts: dict[str, None] = {}
    f = _open_stream(files, k)
    offset = 0
    try:
        head = f.read(512)
        f.seek(0)
        kind = compression_of(info.path, head)
        if kind is not None:
            f.close()
            raise _compressed_error(op, info.path, kind)
        with f, tarfile.open(fileobj=f, mode="r|" if files.remote else "r:") as tf:
            while True:
                try:
                    m = tf.next()
                except (tarfile.ReadError, EOFError, ValueError) as exc:  # a bad header or a short read
                    raise ValueError(f"{op}: {info.path} is corrupt at offset {tf.offset} ({exc}); "
                                     "rewrite or remove this shard") from None
                if m is None:
                    end = tf.offset  # tarfile also stops at a header it cannot parse: the end must be zeros
                    rest = files.read(k, end, min(end + 512, info.size), check=False) if end < info.size else b""
                    if rest.strip(b"\0"):
                        raise ValueError(f"{op}: {info.path} is corrupt at offset {end} (an invalid member header); "
                                         "rewrite or remove this shard")
                    break
                offset = m.offset
                if m.offset_data + m.size > info.size:
                    raise ValueError(f"{op}: {info.path} is truncated: member {m.name!r} at offset {m.offset} "
                                     f"needs {m.offset_data + m.size} bytes, the file has {info.size}")
                if not m.isfile():
                    continue
                match = _KEY_EXT.match(m.name)
                if match is None:
                    continue
                key, ext = match.group(1), match.group(2).lower()
                if not keys or keys[-1] != key:
                    keys.append(key)
                    fields.append({})
                if ext in fields[-1]:
                    raise ValueError(f"{op}: {info.path}: sample {key!r} has two {ext!r} members (the second at "
                                     f"offset {m.offset}); keys must be unique within a shard")
                fields[-1][ext] = (m.offset_data, m.size)
                exts.setdefault(ext)
    except tarfile.ReadError as exc:  # the first header is not a tar header
        raise ValueError(f"{op}: {info.path} is not a tar file or is corrupt at offset {offset} ({exc})") from None
    names = list(exts)
    offsets = np.full((len(names), len(keys)), -1, dtype=np.int64)
    sizes = np.full((len(names), len(keys)), -1, dtype=np.int64)
    for e, name in enumerate(names):
        for j, fs in enumerate(fields):
            if name in fs:
                offsets[e, j], sizes[e, j] = fs[name]
    return ShardIndex(np.array(keys, dtype=str), names, offsets, sizes)


def user_cache_dir() -> str:
    """``$SEQLOADER_CACHE``, else ``$XDG_CACHE_HOME/seqloader``, else ``~/.cache/seqloader``."""
    if os.environ.get("SEQLOADER_CACHE"):
        return os.environ["SEQLOADER_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "seqloader")


def cache_path(info: FileInfo, remote: bool, cache_dir: str | None) -> list[str]:
    """Where the index of a shard may be cached, in the order tried: beside a local shard (when
    no ``cache_dir`` is given), then ``cache_dir`` (default :func:`user_cache_dir`)."""
    digest = hashlib.sha256(info.path.encode()).hexdigest()[:24]
    name = info.path.rsplit("/", 1)[-1]
    out = []
    if not remote and cache_dir is None:
        out.append(os.path.join(os.path.dirname(info.path), f".{name}.seqloader-index.json"))
    out.append(os.path.join(cache_dir or os.path.join(user_cache_dir(), "tar-index"), f"{digest}-{name}.json"))
    return out


def _load(path: str, info: FileInfo) -> ShardIndex | None:
    """The cached index at ``path`` if it is whole and matches ``info`` (size, version, path)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if (d.get("format") != FORMAT or d.get("version") != VERSION or d.get("path") != info.path
                or d.get("size") != info.size or d.get("file_version") != info.version):
            return None
        return ShardIndex.from_json(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or not ours: scan again and replace it


def write_atomic(path: str, data: dict) -> None:
    """Write ``data`` as JSON to a temporary name beside ``path``, then rename it to ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_or_scan(op: str, files: Files, k: int, cache_dir: str | None, use_cache: bool) -> tuple[ShardIndex, str]:
    """The index of shard ``k`` and how it was obtained (``"cached"`` or ``"scanned"``)."""
    info = files.infos[k]
    places = cache_path(info, files.remote, cache_dir) if use_cache else []
    for p in places:
        index = _load(p, info)
        if index is not None:
            return index, "cached"
    index = scan(op, files, k)
    for p in places:
        try:
            write_atomic(p, index.to_json(info))
            break
        except OSError:
            continue  # not writable here: try the next place
    return index, "scanned"
