"""One rank's part of a sequence: :func:`shard`, laid out like torch's ``DistributedSampler``."""

from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

from seqloader.errors import check_int, check_positive_int
from seqloader.sequences._util import check_bool, check_sequence
from seqloader.sequences.base import IndexMap, LazySequence, Positions
from seqloader.sequences.describe import Stage

__all__ = ["shard"]

T = TypeVar("T")


class _Shard(IndexMap[T]):
    def __init__(self, seq: Sequence[T], rank: int, world_size: int, drop_remainder: bool):
        n = check_sequence("shard", "seq", seq)
        world_size = check_positive_int("shard", "world_size", world_size)
        rank = check_int("shard", "rank", rank)
        if not 0 <= rank < world_size:
            raise ValueError(f"shard: rank must be in [0, world_size) (got rank={rank}, world_size={world_size})")
        check_bool("shard", "drop_remainder", drop_remainder)
        if n == 0:
            total = 0
        elif drop_remainder:
            total = (n // world_size) * world_size
        else:
            total = -(-n // world_size) * world_size
        self._parent = seq
        self._n = n
        self._rank = rank
        self._world_size = world_size
        self._drop_remainder = drop_remainder
        self._len = total // world_size


    def _position_stage(self) -> Stage:
        return Stage("shard", {"rank": self._rank, "world_size": self._world_size,
                               "drop_remainder": self._drop_remainder}, (self._parent,))

    def __len__(self) -> int:
        return self._len

    def _source_index(self, j: int) -> int:
        return (self._rank + j * self._world_size) % self._n

    def _source_indices(self, idx: Positions) -> Positions:
        return (self._rank + np.asarray(idx, dtype=np.int64) * self._world_size) % self._n

    def __repr__(self) -> str:
        return (f"shard(rank={self._rank}, world_size={self._world_size}, "
                f"drop_remainder={self._drop_remainder}, len={self._len})")


def shard(seq: Sequence[T], rank: int, world_size: int, drop_remainder: bool = False) -> LazySequence[T]:
    """Rank ``rank``'s part of ``seq`` out of ``world_size`` parts, as ``DistributedSampler`` lays it out.

    With ``n = len(seq)``, the positions ``0 .. total - 1`` are dealt round-robin: rank ``r`` gets
    positions ``r, r + world_size, r + 2 * world_size, ...``. Without ``drop_remainder``,
    ``total = ceil(n / world_size) * world_size`` and padded positions wrap around (position ``p``
    reads item ``p % n``), so a few items appear twice; with it, ``total = (n // world_size) *
    world_size`` and the tail is dropped. Every rank has ``total // world_size`` items. This is the
    index layout of ``torch.utils.data.DistributedSampler(..., shuffle=False, drop_last=...)``.

    Args:
        seq: the input sequence (shuffle it first for a random split).
        rank: this part's index, ``0 <= rank < world_size``.
        world_size: the number of parts, ``>= 1``.
        drop_remainder: drop the last ``n % world_size`` items instead of padding.

    Returns:
        A lazy sequence of ``total // world_size`` items (0 for an empty ``seq``).

    Raises:
        TypeError: ``seq`` is not a sequence, ``rank``/``world_size`` not ints, ``drop_remainder``
            not a bool.
        ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.

    Example:
        >>> [list(shard(range(5), r, 2)) for r in range(2)]
        [[0, 2, 4], [1, 3, 0]]
        >>> [list(shard(range(5), r, 2, drop_remainder=True)) for r in range(2)]
        [[0, 2], [1, 3]]
        >>> shard(range(5), 2, 2)
        Traceback (most recent call last):
        ValueError: shard: rank must be in [0, world_size) (got rank=2, world_size=2)
    """
    return _Shard(seq, rank, world_size, drop_remainder)
