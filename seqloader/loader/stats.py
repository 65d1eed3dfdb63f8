"""L3: where a loader's time goes: is the training loop waiting for data?

An iterator brackets each ``next()`` with :meth:`LoaderStats.start` and :meth:`LoaderStats.returned`
(two ``perf_counter`` calls). The
time spent inside ``next()`` is *waiting* (the loop is input-bound); the time from one ``next()``
returning to the following call is the loop's own *work*. Their ratio is the input-bound fraction
of the epoch's wall time. Worker-side numbers (busy time, items computed, read-ahead used, bytes
through shared memory, dead workers replaced) come from the prefetcher when workers are used. Always on: the cost is a
few hundred nanoseconds per batch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from typing import Any, Optional

__all__ = ["EpochStats", "LoaderStats"]

_log = logging.getLogger("seqloader.stats")


@dataclasses.dataclass
class EpochStats:
    """The numbers of one epoch (or of the part of it read so far).

    Attributes:
        epoch: the loader's epoch counter.
        batches: batches returned by ``next()`` (including ones that raised).
        wait_s: seconds spent inside ``next()``: the loop waiting for data.
        work_s: seconds between a ``next()`` returning and the following call: the loop's work.
        workers: per worker ``{"busy_s", "items", "restarts"}`` (empty at ``num_workers=0``).
        ready_mean: the mean number of batches already computed when one was read (read-ahead used).
        shm_bytes: bytes of results that came back through shared memory.
        worker_restarts: dead workers replaced during the epoch (``max_worker_restarts``).
    """

    epoch: int
    batches: int = 0
    wait_s: float = 0.0
    work_s: float = 0.0
    workers: list = dataclasses.field(default_factory=list)
    ready_mean: float = 0.0
    shm_bytes: int = 0
    worker_restarts: int = 0

    @property
    def input_bound(self) -> float:
        """The fraction of wall time the loop spent waiting for data, in ``[0, 1]``."""
        total = self.wait_s + self.work_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches per second of wall time (waiting plus work)."""
        total = self.wait_s + self.work_s
        return self.batches / total if total > 0 else 0.0

    def hint(self, num_workers: int, cores: Optional[int]) -> Optional[str]:
        """A one-line suggestion, only when the numbers support it; else ``None``.

        The loop must be input-bound (waiting >= 20% of the time) and every worker saturated
        (busy >= 90% of the wall time); then more workers would help if cores are free.
        """
        total = self.wait_s + self.work_s
        if self.batches < 10 or total <= 0 or self.input_bound < 0.2 or not self.workers:
            return None
        busy = min(w["busy_s"] for w in self.workers) / total
        if busy < 0.9:
            return None
        want = int(num_workers / max(1e-9, 1 - self.input_bound) + 0.999)
        if cores is not None and num_workers >= cores:
            return (f"input-bound: {self.input_bound:.0%} of wall time waiting for data and all "
                    f"{num_workers} workers busy, with no idle core left: make the items cheaper")
        want = want if cores is None else min(want, cores)
        return (f"input-bound: {self.input_bound:.0%} of wall time waiting for data and all "
                f"{num_workers} workers busy; try num_workers={want}")

    def as_dict(self) -> dict[str, Any]:
        """JSON types, with the derived ``input_bound`` and ``batches_per_s``."""
        return {**dataclasses.asdict(self), "input_bound": self.input_bound,
                "batches_per_s": self.batches_per_s}


class LoaderStats:
    """The current and last epoch's :class:`EpochStats`, plus resumes and seeks.

    Example:
        >>> s = LoaderStats()
        >>> s.begin(epoch=0)
        >>> t = s.start(); s.returned(t)     # one next() that returned a batch
        >>> s.current.batches, 0.0 <= s.current.input_bound <= 1.0
        (1, True)
    """

    def __init__(self) -> None:
        self.current: Optional[EpochStats] = None
        self.last: Optional[EpochStats] = None
        self.resumes = 0         # load_state_dict calls that an iterator then resumed
        self.log_every_s: Optional[float] = None
        self._returned: Optional[float] = None   # when the latest next() returned
        self._source: Any = None                 # a weak reference to the epoch's Prefetch (never
        self._base: Optional[dict] = None        # keep an iterator's workers alive), its counters
        self._logged = time.perf_counter()

    def begin(self, epoch: int, resumed: bool = False) -> None:
        """A new iterator: a new current epoch (the previous one becomes ``last``)."""
        if self.current is not None and self.current.batches:
            self.refresh()
            self.last = self.current
        self.current = EpochStats(epoch)
        self.resumes += int(resumed)
        self._returned = None
        self._source = self._base = None

    def attach(self, source: Any) -> None:
        """The epoch reads a ``Prefetch``: its counters from now on are the epoch's worker numbers.

        Only a weak reference is kept; the iterator calls :meth:`refresh` before it closes its
        workers, and numbers of workers dropped with an abandoned iterator stay as last refreshed.
        """
        self._source, self._base = weakref.ref(source), source.counters()

    def refresh(self) -> None:
        """Copy the workers' numbers since :meth:`attach` into the current epoch."""
        source = None if self._source is None else self._source()
        if source is None or self.current is None:
            return
        now, base = source.counters(), self._base
        assert base is not None  # set with _source by attach()
        cur = self.current
        cur.workers = [{k: w[k] - b[k] for k in ("busy_s", "items", "restarts")}
                       for w, b in zip(now["workers"], base["workers"])]
        reads = now["reads"] - base["reads"]
        cur.ready_mean = (now["ready_sum"] - base["ready_sum"]) / reads if reads else 0.0
        cur.shm_bytes = now["shm_bytes"] - base["shm_bytes"]
        cur.worker_restarts = now["restarts"] - base["restarts"]

    def report(self, num_workers: int, cores: Optional[int]) -> dict[str, Any]:
        """``DataLoader.stats()``: the current and last epoch, resumes, and a hint (or ``None``).

        Returns:
            ``{"current": {...} or None, "last": {...} or None, "resumes": int, "hint": str or
            None}``. Each epoch entry has ``epoch``, ``batches``, ``wait_s`` (time inside
            ``next()``), ``work_s`` (time between ``next()`` calls), ``input_bound`` (their
            ratio: the fraction of wall time spent waiting), ``batches_per_s``, and, with
            workers, ``workers`` (per worker ``busy_s`` and ``items``), ``ready_mean`` (batches
            already computed when one was read) and ``shm_bytes``. ``hint`` suggests more
            workers only when the loop is input-bound and every worker is busy.
        """
        self.refresh()
        cur = self.current
        return {"current": None if cur is None else cur.as_dict(),
                "last": None if self.last is None else self.last.as_dict(),
                "resumes": self.resumes, "hint": None if cur is None else cur.hint(num_workers, cores)}

    def reading(self, epoch: int) -> None:
        """The current iterator reads ``epoch`` after all (a ``set_epoch`` between ``iter()`` and its
        first ``next()``)."""
        if self.current is not None:
            self.current.epoch = epoch

    def start(self) -> float:
        """A ``next()`` begins: the time since the previous one returned was the loop's work."""
        now = time.perf_counter()
        if self._returned is not None and self.current is not None:
            self.current.work_s += now - self._returned
        return now

    def returned(self, start: float) -> None:
        """The ``next()`` begun at ``start`` returned a batch (or raised: the batch is consumed)."""
        assert self.current is not None, "LoaderStats.begin() first"
        self._count(self.current, start)

    def stopped(self) -> None:
        """The ``next()`` raised ``StopIteration``: the epoch is over."""
        self._returned = None

    def _count(self, cur: EpochStats, start: float) -> None:
        end = time.perf_counter()
        cur.wait_s += end - start
        cur.batches += 1
        self._returned = end
        if self.log_every_s is not None and end - self._logged >= self.log_every_s:
            self._logged = end
            _log.info("seqloader: epoch %d, %d batches, %.1f batches/s, input-bound %.0f%%",
                      cur.epoch, cur.batches, cur.batches_per_s, 100 * cur.input_bound)
