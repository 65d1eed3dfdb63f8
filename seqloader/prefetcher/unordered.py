"""Reading in completion order: the bookkeeping and the wait behind :meth:`Prefetch.take`.

:class:`TakeWindow` is pure bookkeeping (no processes): a *watermark* ``low`` below which every
item has been taken (or skipped), the few items above it already taken, and, per worker, the
next item to submit. Item ``j`` still goes to worker ``j % num_workers``; a worker gets its items
in increasing order, at most ``prefetch_factor`` at a time, and only items below ``low +
window``. So a slow item (a *straggler*) holds up its own worker's queue, while every other
worker goes on with its items up to ``window`` positions past the straggler; and ``low`` plus
the taken items above it (fewer than ``window``) are the whole progress, which is what a resume
needs (:meth:`Prefetch.seek` with ``skip``).

:class:`Taker` joins a window to the workers: it submits what the window allows and waits
(bounded, with the liveness checks of :class:`~seqloader.prefetcher.inbox.Inbox`) for the first
completed item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, AbstractSet, Any

from seqloader.prefetcher.inbox import Inbox
from seqloader.prefetcher.roster import Roster

if TYPE_CHECKING:
    from seqloader.prefetcher.ordered import InOrder

__all__ = ["TakeWindow", "Taker", "continue_in_order"]


class TakeWindow:
    """Which items ``take`` has returned and which it submits next; see the module docstring.

    Args:
        length: the sequence's length.
        num_workers: workers; item ``j`` belongs to worker ``j % num_workers``.
        start: the first item to take.
        skip: items at or after ``start`` that are already taken (never submitted).
        submitted: items ``start .. submitted-1`` are already in flight (an in-order read
            ahead that ``take`` continues); default ``start``.

    Example:
        >>> w = TakeWindow(10, num_workers=2, start=3, skip={4, 6})
        >>> w.low, w.remaining()
        (3, 5)
        >>> w.next_items(worker_id=0, room=2, window=4), w.next_items(worker_id=1, room=2, window=4)
        ([], [3, 5])
        >>> w.taken(5); w.taken(3)
        >>> w.low, w.remaining(), w.next_items(worker_id=0, room=2, window=4)
        (7, 3, [8])
    """

    def __init__(self, length: int, num_workers: int, start: int, skip: AbstractSet[int] = frozenset(),
                 submitted: int | None = None, affinity: bool = True):
        self.length, self.low = length, start
        self.done = set(skip)  # taken items above low
        self._n, self.affinity = num_workers, affinity
        first = start if submitted is None else submitted
        self._next = [first + (w - first) % num_workers for w in range(num_workers)]
        self._cursor = first  # without affinity: the next item to submit, to any worker
        self._advance()

    def remaining(self) -> int:
        """Items not taken yet."""
        return self.length - self.low - len(self.done)

    def taken(self, i: int) -> None:
        """Item ``i`` (submitted, not taken before) has been returned."""
        self.done.add(i)
        self._advance()

    def untaken(self, i: int) -> None:
        """Undo :meth:`taken` (an interrupted ``take``): ``i`` is not taken after all."""
        if i < self.low:
            self.low, self.done = i, self.done | set(range(i + 1, self.low))
        else:
            self.done.discard(i)

    def _advance(self) -> None:
        # One assignment of both attributes, so that a KeyboardInterrupt cannot split it.
        low = end = self.low
        while end in self.done:
            end += 1
        if end > low:
            self.low, self.done = end, self.done.difference(range(low, end))

    def next_items(self, worker_id: int, room: int, window: int) -> list[int]:
        """Claim up to ``room`` items of ``worker_id`` to submit, all below ``low + window``
        (without affinity: the next items of anyone)."""
        low = self.low
        limit = min(self.length, low + window)
        out: list[int] = []
        if not self.affinity:
            j = max(self._cursor, low)
            while len(out) < room and j < limit:
                if j not in self.done:
                    out.append(j)
                j += 1
            self._cursor = j
            return out
        j = self._next[worker_id]
        if j < low:  # items below low are all taken or skipped (skipped ones are not in done)
            j = low + (worker_id - low) % self._n
        while len(out) < room and j < limit:
            if j not in self.done:
                out.append(j)
            j += self._n
        self._next[worker_id] = j
        return out

    def restarted(self) -> "TakeWindow":
        """The same progress with nothing in flight (for a new generation)."""
        return TakeWindow(self.length, self._n, self.low, frozenset(self.done), affinity=self.affinity)


class Taker:
    """Out-of-order reading on an :class:`Inbox`: submits what its window allows, takes what completes."""

    def __init__(self, inbox: Inbox, roster: Roster, window: TakeWindow):
        self.inbox, self.roster, self.window = inbox, roster, window

    def take(self, window: int, timeout: float) -> tuple[int, Any]:
        """``(index, value)`` of the first item to complete (see :meth:`Prefetch.take`).

        An item is marked taken before its value is read, and unmarked if ``KeyboardInterrupt``
        comes before ``take`` returns: the interrupted call returns nothing, so the item comes
        again. An interrupt also starts a new generation: the items in flight are computed again.
        """
        i = None
        try:
            i, reply, m = self._next_ready(window, timeout)
            self.window.taken(i)
            try:
                out = self.inbox.result(i, reply, m)
            finally:
                self.fill(window)
        except KeyboardInterrupt:
            if i is not None:
                self.window.untaken(i)
            self.inbox.interrupted()  # replies half-handled by the interrupt are dropped
            self.window = self.window.restarted()
            raise
        return i, out

    def fill(self, window: int) -> None:
        """Submit every item the window allows to every worker with room for it (without
        affinity: one item at a time round the workers, as torch hands out indices)."""
        roster, w = self.roster, self.window
        while True:
            submitted = False
            for m in roster.members:
                room = roster.room(m)
                if room <= 0:
                    continue
                for j in w.next_items(m.worker_id, room if w.affinity else 1, window):
                    submitted = True
                    roster.submit(m, self.inbox.gen, j)  # a dead worker: handled by the next wait
            if w.affinity or not submitted:
                return

    def _next_ready(self, window: int, timeout: float) -> tuple:
        """Wait (bounded, liveness-checked) for a completed item; pop it: ``(index, reply, worker)``."""
        inbox = self.inbox
        self.fill(window)
        inbox.wait(lambda: bool(inbox.ready), timeout, lambda: self.window.low, lambda: self.fill(window),
                   lambda: f"any item to complete (the oldest not taken is item {self.window.low})")
        i = next(iter(inbox.ready))
        reply, m = inbox.ready.pop(i)
        return i, reply, m


def continue_in_order(reader: "InOrder", roster: Roster, length: int, label: str) -> TakeWindow:
    """The take window of a reader that was reading in order: its read-ahead (items
    ``next_read .. next_submit - 1``) is kept, not recomputed.

    Raises:
        ValueError: the read position is unknown (an interrupted indexed read).
    """
    if reader.next_read < 0:
        raise ValueError(f"{label}: the read position is unknown after an interrupted read; "
                         "call seek(position) before take()")
    return TakeWindow(length, roster.num_workers, reader.next_read, submitted=reader.next_submit,
                      affinity=roster.affinity)
