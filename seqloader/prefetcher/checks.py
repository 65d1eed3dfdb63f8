"""Argument checks of :func:`~seqloader.prefetcher.api.prefetch` and of ``Prefetch``'s methods.

Each raises ``TypeError``, ``ValueError`` or ``IndexError`` naming the operation and the argument.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Iterable

from seqloader.errors import check_int

__all__ = ["check_restarts", "check_seq", "check_skip", "check_timeout", "check_workers", "resolve_context"]


def check_seq(op: str, seq: Any) -> int:
    """``len(seq)``, or ``TypeError`` naming ``op``.

    Example:
        >>> check_seq("prefetch", range(3))
        3
        >>> check_seq("prefetch", iter([]))
        Traceback (most recent call last):
        TypeError: prefetch: seq must be a sequence with len() and integer indexing (got list_iterator)
    """
    try:
        return len(seq)
    except TypeError:
        raise TypeError(f"{op}: seq must be a sequence with len() and integer indexing "
                        f"(got {type(seq).__name__})") from None


def check_workers(num_workers: Any) -> int:
    """``num_workers`` as a positive int."""
    n = check_int("prefetch", "num_workers", num_workers)
    if n < 1:
        raise ValueError(f"prefetch: num_workers must be a positive int (got {n}); to evaluate in this process, "
                         "read the sequence directly")
    return n


def check_restarts(restarts: Any, respawn: Any) -> int:
    """``restarts`` as a non-negative int, and ``respawn`` a callable used with it.

    Example:
        >>> check_restarts(2, None)
        2
        >>> check_restarts(0, print)
        Traceback (most recent call last):
        ValueError: prefetch: respawn is called only when a dead worker is replaced; pass restarts > 0 too (got restarts=0)
    """
    n = check_int("prefetch", "restarts", restarts)
    if n < 0:
        raise ValueError(f"prefetch: restarts must be >= 0 (got {n}); 0 raises WorkerDied when a worker dies")
    if respawn is not None and not callable(respawn):
        raise TypeError(f"prefetch: respawn must be callable or None (got {type(respawn).__name__})")
    if respawn is not None and n == 0:
        raise ValueError("prefetch: respawn is called only when a dead worker is replaced; pass restarts > 0 "
                         "too (got restarts=0)")
    return n


def check_timeout(timeout: Any) -> float:
    """``timeout`` as a non-negative float (``0``: wait forever)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"prefetch: timeout must be a number of seconds (got {type(timeout).__name__})")
    if not timeout >= 0:
        raise ValueError(f"prefetch: timeout must be >= 0 (got {timeout}); 0 waits forever")
    return float(timeout)


def resolve_context(ctx: Any):
    """A ``multiprocessing`` context from ``None``, a start method name or a context object."""
    if ctx is None:
        return multiprocessing.get_context()
    if isinstance(ctx, str):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError(f"prefetch: multiprocessing_context {ctx!r} is not a start method here "
                             f"(expected one of {', '.join(methods)}, or a multiprocessing context object)")
        return multiprocessing.get_context(ctx)
    if not (hasattr(ctx, "Process") and hasattr(ctx, "Pipe")):
        raise TypeError(f"prefetch: multiprocessing_context must be None, a start method name or a "
                        f"multiprocessing context (got {type(ctx).__name__})")
    return ctx


def check_skip(skip: Iterable[int], position: int, length: int) -> frozenset:
    """The items of ``skip`` (``Prefetch.seek``), each an int in ``[position, length)``.

    Example:
        >>> sorted(check_skip([5, 3, 5], 3, 10))
        [3, 5]
        >>> check_skip({2}, 3, 10)
        Traceback (most recent call last):
        IndexError: prefetch.seek: skip holds item 2, out of range [3, 10); skip lists items at or after position
    """
    try:
        items = list(skip)
    except TypeError:
        raise TypeError(f"prefetch.seek: skip must be an iterable of ints (got {type(skip).__name__})") from None
    out = set()
    for j in items:
        k = check_int("prefetch.seek", "every item of skip", j)
        if not position <= k < length:
            raise IndexError(f"prefetch.seek: skip holds item {k}, out of range [{position}, {length}); "
                             "skip lists items at or after position")
        out.add(k)
    return frozenset(out)
