"""The arrays a columnar batch is gathered into: reused once nothing refers to them any more.

A batch of 64 rows of 512 int32 tokens is 128 KiB. Allocated afresh for every batch, such an
array comes from ``mmap`` (glibc serves allocations of 128 KiB and more that way) and goes back
with ``munmap``: each batch then faults its pages in again, and writing the gather into fresh
memory cost ~4x the gather itself (100 us against 22 us a batch, measured). :class:`BatchBuffers`
keeps, per shape and dtype, up to ``most`` arrays it handed out, and hands one out again once
nothing but the pool refers to it (``sys.getrefcount``: the batch, a tensor made from it with
``torch.from_numpy`` or ``default_convert``, a view of it or a slice each hold a reference, so a
batch the training loop keeps is never written over). The pages of a reused array are already
there. When every pooled array is in use a new one is allocated (pooled while fewer than
``most``, else left to the allocator).

Nothing process-wide changes (compare setting glibc's ``M_MMAP_THRESHOLD``, which would). What
it relies on: a reference to the array's memory goes through a Python reference to the array,
as every numpy view, buffer export and ``torch.from_numpy`` tensor holds one. A raw pointer kept
without one (``arr.ctypes.data`` stored past the array's life) would be written over; that is
already a use after free with a fresh array.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

__all__ = ["BatchBuffers"]

def _refs(pool: list[np.ndarray], j: int) -> int:
    """``sys.getrefcount`` of ``pool[j]``, always taken by this one function (the count an
    interpreter reports for its own temporaries differs between Python versions)."""
    return sys.getrefcount(pool[j])


#: what :func:`_refs` reports for a pooled array that nothing else refers to: measured, not
#: assumed, so that a reference held elsewhere always counts one more
_FREE = _refs([np.empty(0)], 0)


class BatchBuffers:
    """Arrays for batches, reused once released (see the module docstring).

    Args:
        most_bytes: the most bytes pooled per shape and dtype (at least 4 arrays).

    Example:
        >>> pool = BatchBuffers()
        >>> a = pool.empty((2, 3), np.dtype(np.int32)); a[:] = 1
        >>> b = pool.empty((2, 3), np.dtype(np.int32))     # a is still referred to: another array
        >>> b is a
        False
        >>> address = a.__array_interface__["data"][0]
        >>> del a
        >>> pool.empty((2, 3), np.dtype(np.int32)).__array_interface__["data"][0] == address   # reused
        True
    """

    def __init__(self, most_bytes: int = 64 << 20):
        self._most_bytes = most_bytes
        self._pools: dict[tuple[Any, ...], list[np.ndarray]] = {}
        self._next: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` (contents undefined) that nothing else refers to."""
        key = (shape, dtype)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = []
                self._next[key] = 0
            n = len(pool)
            start = self._next[key]
            for k in range(n):   # (from where the last search stopped: batches are released in order)
                j = (start + k) % n
                if _refs(pool, j) == _FREE:
                    self._next[key] = (j + 1) % n
                    return pool[j]
            arr = np.empty(shape, dtype)
            if n < max(4, self._most_bytes // max(1, arr.nbytes)):
                pool.append(arr)
            return arr
