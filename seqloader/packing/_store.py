"""Index files: a JSON header and raw numpy arrays in one file, written atomically, checked on load.

A file is data, never code. Its layout is that of safetensors: 8 bytes (little-endian) giving the
header's size, the header (UTF-8 JSON), then the arrays' bytes; the header gives each array's
dtype (integers and bools only), shape, offset from the end of the header, size and checksum.
Loading maps the file and views the arrays in place (``numpy.frombuffer``): no pickle, no copy;
the checksums are the one pass over the data. A file is written under a temporary name beside its target and renamed over it (atomic on
POSIX), so a reader sees a whole file or none.

Its *name* comes from the index's *location* (the op, its parameters, and where its input comes
from: file paths, the pipeline's shape); its header records the *content* it was built from
(the input files' sizes and versions, the checksum of given lengths, digests of the functions of
the pipeline) and a checksum of every array (:func:`array_digest`). :func:`load` returns the
arrays only when the header's content equals the expected one and every checksum matches;
otherwise it warns, naming the file and what differs ("stale": the input changed; "damaged": a
checksum, a shape or the format is wrong), and returns ``None``: the caller rebuilds and
overwrites the file.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import warnings
import zlib
from typing import Any, Optional

import numpy as np

from seqloader.sources._cache_files import user_cache_dir, write_atomically

__all__ = ["FORMAT", "VERSION", "array_digest", "default_dir", "file_for", "json_digest", "load", "save"]

FORMAT = "seqloader.packing_index"
VERSION = 1
#: Array data starts at multiples of this many bytes from the end of the header.
ALIGN = 64


def json_digest(value: Any) -> str:
    """32 hex digits of SHA-256 over ``value`` as canonical JSON.

    Example:
        >>> json_digest({"b": 1, "a": [2]}) == json_digest({"a": [2], "b": 1})
        True
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def array_digest(a: np.ndarray) -> str:
    """A checksum of an array: its dtype, shape and the CRC-32 of its bytes.

    A checksum, not a cryptographic digest (whoever can rewrite the arrays can rewrite the header
    too): it detects any change of one entry for certain and other accidental changes with
    probability ``1 - 2**-32``, at several GB/s, so that checking the index of 10**7 documents
    takes milliseconds.

    Example:
        >>> array_digest(np.arange(3)) == array_digest(np.array([0, 1, 2]))
        True
        >>> array_digest(np.arange(3)) == array_digest(np.arange(3, dtype=np.int32))
        False
        >>> array_digest(np.array([1, 2])) == array_digest(np.array([2, 1]))
        False
    """
    c = np.ascontiguousarray(a)
    return f"{c.dtype.str}{list(c.shape)}:crc32={zlib.crc32(c.data):08x}"


def default_dir() -> str:
    """``<user cache dir>/packing`` (``$SEQLOADER_CACHE``, else ``$XDG_CACHE_HOME/seqloader``, ...)."""
    return os.path.join(user_cache_dir(), "packing")


def file_for(op: str, location: dict[str, Any], cache_dir: Optional[str]) -> str:
    """The index file of an op at ``location`` in ``cache_dir`` (default :func:`default_dir`)."""
    return os.path.join(cache_dir or default_dir(), f"{op}-{json_digest(location)[:24]}.index")


def save(path: str, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write ``header`` and ``arrays`` (their layout and checksums added to the header) to ``path`` atomically.

    Raises:
        OSError: the folder cannot be created or written.
    """
    layout, offset = {}, 0
    blobs = {k: np.ascontiguousarray(a) for k, a in arrays.items()}
    for k, a in blobs.items():
        layout[k] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset, "nbytes": a.nbytes,
                     "checksum": array_digest(a)}
        offset += -(-a.nbytes // ALIGN) * ALIGN
    text = json.dumps({**header, "format": FORMAT, "version": VERSION, "arrays": layout}, sort_keys=True).encode()
    text += b" " * (-(len(text) + 8) % ALIGN)
    def write(f: Any) -> None:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in blobs.values():
            f.write(a.data)
            f.write(b"\0" * (-a.nbytes % ALIGN))

    write_atomically(path, write)


def _ignore(op: str, path: str, why: str) -> None:
    warnings.warn(f"{op}: ignoring the index file {path} ({why}); rebuilding it", RuntimeWarning, stacklevel=4)


def _parse(raw: Any) -> tuple[dict[str, Any], int]:
    """The header of a file's bytes and where its data starts.

    Raises:
        ValueError: the bytes do not start with a JSON header of this format and version.
    """
    if len(raw) < 8:
        raise ValueError(f"{len(raw)} bytes, too short")
    (size,) = struct.unpack("<Q", raw[:8])
    if size > len(raw) - 8:
        raise ValueError(f"a header of {size} bytes in a file of {len(raw)}")
    header = json.loads(bytes(raw[8:8 + size]).decode())
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} file of version {VERSION}")
    return header, 8 + size


def _view(raw: Any, start: int, d: Any) -> np.ndarray:
    """The array that the layout ``d`` describes in ``raw`` (read-only, in place).

    Raises:
        ValueError: a bad layout, or data past the end of the file.
    """
    dtype = np.dtype(d["dtype"])
    if dtype.kind not in "biu":
        raise ValueError(f"dtype {dtype} is not an integer or bool dtype")
    shape = tuple(int(x) for x in d["shape"])
    count = int(np.prod(shape, dtype=np.int64))
    lo = start + int(d["offset"])
    if int(d["nbytes"]) != count * dtype.itemsize or lo < start or lo + int(d["nbytes"]) > len(raw):
        raise ValueError("its data lies outside the file")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=lo).reshape(shape)


def load(op: str, path: str, location: dict[str, Any], content: dict[str, Any],
         names: tuple[str, ...]) -> Optional[dict[str, Any]]:
    """The header (key ``"header"``) and arrays ``names`` of the index file at ``path``, or ``None``.

    ``None`` silently when there is no file; ``None`` with a ``RuntimeWarning`` naming the file
    when it is unreadable, not an index of this format and version, built for another location
    or content (stale), or when an array is missing or differs from its checksum (damaged).
    """
    try:
        with open(path, "rb") as f:
            raw: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        _ignore(op, path, f"unreadable: {exc}")
        return None
    try:
        header, start = _parse(raw)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        _ignore(op, path, f"damaged: not a readable index file ({exc})")
        return None
    if header.get("location") != location:
        _ignore(op, path, "stale: built for another op, parameters or input")
        return None
    saved = header.get("content")
    if saved != content:
        keys = sorted(k for k in set(content) | set(saved or {}) if (saved or {}).get(k) != content.get(k))
        _ignore(op, path, f"stale: built from another input ({', '.join(keys)} changed)")
        return None
    layout = header.get("arrays")
    arrays: dict[str, Any] = {}
    for k in names:
        d = layout.get(k) if isinstance(layout, dict) else None
        if not isinstance(d, dict):
            _ignore(op, path, f"damaged: array {k!r} is missing")
            return None
        try:
            a = _view(raw, start, d)
        except (ValueError, TypeError, KeyError) as exc:
            _ignore(op, path, f"damaged: array {k!r}: {exc}")
            return None
        if array_digest(a) != d.get("checksum"):
            _ignore(op, path, f"damaged: array {k!r} differs from its checksum")
            return None
        arrays[k] = a
    arrays["header"] = header
    return arrays
