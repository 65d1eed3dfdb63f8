"""L1 orders: *plans*: an epoch's order cut into batches for one rank, from a global sample position on.

A plan maps a batch number to ``(key, indices)`` without touching the dataset:

* :class:`OrderPlan` reads an :class:`~seqloader.orders.orders.Order` from a global sample
  ``position`` on. Under ``torch.distributed`` rank ``r`` of ``w`` reads global positions
  ``position + r + j*w``, the layout of ``DistributedSampler``: positions past the end wrap to the
  start (padding), or the tail is dropped when ``drop_last=True``.
* :class:`BatchListPlan` reads a custom ``batch_sampler``'s batches, materialised per epoch.

``key`` is the global position of the batch's first sample: the same for the same batch whether
the run was resumed or not, and distinct across batches and ranks. The loader seeds the global
RNGs from ``(seed, epoch, key)`` before producing the batch.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from seqloader.orders.orders import BlockOrder, Order, RangeOrder
from seqloader.orders.steps import BatchSizes

__all__ = ["BatchListPlan", "OrderPlan", "materialise_batches"]


class OrderPlan:
    """Batches read from ``order`` starting at global position ``start``.

    Args:
        order: an order object (``n`` and vectorised ``lookup``).
        start: samples of the global order already consumed this epoch.
        batch_size: samples per batch per rank; ``None`` (one sample per step, not collated); or
            a :class:`~seqloader.orders.steps.BatchSizes` schedule read from step ``first_step``.
        drop_last: drop the incomplete last batch (and, with several ranks, the tail that does
            not divide evenly, like ``DistributedSampler(drop_last=True)``).
        rank, world_size: this process's place; positions ``start + rank + j * world_size``.
        first_step: the global step of batch 0 (only a schedule reads it).

    Example:
        >>> p = OrderPlan(RangeOrder(9), start=0, batch_size=4, drop_last=False, rank=1, world_size=2)
        >>> len(p), p.batch(0), p.batch(1), p.end_position(1)
        (2, (1, [1, 3, 5, 7]), (9, [0]), 10)
        >>> len(OrderPlan(RangeOrder(10), start=8, batch_size=4, drop_last=True, rank=0, world_size=2))
        0
        >>> ramp = OrderPlan(RangeOrder(9), 0, BatchSizes(2, [(1, 3)]), False, first_step=0)
        >>> [ramp.batch(b)[1] for b in range(len(ramp))], ramp.batch_of(5), ramp.end_position(1)
        ([[0, 1], [2, 3, 4], [5, 6, 7], [8]], 2, 5)
    """

    def __init__(self, order: Order, start: int, batch_size: Union[int, None, BatchSizes], drop_last: bool,
                 rank: int = 0, world_size: int = 1, first_step: int = 0):
        self.order, self.start, self.rank, self.world = order, start, rank, world_size
        self.single = batch_size is None
        sizes = batch_size if isinstance(batch_size, BatchSizes) else None
        if isinstance(batch_size, BatchSizes):
            self.bs = batch_size.constant or 0
        else:
            self.bs = 1 if batch_size is None else batch_size
        self._sizes = sizes if sizes is not None and sizes.constant is None else None  # a changing schedule
        self.first_step = first_step
        n = order.n
        remaining = max(n - start, 0)
        per_rank = remaining // world_size if drop_last else -(-remaining // world_size)
        self.per_rank = per_rank
        if self._sizes is not None:
            self._len = self._sizes.count(first_step, per_rank, drop_last)
        else:
            self._len = per_rank // self.bs if drop_last else -(-per_rank // self.bs)

    def __len__(self) -> int:
        return self._len

    def _offset(self, b: int) -> int:
        """Samples per rank before batch ``b``."""
        return b * self.bs if self._sizes is None else self._sizes.offset(self.first_step, b)

    def key(self, b: int) -> int:
        """The global position of batch ``b``'s first sample."""
        return self.start + self.rank + self._offset(b) * self.world

    def batch_of(self, key: int) -> Optional[int]:
        """The batch whose key is ``key``, or ``None`` if no batch of this plan has it."""
        j, r = divmod(key - self.start - self.rank, self.world)
        if r or j < 0:
            return None
        if self._sizes is None:
            b, r = divmod(j, self.bs)
        else:
            found = self._sizes.batch_at(self.first_step, j)
            b, r = (0, 1) if found is None else (found, 0)
        return b if r == 0 and 0 <= b < self._len else None

    def batch(self, b: int) -> tuple[int, Any]:
        """``(key, indices)`` of batch ``b`` (a single index when ``batch_size`` is ``None``)."""
        lo = self._offset(b)
        hi = min(lo + (self.bs if self._sizes is None else self._sizes.size(self.first_step + b)), self.per_rank)
        first = self.start + self.rank + lo * self.world
        if hi > lo and first + (hi - 1 - lo) * self.world < self.order.n:
            idx = self.order.run(first, hi - lo, self.world)
        else:  # padding wraps to the start of the order, as in DistributedSampler
            g = self.start + self.rank + np.arange(lo, hi, dtype=np.int64) * self.world
            idx = self.order.lookup(g % self.order.n) if g.size else []
        return first, (idx[0] if self.single else idx)

    def window_rows(self, b: int) -> list[int]:
        """One data index in each block of the window that batch ``b``'s first position falls in
        (``order`` a ``BlockOrder``: a few binary searches; the order's cache of the positions being
        read is left alone, so a look far ahead recomputes nothing in between).

        Example:
            >>> from seqloader.orders.block_permutation import BlockPermutation
            >>> from seqloader.orders.orders import BlockOrder
            >>> p = OrderPlan(BlockOrder(BlockPermutation([4, 8, 12], window=0, seed=0)), 0, 4, False)
            >>> p.window_rows(2)                         # window=0: the position's own row
            [8]
        """
        if not isinstance(self.order, BlockOrder):
            raise TypeError(f"window_rows needs a block shuffle's order, not {type(self.order).__name__}")
        return self.order.window_rows(self.key(b) % self.order.n)

    def end_position(self, b: int) -> int:
        """The global position after batch ``b`` (past ``n`` for a padded last batch)."""
        return self.start + min(self._offset(b + 1), self.per_rank) * self.world

    def epoch_batch(self, b: int) -> int:
        """Batch ``b``'s number in its epoch on this rank (a plan may start mid-epoch: a resume).

        Example:
            >>> OrderPlan(RangeOrder(20), start=8, batch_size=2, drop_last=False, world_size=2).epoch_batch(1)
            3
            >>> OrderPlan(RangeOrder(20), 6, BatchSizes(2, [(1, 4)]), False, first_step=2).epoch_batch(0)
            2
        """
        before = self.start // self.world   # samples this rank read this epoch before batch 0
        if self._sizes is None:
            return before // self.bs + b
        return self._sizes.steps_before(self.first_step, before) + b


class BatchListPlan:
    """The batches a custom ``batch_sampler`` yielded this epoch, from sample ``start`` on."""

    def __init__(self, batches: list[list[Any]], start: int):
        self.batches = batches
        ends = np.cumsum([len(b) for b in batches], dtype=np.int64)
        self.ends = ends
        first = int(np.searchsorted(ends, start, side="right")) if start else 0
        if start and (first == 0 or int(ends[first - 1]) != start):
            raise ValueError(f"DataLoader: the state's position {start} is not at a batch boundary of "
                             f"this epoch's batch_sampler (batch ends {ends[:8].tolist()}...); the "
                             "batch_sampler must yield the same batches when resumed")
        self.first = first

    def __len__(self) -> int:
        return len(self.batches) - self.first

    def key(self, b: int) -> int:
        """The position (samples of the epoch) where batch ``b`` starts."""
        i = self.first + b
        return int(self.ends[i - 1]) if i else 0

    def batch_of(self, key: int) -> Optional[int]:
        """The batch starting at position ``key``, or ``None``."""
        b = (int(np.searchsorted(self.ends, key, side="right")) if key else 0) - self.first
        return b if 0 <= b < len(self) and self.key(b) == key else None

    def batch(self, b: int) -> tuple[int, list[Any]]:
        return self.key(b), list(self.batches[self.first + b])

    def end_position(self, b: int) -> int:
        return int(self.ends[self.first + b])

    def epoch_batch(self, b: int) -> int:
        """Batch ``b``'s number in its epoch (the batch sampler's ``first + b``-th batch)."""
        return self.first + b


def materialise_batches(batch_sampler: Any) -> list[list[Any]]:
    """The batches of one pass over ``batch_sampler``, as lists of indices."""
    return [list(b) for b in iter(batch_sampler)]
