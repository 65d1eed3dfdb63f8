"""Files seqloader writes beside data or in the user's cache folder: where, and how, atomically.

An index cache (a tar shard's member offsets, a pack's count index) is written under a temporary
name in the target's folder and renamed over the target (atomic on POSIX), so a process that
reads it, another rank building the same file included, sees a whole file or none.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import BinaryIO, Callable

__all__ = ["user_cache_dir", "write_atomically"]


def user_cache_dir() -> str:
    """``$SEQLOADER_CACHE``, else ``$XDG_CACHE_HOME/seqloader``, else ``~/.cache/seqloader``."""
    if os.environ.get("SEQLOADER_CACHE"):
        return os.environ["SEQLOADER_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "seqloader")


def write_atomically(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Create ``path``'s folder if needed, call ``write(f)`` on a temporary file beside ``path``,
    then rename it to ``path``; on any error the temporary file is removed and the error raised.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "sub", "index.bin")
        >>> write_atomically(path, lambda f: f.write(b"data"))
        >>> open(path, "rb").read(), sorted(os.listdir(os.path.dirname(path)))
        (b'data', ['index.bin'])
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
