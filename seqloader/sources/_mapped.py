"""Flat arrays in local files, memory-mapped once per process: :class:`MappedArrays`.

The token sources (:func:`~seqloader.megatron`, :func:`~seqloader.token_windows`) read their
files as 1-D numpy arrays of one dtype starting at a byte offset. :class:`MappedArrays` maps file
``k`` on first use in each process (at most :data:`~seqloader.sources._handles.MAX_OPEN` at
once, in the sources' one cache of open handles, dropped when pickled: STYLE, file handles
belong to a process) after checking it has the size and validator it was indexed with
(:meth:`~seqloader.sources._storage.Files.check`). The arrays it returns are read-only views of
the mapping; a source copies what it hands out, so items are writable and outlive the mapping.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from seqloader.sources._handles import HandleCache
from seqloader.sources._storage import Files

__all__ = ["Layout", "MappedArrays", "refuse_urls"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the array of one file is: ``count`` items of ``dtype`` from byte ``offset``."""

    offset: int
    dtype: str
    count: int


class MappedArrays:
    """This process's read-only arrays of ``files`` laid out as ``layouts`` (one per file). Picklable.

    Example:
        >>> import os, tempfile
        >>> from seqloader.sources._listing import resolve
        >>> path = os.path.join(tempfile.mkdtemp(), "t.bin")
        >>> np.arange(6, dtype=np.uint16).tofile(path)
        >>> files = Files("demo", resolve("demo", path, None))
        >>> arrays = MappedArrays(files, [Layout(4, "uint16", 4)])
        >>> arrays.get(0).tolist(), arrays.get(0).flags.writeable
        ([2, 3, 4, 5], False)
    """

    def __init__(self, files: Files, layouts: Sequence[Layout]):
        self.files = files
        self.layouts = tuple(layouts)
        self._maps: HandleCache[np.ndarray] = HandleCache()

    def _open(self, k: int) -> np.ndarray:
        lay = self.layouts[k]
        path = self.files.local_path(k)   # (checked: the size and validator of the index)
        if lay.count == 0:
            return np.empty(0, dtype=lay.dtype)
        mapped = np.memmap(path, dtype=lay.dtype, mode="r", offset=lay.offset, shape=(lay.count,))
        return mapped.view(np.ndarray)   # (a plain array: slices and fancy indexing stay ndarrays)

    def get(self, k: int, check: bool = True) -> np.ndarray:
        """File ``k``'s array in this process, mapped on first use; ``check``: ``stat`` the file
        first (``RuntimeError`` naming it when it changed since it was indexed)."""
        if check:
            self.files.check(k)
        return self._maps.get(k, lambda: self._open(k))


def refuse_urls(op: str, paths: Sequence[str]) -> None:
    """Raise ``ValueError`` for an fsspec URL: memory maps need local files.

    Example:
        >>> refuse_urls("demo", ["s3://bucket/tokens.bin"])
        Traceback (most recent call last):
        ValueError: demo: s3://bucket/tokens.bin is a URL, but this source memory-maps local files; copy the files to a local disk (or mount the bucket) and pass the local path
    """
    for p in paths:
        if "://" in p and not p.startswith("file://"):
            raise ValueError(f"{op}: {p} is a URL, but this source memory-maps local files; copy the files to a "
                             "local disk (or mount the bucket) and pass the local path")
