"""Reading in order: the read-ahead behind ``Prefetch[i]``.

:class:`InOrder` keeps the items ``next_read .. next_read + num_workers * prefetch_factor - 1``
in flight, item ``j`` on worker ``j % num_workers`` (torch's assignment; without affinity, the
worker with the most room), at most ``prefetch_factor`` jobs per worker. A full worker makes the
reader wait rather than skip ahead. Reading another item than ``next_read`` is a seek, which the
owner (:class:`~seqloader.prefetcher.prefetch.Prefetch`) handles by starting a new generation
and calling :meth:`InOrder.restart`. The out-of-order counterpart is
:mod:`seqloader.prefetcher.unordered`.
"""

from __future__ import annotations

from seqloader.prefetcher.crew import Crew
from seqloader.prefetcher.inbox import Inbox

__all__ = ["InOrder"]


class InOrder:
    """The in-order read position of one ``Prefetch``; see the module docstring.

    ``next_read`` is the next item to read and ``next_submit`` the next to send; both are ``-1``
    when the position is unknown (an interrupted read, or the owner reads with ``take``).
    """

    def __init__(self, inbox: Inbox, crew: Crew):
        self.inbox, self.crew = inbox, crew
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
        crew = self.crew
        gen = self.inbox.gen
        limit = min(self.length, self.next_read + crew.num_workers * crew.prefetch_factor)
        while self.next_submit < limit:
            h = crew.worker_for(self.next_submit)
            if h is None:  # in order: wait for that worker rather than skip ahead
                return
            crew.submit(h, gen, self.next_submit)
            self.next_submit += 1
