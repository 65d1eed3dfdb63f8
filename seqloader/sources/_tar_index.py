"""The index of one tar shard in the webdataset layout, built in one pass: :func:`scan`.

A shard holds samples as consecutive members sharing a *key*: ``a/000123.jpg``,
``a/000123.json`` is sample ``a/000123`` with fields ``jpg`` and ``json`` (the key is the
member name up to the first dot of its base name, the field the rest, lower-cased: webdataset's
rule). :func:`scan` reads the member headers with the standard library's ``tarfile`` (a local
shard is read header by header, seeking over the data; a remote one is streamed once) and
returns a :class:`ShardIndex`: per sample its key, and per field the data offset and size
(``-1``: the sample has no such member).

What a scan refuses, naming the shard and the offset: a compressed shard, a header that does
not parse (tar's only checksum is the header's), a member that runs past the end of the file,
an archive that stops without its end-of-archive marker (two zero blocks, which every writer
emits: a shard without them was cut short, possibly at a member boundary), a sample with two
members of one field, and a key that comes back after other keys (its members are not
consecutive, so it would be read as two half-samples).

The index keeps *probes*: the SHA-256 of the 512-byte header blocks of a few members (the
first, the last and one between), read again when a cached index is loaded, and a *digest* of
its whole member table, which a cached copy must reproduce and which is the shard's content in
a fingerprint (:mod:`seqloader.sources._tar_cache`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tarfile
from typing import Any, Callable

import numpy as np

from seqloader.sources._storage import Files

__all__ = ["ShardIndex", "scan", "read_probes", "compression_of", "compressed_error", "PROBES"]

_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
#: The first bytes of compressed files: gzip, bzip2, xz, zstd, lz4.
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
          b"\x04\x22\x4d\x18": "lz4"}
COMPRESSED_SUFFIXES = {".gz": "gzip", ".tgz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".lz4": "lz4"}
#: Member headers read again when a cached index is loaded.
PROBES = 3
BLOCK = 512
#: Bytes accepted from the end-of-archive marker to the end of the file: the marker (two zero blocks) and
#: the padding to a record of 10,240 bytes (tar's default, and tarfile's, webdataset's, bsdtar's).
MAX_TAIL = 2 * BLOCK + 10240


@dataclasses.dataclass
class ShardIndex:
    """Samples of one shard: ``keys[j]``, and ``offsets[e, j]``/``sizes[e, j]`` of field ``exts[e]``;
    ``probes``: ``[[header offset, sha256 hex of its 512 bytes], ...]``."""

    keys: np.ndarray      # str, one per sample
    exts: list[str]
    offsets: np.ndarray   # int64 [len(exts), len(keys)], -1 where a sample lacks the field
    sizes: np.ndarray     # int64, same shape
    probes: list[list[Any]]
    _digest: str | None = dataclasses.field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.keys)

    def table(self) -> dict[str, Any]:
        """The member table as JSON types (what the digest covers)."""
        return {"keys": self.keys.tolist(), "exts": list(self.exts), "offsets": self.offsets.tolist(),
                "sizes": self.sizes.tolist(), "probes": [list(p) for p in self.probes]}

    def digest(self) -> str:
        """16 hex digits of SHA-256 over the member table and the probes (computed once)."""
        if self._digest is None:
            text = json.dumps(self.table(), separators=(",", ":"), sort_keys=True)
            self._digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._digest

    def header_offsets(self) -> list[int]:
        """The header offsets to probe: the first member, the last, and evenly spaced ones between."""
        present = np.sort(self.offsets[self.offsets >= 0])
        n = int(present.size)
        picks = range(n) if n <= PROBES else sorted({round(i * (n - 1) / (PROBES - 1)) for i in range(PROBES)})
        return [int(present[i]) - BLOCK for i in picks]


def compression_of(path: str, head: bytes) -> str | None:
    """The compression of a shard from its first bytes or its suffix, or ``None``.

    Example:
        >>> compression_of("a.tar", b"\\x1f\\x8b..."), compression_of("a.tar.zst", b""), compression_of("a.tar", b"x")
        ('gzip', 'zstd', None)
    """
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    lower = path.lower()
    return next((name for suf, name in COMPRESSED_SUFFIXES.items() if lower.endswith(suf)), None)


def compressed_error(op: str, path: str, kind: str) -> ValueError:
    return ValueError(f"{op}: {path} is a {kind}-compressed tar, which cannot be read at random positions "
                      "(a compressed stream has no offsets); decompress the shards (e.g. `gunzip`) or write "
                      "them uncompressed, compressing each member instead (.jpg, .npy.gz)")


def _open_stream(files: Files, k: int) -> Any:
    path = files.infos[k].path
    if files.remote:
        return files.fs().open(path, "rb", block_size=8 << 20, cache_type="readahead", size=files.infos[k].size)
    return open(path, "rb")


Reader = Callable[[int, int], bytes]


def read_probes(read: Reader, offsets: list[int]) -> list[list[Any]]:
    """``[[offset, sha256 hex], ...]`` of the 512-byte blocks at ``offsets`` (``read(start, end)``)."""
    return [[o, hashlib.sha256(read(o, o + BLOCK)).hexdigest()[:16]] for o in offsets]


def _reader(f: Any) -> Reader:
    """``read(start, end)`` through the open stream ``f`` (a remote one serves it from its read-ahead)."""
    def read(start: int, end: int) -> bytes:
        f.seek(start)
        data: bytes = f.read(end - start)
        return data
    return read


def _check_end(op: str, files: Files, k: int, end: int, read: Reader) -> None:
    """Raise unless the archive has its end-of-archive marker (two zero blocks) at ``end``, and
    nothing but zeros (a writer's padding to its record size, at most :data:`MAX_TAIL` bytes) after."""
    path, size = files.infos[k].path, files.infos[k].size
    rest = read(end, min(size, end + MAX_TAIL)) if end < size else b""
    nonzero = len(rest) - len(rest.lstrip(b"\0"))
    if nonzero < len(rest):
        if nonzero < 2 * BLOCK:
            raise ValueError(f"{op}: {path} is corrupt at offset {end} (an invalid member header); "
                             "rewrite or remove this shard")
        raise ValueError(f"{op}: {path} holds data at offset {end + nonzero}, after its end-of-archive marker "
                         f"(at offset {end}): the shard is damaged or two archives were concatenated; rewrite it")
    if size - end > MAX_TAIL:
        raise ValueError(f"{op}: {path} stops at offset {end}, {size - end} bytes before the end of the file (a zero "
                         f"block, then more than the end-of-archive marker and a record's padding, {MAX_TAIL} bytes): "
                         "its end was zeroed (a crash?), two archives were concatenated, or it was written with a "
                         "larger blocking factor; write it again (with tar's default record size)")
    if len(rest) < 2 * BLOCK:
        raise ValueError(f"{op}: {path} is truncated: the archive stops at offset {end} without its "
                         f"end-of-archive marker (two zero blocks; {len(rest)} of {2 * BLOCK} bytes there): "
                         "the shard was cut short (an interrupted copy or download?); copy or write it again")


def scan(op: str, files: Files, k: int) -> ShardIndex:
    """Read the member headers of shard ``k`` once and group them into samples.

    Raises:
        ValueError: the shard is compressed, not a tar, corrupt or truncated (naming the shard and
            the offset), has a key twice with one field, or a key whose members are not consecutive.
    """
    info = files.infos[k]
    if not files.remote:  # (a remote shard was listed a moment ago)
        files.check(k)
    keys: list[str] = []
    seen: set[str] = set()
    fields: list[dict[str, tuple[int, int]]] = []
    exts: dict[str, None] = {}
    f = _open_stream(files, k)
    offset = 0
    try:
        head = f.read(BLOCK)
        f.seek(0)
        kind = compression_of(info.path, head)
        if kind is not None:
            f.close()
            raise compressed_error(op, info.path, kind)
        with f, tarfile.open(fileobj=f, mode="r|" if files.remote else "r:") as tf:
            while True:
                try:
                    m = tf.next()
                except (tarfile.ReadError, EOFError, ValueError) as exc:  # a bad header or a short read
                    raise ValueError(f"{op}: {info.path} is corrupt at offset {tf.offset} ({exc}); "
                                     "rewrite or remove this shard") from None
                if m is None:  # tarfile stops at a zero block, at the end of the file, or at a bad header
                    _check_end(op, files, k, tf.offset, _reader(f))
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
                    if key in seen:
                        raise ValueError(f"{op}: {info.path}: the members of sample {key!r} are not consecutive "
                                         f"({m.name!r} at offset {m.offset} comes after other samples); write each "
                                         "sample's members together, as webdataset's TarWriter does")
                    seen.add(key)
                    keys.append(key)
                    fields.append({})
                if ext in fields[-1]:
                    raise ValueError(f"{op}: {info.path}: sample {key!r} has two {ext!r} members (the second at "
                                     f"offset {m.offset}); keys must be unique within a shard")
                fields[-1][ext] = (m.offset_data, m.size)
                exts.setdefault(ext)
            index = _index(keys, fields, exts)
            index.probes = read_probes(_reader(f), index.header_offsets())
    except tarfile.ReadError as exc:  # the first header is not a tar header
        raise ValueError(f"{op}: {info.path} is not a tar file or is corrupt at offset {offset} ({exc})") from None
    return index


def _index(keys: list[str], fields: list[dict[str, tuple[int, int]]], exts: dict[str, None]) -> ShardIndex:
    names = list(exts)
    offsets = np.full((len(names), len(keys)), -1, dtype=np.int64)
    sizes = np.full((len(names), len(keys)), -1, dtype=np.int64)
    for e, name in enumerate(names):
        for j, fs in enumerate(fields):
            if name in fs:
                offsets[e, j], sizes[e, j] = fs[name]
    return ShardIndex(np.array(keys, dtype=str), names, offsets, sizes, [])
