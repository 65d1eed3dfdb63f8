"""Ops that change the shape of a sequence: :func:`batch` and its inverse :func:`unbatch`.

Written here rather than taken from ``seqtools.batch``: errors raised by a ``collate_fn`` there
carry no note naming the batch, and the op must read its parent through seqloader's bounds checks.
``batch(..., pad=)`` pads only a short last batch (seqtools also pads a full one, with ``k`` more
items, when ``k`` divides the length) and refuses ``drop_last=True`` (seqtools logs that it ignores
``pad``, then pads the last kept batch).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, overload

from seqloader.errors import annotate, check_nonnegative_int, check_positive_int
import numpy as np

from seqloader.sequences._util import check_bool, check_callable, check_sequence, fname, read
from seqloader.sequences.base import LazySequence, source_indices
from seqloader.sequences.describe import Stage

__all__ = ["batch", "unbatch"]

T = TypeVar("T")
R = TypeVar("R")


class _NoPad(enum.Enum):
    """The default of ``batch(pad=)``: no padding (a member of its own, so that ``None`` is a value)."""

    NO_PAD = "no padding"

    def __repr__(self) -> str:
        return "<no padding>"


_NO_PAD = _NoPad.NO_PAD


def _short_repr(value: Any) -> str:
    """``repr(value)``, or its type's name if that is long (a pad array would flood every message)."""
    text = repr(value)
    return text if len(text) <= 40 else f"<{type(value).__name__}>"


class _Batch(LazySequence[Any]):  # items are lists, or whatever collate_fn returns: see batch's overloads
    def __init__(self, seq: Sequence[Any], k: int, drop_last: bool,
                 collate_fn: Optional[Callable[[list[Any]], Any]], pad: Any = _NO_PAD):
        n = check_sequence("batch", "seq", seq)
        self._k = check_positive_int("batch", "k", k)
        self._drop_last = check_bool("batch", "drop_last", drop_last)
        check_callable("batch", "collate_fn", collate_fn, allow_none=True)
        self._padded = pad is not _NO_PAD
        if self._padded and drop_last:
            raise ValueError("batch: pad and drop_last=True exclude each other (drop_last drops the short "
                             "last batch that pad would fill); pass one of them")
        self._seq = seq
        self._n = n
        self._collate_fn = collate_fn
        self._pad = pad if self._padded else None
        self._len = n // self._k if drop_last else -(-n // self._k)


    def _position_stage(self) -> Stage:
        return Stage("batch", {"k": self._k, "drop_last": self._drop_last}, (self._seq,),
                     values=(self._collate_fn, self._pad))

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
        if self._padded and len(items) < self._k:
            items.extend([self._pad] * (self._k - len(items)))
        if self._collate_fn is None:
            return items
        with annotate(self, b):
            return self._collate_fn(items)

    def __repr__(self) -> str:
        collate = "" if self._collate_fn is None else f", collate_fn={fname(self._collate_fn)}"
        pad = f", pad={_short_repr(self._pad)}" if self._padded else ""
        return f"batch(k={self._k}, drop_last={self._drop_last}{pad}{collate}, len={self._len})"


@overload
def batch(seq: Sequence[T], k: int, drop_last: bool = False, collate_fn: None = None, *,
          pad: Any = _NO_PAD) -> LazySequence[list[T]]: ...


@overload
def batch(seq: Sequence[T], k: int, drop_last: bool = False, *,
          collate_fn: Callable[[list[T]], R], pad: Any = _NO_PAD) -> LazySequence[R]: ...


@overload
def batch(seq: Sequence[T], k: int, drop_last: bool, collate_fn: Callable[[list[T]], R], *,
          pad: Any = _NO_PAD) -> LazySequence[R]: ...


def batch(seq: Sequence[Any], k: int, drop_last: bool = False,
          collate_fn: Optional[Callable[[list[Any]], Any]] = None, *, pad: Any = _NO_PAD) -> LazySequence[Any]:
    """Group consecutive items into batches of ``k``: batch ``b`` holds items ``b*k .. b*k + k - 1``.

    Args:
        seq: the input sequence.
        k: the batch size, a positive int.
        drop_last: drop the last batch if it has fewer than ``k`` items (default: keep it).
        collate_fn: called with the list of a batch's items; ``None`` returns the list itself.
        pad: keyword-only; if given, a short last batch is filled up to ``k`` items with this value
            (``None`` included) before ``collate_fn`` sees it. Default: no padding. Full batches,
            and every batch when ``k`` divides ``len(seq)``, are unchanged.

    Returns:
        A lazy sequence of ``ceil(len(seq) / k)`` batches (``len(seq) // k`` with ``drop_last``).

    Raises:
        TypeError: ``seq`` is not a sequence, ``k`` not an int, ``drop_last`` not a bool, or
            ``collate_fn`` neither callable nor ``None``.
        ValueError: ``k <= 0``, or ``pad`` with ``drop_last=True``.

    An exception raised by ``collate_fn`` keeps its type and gains a note naming the batch.

    Example:
        >>> b = batch(range(7), 3)
        >>> len(b), b[0], b[-1]
        (3, [0, 1, 2], [6])
        >>> list(batch(range(7), 3, drop_last=True, collate_fn=sum))
        [3, 12]
        >>> batch(range(7), 3, pad=-1)[-1], batch(range(6), 3, pad=-1)[-1]  # a full last batch is kept
        ([6, -1, -1], [3, 4, 5])
        >>> batch(range(7), 0)
        Traceback (most recent call last):
        ValueError: batch: k must be a positive int (got 0)
    """
    return _Batch(seq, k, drop_last, collate_fn, pad)


class _Unbatch(LazySequence[Any]):
    def __init__(self, seq: Sequence[Sequence[Any]], batch_size: int, last_batch_size: Optional[int]):
        self._num_batches = check_sequence("unbatch", "seq", seq)
        self._k = check_positive_int("unbatch", "batch_size", batch_size)
        last = self._k if last_batch_size is None else check_nonnegative_int("unbatch", "last_batch_size",
                                                                            last_batch_size)
        if last > self._k:
            raise ValueError(f"unbatch: last_batch_size must be at most batch_size (got {last} > {self._k})")
        self._last = last or self._k  # 0 (len(data) % k when k divides it) means a full last batch
        self._seq = seq
        self._len = (self._num_batches - 1) * self._k + self._last if self._num_batches else 0


    def _position_stage(self) -> Stage:
        return Stage("unbatch", {"batch_size": self._k, "last_batch_size": self._last}, (self._seq,))

    def __len__(self) -> int:
        return self._len

    def _batch(self, b: int) -> Sequence[Any]:
        """Batch ``b``, checked to have the number of items its position calls for."""
        items = read(self._seq, b)
        m = check_sequence("unbatch", f"seq[{b}]", items)
        expected = self._last if b == self._num_batches - 1 else self._k
        if m != expected:
            raise ValueError(f"{self!r}: batch {b} has {m} items, expected {expected}; pass the batch_size "
                             "(and last_batch_size) that made these batches")
        return items

    def _item(self, i: int) -> Any:
        b, j = divmod(i, self._k)
        return self._batch(b)[j]

    def __iter__(self) -> Iterator[Any]:
        for b in range(self._num_batches):  # each batch read once
            items = self._batch(b)
            for j in range(len(items)):
                yield items[j]

    def __repr__(self) -> str:
        last = "" if self._last == self._k else f", last_batch_size={self._last}"
        return f"unbatch(batch_size={self._k}{last}, len={self._len})"


def unbatch(seq: Sequence[Sequence[Any]], batch_size: int, last_batch_size: Optional[int] = None) -> LazySequence[Any]:
    """The items of a sequence of batches, one after the other: the inverse of :func:`batch`.

    Item ``i`` is ``seq[i // batch_size][i % batch_size]``. Every batch must have ``batch_size``
    items except the last, which has ``last_batch_size``; a batch of another size raises
    ``ValueError`` when it is read, instead of shifting every later item. Reading an item reads its
    whole batch: when the batches are computed (``smap``, ``batch(..., collate_fn=)``), put
    :func:`seqloader.add_cache` between them so that each batch is computed once
    (``unbatch(add_cache(batches), k)``); iteration reads each batch once by itself.

    Args:
        seq: a sequence of batches (each a sequence: a list, a tuple, an array, a tensor).
        batch_size: the size of every batch but the last, a positive int.
        last_batch_size: the size of the last batch, in ``[0, batch_size]``; ``None`` (default)
            or ``0`` mean ``batch_size``, so ``len(data) % batch_size`` is always right.

    Returns:
        A lazy sequence of ``(len(seq) - 1) * batch_size + last_batch_size`` items (0 for no batch).

    Raises:
        TypeError: ``seq`` is not a sequence, or a size is not an int.
        ValueError: ``batch_size < 1``, ``last_batch_size`` outside ``[0, batch_size]``; on read,
            a batch that is not a sequence (a dict) or has another size than its position calls for.

    Example:
        >>> b = batch(range(7), 3)
        >>> u = unbatch(b, 3, last_batch_size=7 % 3)
        >>> list(u), u[-1], len(unbatch([], 3))
        ([0, 1, 2, 3, 4, 5, 6], 6, 0)
        >>> unbatch(b, 3)[6]  # the last batch has 1 item, not 3
        Traceback (most recent call last):
        ValueError: unbatch(batch_size=3, len=9): batch 2 has 1 items, expected 3; pass the batch_size (and last_batch_size) that made these batches
    """
    return _Unbatch(seq, batch_size, last_batch_size)
