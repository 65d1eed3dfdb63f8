"""L3: where an out-of-order reader stands: a watermark and the items consumed above it.

A reader that takes items in completion order (``in_order=False``) has consumed every item below
its *watermark* ``low`` and a few items above it. That pair is what its state records, and what a
resume skips (``Prefetch.seek(low, skip=above)``). In order, ``above`` stays empty and ``low``
is simply the next item.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["Watermark"]


class Watermark:
    """Items consumed, as ``low`` (all before it) and ``above`` (consumed past it).

    Args:
        low: the first item not known to be consumed.
        above: items at or after ``low`` already consumed (a resume's ``skip``).

    Example:
        >>> w = Watermark(0, above={2})
        >>> w.consume(0); (w.low, sorted(w.above))
        (1, [2])
        >>> w.consume(1); (w.low, sorted(w.above))
        (3, [])
    """

    __slots__ = ("low", "above")

    def __init__(self, low: int, above: Iterable[int] = ()):
        self.low = low
        self.above = set(above)
        self._advance()

    def consume(self, i: int) -> None:
        """Item ``i`` was consumed (yielded, or raised its own error)."""
        self.above.add(i)
        self._advance()

    def _advance(self) -> None:
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1
