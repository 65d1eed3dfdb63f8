"""Index files: numpy arrays and a JSON header in one ``.npz``, written atomically, checked on load.

A file is data, never code: ``numpy.savez`` of int arrays plus a ``header`` array holding UTF-8
JSON, read back with ``numpy.load(allow_pickle=False)``. It is written under a temporary name
beside its target and renamed over it (atomic on POSIX), so a reader sees a whole file or none.

Its *name* comes from the index's *location* (the op, its parameters, and where its input comes
from: file paths, the pipeline's shape); its header records the *content* it was built from
(the input files' sizes and versions, the digests of given lengths or of the functions of the
pipeline) and a SHA-256 digest of every array. :func:`load` returns the arrays only when the
header's content equals the expected one and every digest matches; otherwise it warns, naming
the file and what differs ("stale": the input changed; "damaged": a digest, a shape or the
format is wrong), and returns ``None``: the caller rebuilds and overwrites the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import uuid
import warnings
import zipfile
from typing import Any, Optional, cast

import numpy as np

from seqloader.sources._tar_index import user_cache_dir

__all__ = ["FORMAT", "VERSION", "array_digest", "default_dir", "file_for", "json_digest", "load", "save"]

FORMAT = "seqloader.packing_index"
VERSION = 1


def json_digest(value: Any) -> str:
    """32 hex digits of SHA-256 over ``value`` as canonical JSON.

    Example:
        >>> json_digest({"b": 1, "a": [2]}) == json_digest({"a": [2], "b": 1})
        True
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def array_digest(a: np.ndarray) -> str:
    """32 hex digits of SHA-256 over an array's dtype, shape and bytes (no copy when contiguous).

    Example:
        >>> array_digest(np.arange(3)) == array_digest(np.array([0, 1, 2]))
        True
        >>> array_digest(np.arange(3)) == array_digest(np.arange(3, dtype=np.int32))
        False
    """
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()[:32]


def default_dir() -> str:
    """``<user cache dir>/packing`` (``$SEQLOADER_CACHE``, else ``$XDG_CACHE_HOME/seqloader``, ...)."""
    return os.path.join(user_cache_dir(), "packing")


def file_for(op: str, location: dict[str, Any], cache_dir: Optional[str]) -> str:
    """The index file of an op at ``location`` in ``cache_dir`` (default :func:`default_dir`)."""
    return os.path.join(cache_dir or default_dir(), f"{op}-{json_digest(location)[:24]}.npz")


def save(path: str, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` and ``header`` (with the arrays' digests added) to ``path`` atomically.

    Raises:
        OSError: the folder cannot be created or written.
    """
    header = {**header, "format": FORMAT, "version": VERSION,
              "arrays": {k: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": array_digest(a)}
                         for k, a in arrays.items()}}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    blob = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, header=blob, **cast(Any, arrays))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _ignore(op: str, path: str, why: str) -> None:
    warnings.warn(f"{op}: ignoring the index file {path} ({why}); rebuilding it", RuntimeWarning, stacklevel=4)


def load(op: str, path: str, location: dict[str, Any], content: dict[str, Any], names: tuple[str, ...]) -> Optional[dict[str, Any]]:
    """The header (key ``"header"``) and arrays ``names`` of the index file at ``path``, or ``None``.

    ``None`` silently when there is no file; ``None`` with a ``RuntimeWarning`` naming the file
    when it is unreadable, not an index of this format and version, built for another location
    or content (stale), or when an array is missing or differs from its digest (damaged).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        _ignore(op, path, f"unreadable: {exc}")
        return None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            arrays = {k: z[k] for k in names if k in z.files}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError, EOFError) as exc:
        _ignore(op, path, f"damaged: not a readable index file ({type(exc).__name__}: {exc})")
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        _ignore(op, path, f"damaged: not a {FORMAT} file of version {VERSION}")
        return None
    if header.get("location") != location:
        _ignore(op, path, "stale: built for another op, parameters or input")
        return None
    saved = header.get("content")
    if saved != content:
        keys = sorted(k for k in set(content) | set(saved or {}) if (saved or {}).get(k) != content.get(k))
        _ignore(op, path, f"stale: built from another input ({', '.join(keys)} changed)")
        return None
    described = header.get("arrays")
    for k in names:
        a, d = arrays.get(k), (described or {}).get(k)
        if a is None or not isinstance(d, dict):
            _ignore(op, path, f"damaged: array {k!r} is missing")
            return None
        if a.dtype.str != d.get("dtype") or list(a.shape) != d.get("shape") or array_digest(a) != d.get("sha256"):
            _ignore(op, path, f"damaged: array {k!r} differs from its digest")
            return None
    arrays["header"] = header
    return arrays
