"""L1 orders: steps and sample positions: the one place a step number becomes a sample position.

A loader consumes its epoch's global order in *global steps*: at step ``s`` every rank reads one
batch of ``size(s)`` samples, so the step consumes ``size(s) * world_size`` positions.
:class:`BatchSizes` is the per-rank batch size of each step: one size, or a schedule that changes
at given steps (a ramp-up, ``[(0, 256), (1000, 512), (3000, 1024)]``), piecewise constant, so every
conversion below costs O(number of changes), never a walk over the steps.

The loader's state counts *samples* (``position``) and keeps the step of the batch at that
position (``step``): a change of batch size or world size at a resume is arithmetic from there,
never a replay.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterator, Optional, Sequence

from seqloader.errors import check_nonnegative_int, check_positive_int

__all__ = ["BatchSizes", "schedule_of"]


class BatchSizes:
    """The per-rank batch size at each global step: ``size`` until the first change, then each
    ``(step, size)`` change from its step on.

    Args:
        size: the batch size from step 0.
        changes: ``(step, size)`` pairs, steps strictly increasing and ``> 0``.

    Raises:
        TypeError, ValueError: a step or size that is not a positive int, or steps out of order.

    Example:
        >>> sizes = BatchSizes(2, [(3, 4)])
        >>> [sizes.size(s) for s in range(5)], sizes.offset(1, 3), sizes.offset(2, 2)
        ([2, 2, 2, 4, 4], 8, 6)
        >>> sizes.count(2, total=11, drop_last=False), sizes.count(2, total=11, drop_last=True)
        (4, 3)
        >>> BatchSizes(2, [(3, 4), (3, 8)])
        Traceback (most recent call last):
        ValueError: batch_size_schedule: steps must increase (step 3 after step 3)
    """

    __slots__ = ("_starts", "_sizes")

    def __init__(self, size: int, changes: Sequence[Any] = ()):
        op = "batch_size_schedule"
        starts, sizes = [0], [check_positive_int(op, "batch size", size)]
        for entry in changes:
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(f"{op}: each change must be a (step, batch_size) pair (got {entry!r})")
            step = check_nonnegative_int(op, "step", entry[0])
            value = check_positive_int(op, "batch_size", entry[1])
            if step <= starts[-1] and not (step == 0 and len(starts) == 1):
                raise ValueError(f"{op}: steps must increase (step {step} after step {starts[-1]})")
            if step == 0:
                sizes[0] = value
            else:
                starts.append(step)
                sizes.append(value)
        self._starts, self._sizes = starts, sizes

    @property
    def constant(self) -> Optional[int]:
        """The size when it never changes, else ``None``."""
        return self._sizes[0] if len(self._sizes) == 1 else None

    def size(self, step: int) -> int:
        """The batch size of ``step``."""
        return self._sizes[bisect.bisect_right(self._starts, step) - 1]

    def _segments(self, first: int) -> Iterator[tuple[int, Optional[int], int]]:
        """``(start, end, size)`` of the constant stretches from step ``first`` on (the last is open)."""
        k = bisect.bisect_right(self._starts, first) - 1
        for j in range(k, len(self._starts)):
            start = max(first, self._starts[j])
            end = self._starts[j + 1] if j + 1 < len(self._starts) else None
            yield start, end, self._sizes[j]

    def offset(self, first: int, b: int) -> int:
        """Samples per rank in the ``b`` batches of steps ``first .. first + b - 1``."""
        total, stop = 0, first + b
        for start, end, size in self._segments(first):
            if start >= stop:
                break
            total += size * ((stop if end is None else min(end, stop)) - start)
        return total

    def count(self, first: int, total: int, drop_last: bool) -> int:
        """Batches from step ``first`` on that ``total`` samples per rank make (a last, partial one
        counts unless ``drop_last``)."""
        b, left = 0, total
        for start, end, size in self._segments(first):
            steps = None if end is None else end - start
            full = left // size
            if steps is None or full < steps:
                return b + full + (0 if drop_last or left % size == 0 else 1)
            b, left = b + steps, left - steps * size
            if left == 0:
                return b
        return b  # pragma: no cover - the last segment is open

    def batch_at(self, first: int, offset: int) -> Optional[int]:
        """The batch (from step ``first``) that starts ``offset`` samples in, or ``None``."""
        b, at = 0, 0
        for start, end, size in self._segments(first):
            steps = None if end is None else end - start
            k, r = divmod(offset - at, size)
            if steps is None or k < steps:
                return b + k if r == 0 else None
            b, at = b + steps, at + steps * size
        return None  # pragma: no cover - the last segment is open

    def steps_before(self, step: int, samples: int) -> int:
        """How many batches end at ``step`` having read ``samples`` per rank (the most whose sizes,
        ``step - b .. step - 1``, add up to at most ``samples``): the first step of an epoch from
        a position within it.

        Example:
            >>> BatchSizes(2, [(3, 4)]).steps_before(5, 10)
            3
        """
        lo, hi = 0, step
        while lo < hi:  # the largest b with offset(step - b, b) <= samples
            mid = (lo + hi + 1) // 2
            if self.offset(step - mid, mid) <= samples:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def to_list(self) -> list[list[int]]:
        """``[[step, size], ...]``, step 0 first (JSON)."""
        return [[s, z] for s, z in zip(self._starts, self._sizes)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchSizes) and self.to_list() == other.to_list()

    def __repr__(self) -> str:
        return f"BatchSizes({self.to_list()})"


def schedule_of(batch_size: Optional[int], schedule: Optional[Sequence[Any]], *, iterable: bool,
                batch_sampler: Any) -> Optional[BatchSizes]:
    """The loader's :class:`BatchSizes` for ``batch_size_schedule=schedule`` (``None`` without one).

    Raises:
        ValueError: a schedule with ``batch_size=None``, a custom ``batch_sampler`` (it decides the
            batches) or an ``IterableDataset`` (its streams make fixed-size batches).

    Example:
        >>> schedule_of(256, [(1000, 512)], iterable=False, batch_sampler=None)
        BatchSizes([[0, 256], [1000, 512]])
        >>> schedule_of(None, [(10, 2)], iterable=False, batch_sampler=None)
        Traceback (most recent call last):
        ValueError: DataLoader: batch_size_schedule needs an int batch_size (got None): it is the size before the first change
    """
    if schedule is None:
        return None
    if batch_size is None:
        raise ValueError("DataLoader: batch_size_schedule needs an int batch_size (got None): it is the size "
                         "before the first change")
    if batch_sampler is not None:
        raise ValueError("DataLoader: batch_size_schedule cannot be combined with a batch_sampler, which "
                         "makes the batches itself")
    if iterable:
        raise ValueError("DataLoader: batch_size_schedule needs a map-style dataset (an IterableDataset's "
                         "streams make batches of batch_size)")
    if isinstance(schedule, (str, bytes)) or not hasattr(schedule, "__iter__"):
        raise TypeError(f"DataLoader: batch_size_schedule must be a list of (step, batch_size) pairs "
                        f"(got {type(schedule).__name__})")
    return BatchSizes(batch_size, list(schedule))
