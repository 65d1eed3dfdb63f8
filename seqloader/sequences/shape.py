"""Ops that change the shape of a sequence: :func:`batch`.

Written here rather than taken from ``seqtools.batch``: errors raised by a ``collate_fn`` there
carry no note naming the batch, and the op must read its parent through seqloader's bounds checks.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, TypeVar, overload

from seqloader.errors import annotate, check_positive_int
import numpy as np

from seqloader.sequences._util import check_bool, check_callable, check_sequence, fname
from seqloader.sequences.base import LazySequence, source_indices

__all__ = ["batch"]

T = TypeVar("T")
R = TypeVar("R")


class _Batch(LazySequence[Any]):  # items are lists, or whatever collate_fn returns: see batch's overloads
    def __init__(self, seq: Sequence[Any], k: int, drop_last: bool,
                 collate_fn: Optional[Callable[[list[Any]], Any]]):
        n = check_sequence("batch", "seq", seq)
        self._k = check_positive_int("batch", "k", k)
        self._drop_last = check_bool("batch", "drop_last", drop_last)
        check_callable("batch", "collate_fn", collate_fn, allow_none=True)
        self._seq = seq
        self._n = n
        self._collate_fn = collate_fn
        self._len = n // self._k if drop_last else -(-n // self._k)

    def __len__(self) -> int:
        return self._len

    def member_range(self, b: int) -> range:
        """The positions of the parent that make up batch ``b`` (``0 <= b < len``)."""
        start = b * self._k
        return range(start, min(start + self._k, self._n))

    def _item(self, b: int) -> Any:
        # One vectorised call resolves the batch's positions through every index map (gather,
        # shuffle, shard, slices) to the data stage; then only the data stage is read per item.
        r = self.member_range(b)
        base, positions = source_indices(self._seq, np.arange(r.start, r.stop, dtype=np.int64))
        get = base._item if isinstance(base, LazySequence) else base.__getitem__
        items = [get(j) for j in positions.tolist()]
        if self._collate_fn is None:
            return items
        with annotate(self, b):
            return self._collate_fn(items)

    def __repr__(self) -> str:
        collate = "" if self._collate_fn is None else f", collate_fn={fname(self._collate_fn)}"
        return f"batch(k={self._k}, drop_last={self._drop_last}{collate}, len={self._len})"


@overload
def batch(seq: Sequence[T], k: int, drop_last: bool = False, collate_fn: None = None) -> LazySequence[list[T]]: ...


@overload
def batch(seq: Sequence[T], k: int, drop_last: bool = False, *,
          collate_fn: Callable[[list[T]], R]) -> LazySequence[R]: ...


@overload
def batch(seq: Sequence[T], k: int, drop_last: bool, collate_fn: Callable[[list[T]], R]) -> LazySequence[R]: ...


def batch(seq: Sequence[Any], k: int, drop_last: bool = False,
          collate_fn: Optional[Callable[[list[Any]], Any]] = None) -> LazySequence[Any]:
    """Group consecutive items into batches of ``k``: batch ``b`` holds items ``b*k .. b*k + k - 1``.

    Args:
        seq: the input sequence.
        k: the batch size, a positive int.
        drop_last: drop the last batch if it has fewer than ``k`` items (default: keep it).
        collate_fn: called with the list of a batch's items; ``None`` returns the list itself.

    Returns:
        A lazy sequence of ``ceil(len(seq) / k)`` batches (``len(seq) // k`` with ``drop_last``).

    Raises:
        TypeError: ``seq`` is not a sequence, ``k`` not an int, ``drop_last`` not a bool, or
            ``collate_fn`` neither callable nor ``None``.
        ValueError: ``k <= 0``.

    An exception raised by ``collate_fn`` keeps its type and gains a note naming the batch.

    Example:
        >>> b = batch(range(7), 3)
        >>> len(b), b[0], b[-1]
        (3, [0, 1, 2], [6])
        >>> list(batch(range(7), 3, drop_last=True, collate_fn=sum))
        [3, 12]
        >>> batch(range(7), 0)
        Traceback (most recent call last):
        ValueError: batch: k must be a positive int (got 0)
    """
    return _Batch(seq, k, drop_last, collate_fn)
