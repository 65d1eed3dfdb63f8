"""The reader's book of its workers: who owes which job, who has room, and what each has done.

One :class:`Member` per worker of an :class:`~seqloader.prefetcher.executor.Executor`: the jobs
``(gen, index)`` sent and not answered (``pending``, in the order they were sent), whether its
set-up has finished, and its counters (busy seconds, items, replacements). :class:`Roster`
assigns items to workers (worker ``index % num_workers``, torch's assignment, with
``affinity``; else the one with the most room), sends them through the executor and records
them. It is the same for every executor, so what a dead worker owed (healing) and how long an
item has waited (timeouts) are known above the executors.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from seqloader.prefetcher.executor import Executor

__all__ = ["Member", "Roster"]


class Member:
    """One worker's entry; see the module docstring."""

    __slots__ = ("worker_id", "pending", "set_up", "started_at", "busy_s", "cpu_s", "items", "restarts",
                 "replaces_starting")

    def __init__(self, worker_id: int):
        self.worker_id = worker_id
        self.pending: dict[tuple[int, int], None] = {}  # (gen, index), in the order sent
        self.set_up = False
        self.started_at = time.monotonic()
        self.busy_s, self.cpu_s, self.items = 0.0, 0.0, 0
        self.restarts = 0  # workers with this id that died and were replaced before this one
        self.replaces_starting = False  # it replaces a worker that died before its set-up finished

    def owed(self, gen: int) -> list[int]:
        """The items of generation ``gen`` it was sent and has not answered, in increasing order."""
        return sorted(i for g, i in self.pending if g == gen)

    def first_pending(self) -> Optional[int]:
        """The item it was sent first among those it has not answered (what it is computing)."""
        return next(iter(self.pending), (0, None))[1]

    def replaced(self) -> "Member":
        """The entry of its replacement: counters carried over, nothing pending, not set up."""
        new = Member(self.worker_id)
        new.busy_s, new.cpu_s, new.items, new.restarts = self.busy_s, self.cpu_s, self.items, self.restarts + 1
        new.replaces_starting = not self.set_up
        return new


class Roster:
    """The workers of one reader (see the module docstring).

    Args:
        executor: runs the jobs.
        prefetch_factor: jobs in flight per unit of a worker's concurrency.
        affinity: item ``i`` goes to worker ``i % num_workers`` (else the one with most room).
    """

    def __init__(self, executor: Executor, prefetch_factor: int, affinity: bool):
        self.executor = executor
        self.prefetch_factor, self.affinity = prefetch_factor, affinity
        self.num_workers = executor.num_workers
        self.capacity = prefetch_factor * executor.concurrency  # jobs in flight per worker
        self.members = [Member(w) for w in range(self.num_workers)]
        self.running = False  # every worker has finished its first set-up

    def room(self, m: Member) -> int:
        """How many more jobs ``m`` may take (none once it stopped accepting)."""
        return self.capacity - len(m.pending) if self.executor.accepting(m.worker_id) else 0

    def worker_for(self, index: int) -> Optional[Member]:
        """The worker for item ``index`` if it has room (see the class docstring), else ``None``."""
        if self.affinity:
            m = self.members[index % self.num_workers]
            return m if self.room(m) > 0 else None
        best = max(self.members, key=self.room)
        return best if self.room(best) > 0 else None

    def submit(self, m: Member, gen: int, index: int) -> None:
        """Send job ``(gen, index)`` to ``m`` and record it as owed."""
        m.pending[(gen, index)] = None
        self.executor.submit(m.worker_id, gen, index)

    def forget_pending(self) -> None:
        """Forget every job in flight (after an interrupt: their replies are dropped on arrival)."""
        for m in self.members:
            m.pending.clear()

    def worker_of(self, gen: int, index: int) -> Optional[Member]:
        """The worker computing item ``index`` of generation ``gen``, if any."""
        for m in self.members:
            if (gen, index) in m.pending:
                return m
        return None

    def replace(self, m: Member, seq: Any) -> Member:
        """Start a replacement of the dead worker ``m`` reading ``seq`` (see ``healing.py``)."""
        self.executor.replace(m.worker_id, seq)
        new = self.members[m.worker_id] = m.replaced()
        return new

    def counters(self) -> list[dict]:
        """Per worker: ``{"busy_s", "cpu_s", "items", "restarts"}``."""
        return [{"busy_s": m.busy_s, "cpu_s": m.cpu_s, "items": m.items, "restarts": m.restarts}
                for m in self.members]
