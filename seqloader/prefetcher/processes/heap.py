"""A worker's heap: keep large freed buffers for reuse instead of returning them to the kernel.

Why. A worker that builds each result in a fresh large buffer (a 9.6 MB batch from a
``collate_fn``, before it is copied into a slot) frees it after every item. glibc serves the first
such buffer with ``mmap``; freeing it raises its *dynamic* thresholds (``mmap`` threshold to the
buffer's size, trim threshold to twice that), and later buffers come from the ``brk`` heap and are
reused: no page fault. But whether the heap's free top then exceeds the trim threshold depends on
the layout of the small allocations around it, inherited from the parent at ``fork``: in about one
process in four the top is trimmed (``brk`` down 19 MB) after every item and faulted in again on
the next (``brk`` up), ~2,300 minor faults per 9.6 MB, for the whole life of the process. Measured
on ``iterable_images`` (3 epochs, 2 workers, 20 processes): 4 of 20 had ~312,000 worker faults and
2.3x the wall time, the others ~30,000 (``docs/design.md``, "Collating into the slot").

What. :func:`keep_large_buffers` sets, in a worker process, the values glibc's own heuristic
converges to for buffers up to its 32 MiB limit: ``M_MMAP_THRESHOLD`` 32 MiB and ``M_TRIM_THRESHOLD``
64 MiB (at most 64 MiB of free heap top kept per worker). It does nothing when the C library is
not glibc, or when the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` (glibc's
own environment variables: the user's choice wins). The loader's default collate avoids the
fresh buffer altogether (it writes into the slot); this covers every other ``collate_fn`` and a
bare ``prefetch``.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_large_buffers"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_TRIM_THRESHOLD = 64 << 20  # twice that: where its dynamic heuristic would put it
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_large_buffers() -> bool:
    """Set the worker's glibc thresholds (see the module docstring); whether they were set.

    Example:
        >>> _MMAP_THRESHOLD >> 20, _TRIM_THRESHOLD >> 20  # MiB
        (32, 64)
    """
    if any(name in os.environ for name in _ENVIRONMENT):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
            return False
    except OSError:  # pragma: no cover - no C library to load
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
