"""``seq`` tiled to a number of *items*: :func:`cycle` (seqtools' name and meaning, always finite).

:func:`seqloader.repeat` counts *copies* (``repeat(seq, times)`` has ``len(seq) * times`` items, as
``list * times``, ``numpy.tile`` and ``torch.Tensor.repeat``); ``cycle`` counts items, as
``seqtools.cycle(seq, limit)`` and ``itertools.islice(itertools.cycle(seq), limit)``. Both are
:class:`~seqloader.sequences.base.IndexMap` s: position ``i`` reads item ``i % len(seq)``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, TypeVar

import numpy as np

from seqloader.errors import check_nonnegative_int
from seqloader.sequences._util import check_sequence
from seqloader.sequences.base import IndexMap, LazySequence, Positions
from seqloader.sequences.describe import Stage

__all__ = ["cycle"]

T = TypeVar("T")


class _Cycle(IndexMap[T]):
    def __init__(self, seq: Sequence[T], limit: Any):
        n = check_sequence("cycle", "seq", seq)
        if limit is None:
            raise TypeError("cycle: limit is required (got None): seqloader sequences are finite, every stage "
                            "has a len; pass the number of items to produce, e.g. limit=len(seq) * epochs")
        self._limit = check_nonnegative_int("cycle", "limit", limit)
        if self._limit > sys.maxsize:
            raise ValueError(f"cycle: limit must be < 2**63 (got {self._limit})")
        if n == 0 and self._limit:
            raise ValueError(f"cycle: seq is empty, so it cannot fill limit={self._limit} items")
        self._parent = seq
        self._n = n


    def _position_stage(self) -> Stage:
        return Stage("cycle", {"limit": self._limit, "of": self._n}, (self._parent,))

    def __len__(self) -> int:
        return self._limit

    def _source_index(self, i: int) -> int:
        return i % self._n

    def _source_indices(self, idx: Positions) -> Positions:
        return np.asarray(idx, dtype=np.int64) % self._n

    def __repr__(self) -> str:
        return f"cycle(limit={self._limit}, len={self._limit})"


def cycle(seq: Sequence[T], limit: Optional[int] = None) -> LazySequence[T]:
    """``seq`` repeated over and over, cut at ``limit`` items: item ``i`` is ``seq[i % len(seq)]``.

    seqtools' ``cycle(seq, limit)``, always with a limit: a seqloader sequence has a ``len`` at
    every stage, so ``cycle(seq)`` with no limit (seqtools' infinite cycle) raises. ``limit``
    counts items, not copies: for whole copies use :func:`seqloader.repeat` (``repeat(seq, 3)`` is
    ``cycle(seq, 3 * len(seq))``).

    Args:
        seq: the input sequence.
        limit: the number of items, a non-negative int (required; ``None`` raises).

    Returns:
        A lazy sequence of ``limit`` items.

    Raises:
        TypeError: ``seq`` is not a sequence, or ``limit`` is missing, ``None`` or not an int.
        ValueError: ``limit`` is negative or ``2**63`` or more, or ``seq`` is empty and
            ``limit > 0``.

    Example:
        >>> list(cycle(["a", "b", "c"], 7))
        ['a', 'b', 'c', 'a', 'b', 'c', 'a']
        >>> list(cycle([1, 2, 3], 2)), len(cycle([], 0))
        ([1, 2], 0)
        >>> cycle([1, 2, 3])
        Traceback (most recent call last):
        TypeError: cycle: limit is required (got None): seqloader sequences are finite, every stage has a len; pass the number of items to produce, e.g. limit=len(seq) * epochs
    """
    return _Cycle(seq, limit)
