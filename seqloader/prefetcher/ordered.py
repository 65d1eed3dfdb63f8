"""Reading in order: the read-ahead behind ``Prefetch[i]``.

:class:`InOrder` keeps the items ``next_read .. next_read + num_workers * prefetch_factor - 1``
in flight (times each worker's concurrency), item ``j`` on worker ``j % num_workers`` (torch's
assignment; without affinity, the worker with the most room), at most ``prefetch_factor`` jobs per
worker (per thread of a worker). A full worker makes the
reader wait rather than skip ahead. Reading another item than ``next_read`` is a seek, which the
owner (:class:`~seqloader.prefetcher.prefetch.Prefetch`) handles by starting a new generation
and calling :meth:`InOrder.restart`. The out-of-order counterpart is
:mod:`seqloader.prefetcher.unordered`.
"""

from __future__ import annotations

from seqloader.prefetcher.inbox import Inbox
from seqloader.prefetcher.roster import Roster

__all__ = ["InOrder"]


class InOrder:
    """The in-order read position of one ``Prefetch``; see the module docstring.

    ``next_read`` is the next item to read and ``next_submit`` the next to send; both are ``-1``
    when the position is unknown (an interrupted read, or the owner reads with ``take``).
    """

    def __init__(self, inbox: Inbox, roster: Roster):
        self.inbox, self.roster = inbox, roster
        self.next_read = self.next_submit = 0
        self.length = 0

    def restart(self, position: int, length: int | None = None) -> None:
        """Read from ``position`` on (``-1``: unknown); the caller started a new generation."""
        self.next_read = self.next_submit = position
        if length is not None:
            self.length = length

    def read(self, i: int, timeout: float) -> tuple:
        """Wait (bounded, liveness-checked) for item ``i == next_read``; pop its ``(reply, worker)``."""
        inbox = self.inbox
        self.fill()
        if i not in inbox.ready:
            inbox.wait(lambda: i in inbox.ready, timeout, lambda: i, self.fill, lambda: f"item {i}")
        inbox.reads += 1
        inbox.ready_sum += len(inbox.ready)
        reply = inbox.ready.pop(i)
        self.next_read = i + 1
        self.fill()
        return reply

    def fill(self) -> None:
        """Send every item of the read-ahead window whose worker has room, in order."""
        roster = self.roster
        gen = self.inbox.gen
        limit = min(self.length, self.next_read + roster.num_workers * roster.capacity)
        while self.next_submit < limit:
            m = roster.worker_for(self.next_submit)
            if m is None:  # in order: wait for that worker rather than skip ahead
                return
            roster.submit(m, gen, self.next_submit)
            self.next_submit += 1
