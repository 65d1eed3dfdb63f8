"""L1 orders: skipped positions of an epoch's order, backfilled from the epoch's tail.

When samples are skipped (a bad sample's index, or the batches of a step range after a loss spike),
the positions that held them become *holes*. Batches must stay full and every rank must keep the
same number of batches, and every other batch must stay as it was. So an epoch of ``n`` positions
with ``h`` holes becomes an epoch of ``n - h`` positions: a position that is not a hole keeps its
sample, and the ``k``-th hole (in position order) takes the sample of the ``k``-th position that is
not a hole counting down from the end of the epoch (the tail that no longer fits). Each kept sample
is read exactly once, no skipped sample is read, and only the holes and the last ``h`` positions
change.

:class:`Intervals` holds sorted disjoint ``[start, stop)`` ranges with cumulative counts, so a hole
test, a count and the ``k``-th non-hole from the end cost a binary search, for any number of
skipped positions (a step range of millions of samples is one interval).
:class:`HoledOrder` applies them to an :class:`~seqloader.orders.orders.Order`.
"""

from __future__ import annotations

from typing import Any, Iterable, cast

import numpy as np
import numpy.typing as npt

from seqloader.orders.orders import Indices, Order

__all__ = ["HoledOrder", "Intervals"]

_I64 = npt.NDArray[np.int64]


class Intervals:
    """Sorted, disjoint ``[start, stop)`` ranges of ints (merged when they touch).

    Example:
        >>> iv = Intervals([(5, 7), (1, 2), (6, 9)])
        >>> iv.ranges(), len(iv), iv.count_below(np.array([0, 6, 20])).tolist()
        ([[1, 2], [5, 9]], 5, [0, 2, 5])
        >>> iv.contains(np.array([1, 2, 8])).tolist()
        [True, False, True]
    """

    __slots__ = ("starts", "stops", "_before")

    def __init__(self, ranges: Iterable[Any] = ()):
        pairs = sorted((int(a), int(b)) for a, b in ranges if int(b) > int(a))
        merged: list[list[int]] = []
        for a, b in pairs:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = np.array([a for a, _ in merged], dtype=np.int64)
        self.stops = np.array([b for _, b in merged], dtype=np.int64)
        self._before = np.concatenate([[0], np.cumsum(self.stops - self.starts)]).astype(np.int64)

    @classmethod
    def of_points(cls, points: Any) -> "Intervals":
        """The intervals covering exactly the given ints."""
        p = np.unique(np.asarray(points, dtype=np.int64).reshape(-1))
        if not p.size:
            return cls()
        cut = np.flatnonzero(np.diff(p) != 1) + 1
        return cls([(int(run[0]), int(run[-1]) + 1) for run in np.split(p, cut) if run.size])

    def __len__(self) -> int:
        return int(self._before[-1])

    def ranges(self) -> list[list[int]]:
        """``[[start, stop], ...]`` (JSON)."""
        return [[int(a), int(b)] for a, b in zip(self.starts, self.stops)]

    def union(self, other: "Intervals") -> "Intervals":
        return Intervals(self.ranges() + other.ranges())

    def minus(self, other: "Intervals") -> "Intervals":
        """The ints of ``self`` not in ``other``."""
        out: list[list[int]] = []
        for a, b in self.ranges():
            cuts = [(max(a, c), min(b, d)) for c, d in other.ranges() if c < b and d > a]
            at = a
            for c, d in cuts:
                if c > at:
                    out.append([at, c])
                at = max(at, d)
            if at < b:
                out.append([at, b])
        return Intervals(out)

    def clip(self, lo: int, hi: int) -> "Intervals":
        """The ints of ``self`` in ``[lo, hi)``."""
        return Intervals([(max(a, lo), min(b, hi)) for a, b in self.ranges()])

    def count_below(self, x: _I64) -> _I64:
        """How many ints of ``self`` are ``< x`` (vectorised)."""
        x = np.asarray(x, dtype=np.int64)
        j = np.searchsorted(self.starts, x, side="left")  # intervals starting below x
        out = np.zeros(x.shape, dtype=np.int64)
        m = j > 0
        last = j[m] - 1  # every interval before it ends below x; it may contain x
        out[m] = self._before[last] + np.minimum(x[m], self.stops[last]) - self.starts[last]
        return out

    def contains(self, x: _I64) -> npt.NDArray[np.bool_]:
        """Whether each int of ``x`` is in ``self``."""
        if not len(self.starts):
            return np.zeros(np.shape(x), dtype=bool)
        k = np.searchsorted(self.starts, x, side="right") - 1
        kk = np.maximum(k, 0)
        out: npt.NDArray[np.bool_] = (k >= 0) & (x < self.stops[kk])
        return out


class HoledOrder:
    """``order`` with the positions of ``holes`` skipped and backfilled from the tail (see the module docstring).

    Args:
        order: the epoch's order (``n`` positions).
        holes: positions of ``order`` to skip (within ``[0, n)``).

    Example:
        >>> from seqloader.orders.orders import RangeOrder
        >>> o = HoledOrder(RangeOrder(10), Intervals([(2, 3), (5, 7)]))
        >>> o.n, o.run(0, o.n, 1)
        (7, [0, 1, 9, 3, 4, 8, 7])
    """

    def __init__(self, order: Order, holes: Intervals):
        self.base, self.holes = order, holes.clip(0, order.n)
        self.n = order.n - len(self.holes)
        # the non-holes of the tail [n, base.n), counted down from base.n - 1: the backfill
        tail = Intervals([(self.n, order.n)]).minus(self.holes)
        self._tail = tail
        self._tail_count = len(tail)

    def _raw(self, q: _I64) -> _I64:
        """Positions of the base order for positions ``q`` of this one."""
        q = np.asarray(q, dtype=np.int64)
        hole = self.holes.contains(q)
        if not hole.any():
            return q
        k = self.holes.count_below(q[hole])  # the k-th hole takes the k-th tail non-hole from the end
        raw: _I64 = q.copy()
        raw[hole] = self._kth_from_end(k)
        return raw

    def _kth_from_end(self, k: _I64) -> _I64:
        tail = self._tail  # its ints, in decreasing order, k-th: count from the top
        starts, stops = tail.starts[::-1], tail.stops[::-1]
        sizes = stops - starts
        before = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        j = np.searchsorted(before, k, side="right") - 1
        return cast(_I64, stops[j] - 1 - (k - before[j]))

    def lookup(self, pos: _I64) -> Indices:
        return self.base.lookup(self._raw(pos))

    def run(self, first: int, count: int, stride: int) -> Indices:
        q = first + stride * np.arange(count, dtype=np.int64)
        raw = self._raw(q)
        if raw is q:
            return self.base.run(first, count, stride)
        return self.base.lookup(raw)
