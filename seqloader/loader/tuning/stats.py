"""L3: where a loader's time goes: is the training loop waiting for data, and on which stage?

An iterator brackets each ``next()`` with :meth:`LoaderStats.start` and :meth:`LoaderStats.returned`
(two ``perf_counter`` calls: the loader's one clock). The time spent inside ``next()`` is
*waiting* (the loop is input-bound); the time from one ``next()`` returning to the following call
is the loop's own *work*. Their ratio is the input-bound fraction of the epoch's wall time. The
latest batch's numbers stay readable (:class:`BatchClock`): ``autotune`` reads them instead of
timing the same ``next()`` again. The time ``iter()`` took (starting workers, opening the epoch)
is its own line, ``startup_s``. Worker-side numbers (busy time, items computed, read-ahead used,
bytes through shared memory, dead workers replaced) come from the prefetcher when workers are
used. Always on: the cost is a few hundred nanoseconds per batch. The hint's thresholds are
autotune's (:mod:`~seqloader.loader.tuning.rules`: one number for each notion).

**Which stage** (``DataLoader(profile_stages=True)``): :class:`StageAccount`, the per-stage account
of an epoch (it was ``stage_stats.py``; one concept with the rest: where the time goes). The stages
are timed where they run, exclusive of the stages nested in them
(:mod:`seqloader.sequences.stage_times`): in the worker processes (or in this process at
``num_workers=0``) each ``smap(f)`` and ``rng_map(f)`` (the calls of ``f``), ``"fetch"`` (the
dataset's ``__getitem__``/``__getitems__``, or reading an ``IterableDataset``, less the ``smap``s
inside it), ``"collate"`` (``collate_fn``, or ``default_collate`` stacking into the shared-memory
slot) and ``"transfer"`` (pickling the batch into shared memory; workers only), ``"other"`` being
the rest of the time spent computing batches; in this process ``"pin"`` (``pin_memory``). Workers
send their totals with each batch, summed by the prefetcher (``Prefetch.counters()["stages"]``). A
stage's ``share`` is its part of the time spent computing batches; ``pin``'s is its part of the
loop's wall time.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable, Optional

from seqloader.loader.tuning.epoch_stats import OTHER, PIN, EpochStats, StageAccount
from seqloader.loader.tuning.totals import RAISED, Totals, worker_deltas
from seqloader.sequences import stage_times

__all__ = ["OTHER", "PIN", "BatchClock", "EpochStats", "LoaderStats", "StageAccount"]

_log = logging.getLogger("seqloader.stats")

class BatchClock:
    """The loader's one clock: the latest ``next()``, as :meth:`LoaderStats.start` and
    :meth:`LoaderStats.returned` timed it (``autotune`` reads it, never times the batch again).

    Attributes:
        returned_at: when the latest ``next()`` returned (``perf_counter``), ``None`` before the
            first of an iterator and after ``StopIteration``.
        wait_s: the seconds the latest ``next()`` took: the loop's wait for that batch.
        work_s: the loop's work before it (from the previous ``next()`` returning), ``None`` for
            the first batch of an iterator.
    """

    __slots__ = ("returned_at", "wait_s", "work_s")

    def __init__(self) -> None:
        self.returned_at: Optional[float] = None
        self.wait_s = 0.0
        self.work_s: Optional[float] = None


class LoaderStats:
    """The current and last epoch's :class:`EpochStats`, plus resumes and seeks; ``clock``, the
    latest batch (:class:`BatchClock`); ``totals``, since the loader was built
    (:class:`~seqloader.loader.tuning.totals.Totals`).

    Example:
        >>> s = LoaderStats()
        >>> s.begin(epoch=0)
        >>> t = s.start(); s.returned(t)     # one next() that returned a batch
        >>> s.current.batches, 0.0 <= s.current.input_bound <= 1.0, s.clock.work_s   # the first: no work before it
        (1, True, None)
        >>> t = s.start(); s.returned(t)
        >>> c = s.clock; c.wait_s >= 0.0 and c.work_s >= 0.0 and c.returned_at >= t
        True
    """

    def __init__(self) -> None:
        self.current: Optional[EpochStats] = None
        self.last: Optional[EpochStats] = None
        self.resumes = 0         # load_state_dict calls that an iterator then resumed
        self.log_every_s: Optional[float] = None
        self.clock = BatchClock()                # the latest next()
        self.totals = Totals()                   # since the loader was built (export_metrics)
        self._attached: Optional[tuple] = None   # (a weak reference to the epoch's Prefetch (never keep
        #                                          an iterator's workers alive), its counters then): one value
        self._logged = time.perf_counter()
        self.profile = False                     # the current epoch times its stages (profile_stages)
        self._times: Optional[stage_times.StageTimes] = None  # ... computed in this process
        self._opening = 0.0                      # when the current iter() began
        self.trace: Any = None                   # a Trace recording (loader.trace(path)), or None

    def begin(self, epoch: int, resumed: bool = False, profile: bool = False) -> None:
        """A new iterator: a new current epoch (the previous one becomes ``last``); ``profile``: its
        stages are timed (workers time theirs if they were started with ``profile_stages``)."""
        self._opening = time.perf_counter()
        cur = self.current
        if cur is not None:   # (in this order: a scrape reading meanwhile counts less, never twice)
            self.refresh()
            self._attached = None
            self.totals.retire(cur)
            if cur.batches:
                self.last = cur
        self.current = EpochStats(epoch)
        self.resumes += int(resumed)
        self.clock.returned_at = None
        self.profile = profile
        self._times = stage_times.StageTimes() if profile else None

    def opened(self) -> None:
        """``iter()`` returns its iterator: the time since :meth:`begin` is the epoch's start-up."""
        if self.current is not None:
            self.current.startup_s += time.perf_counter() - self._opening

    def compute(self, seq: Any, i: int) -> Any:
        """``seq[i]`` computed in this process (``num_workers=0``), its stages timed when profiling."""
        times, cur = self._times, self.current
        if times is None or cur is None:
            return seq[i]
        start = time.perf_counter()
        try:
            with stage_times.collecting(times):
                return seq[i]
        finally:
            cur.account.busy_s += time.perf_counter() - start
            cur.account.batches += 1

    def timed_main(self, f: Callable[[Any], Any], batch: Any) -> Any:
        """``f(batch)`` (pinning) in this process, counted as the stage ``"pin"``."""
        start = time.perf_counter()
        try:
            return f(batch)
        finally:
            if self.current is not None:
                self.current.account.pin_s += time.perf_counter() - start

    def attach(self, source: Any) -> None:
        """The epoch reads a ``Prefetch``: its counters from now on are the epoch's worker numbers.

        Only a weak reference is kept; the iterator calls :meth:`refresh` before it closes its
        workers, and numbers of workers dropped with an abandoned iterator stay as last refreshed.
        """
        self._attached = (weakref.ref(source), source.counters())
        if self.trace is not None:
            self.trace.follow(source)

    def traced(self, trace: Any) -> None:
        """Record the loop's waits and the attached workers' batches into ``trace`` from now on
        (:class:`~seqloader.loader.tuning.trace.Trace`; ``None``: stop)."""
        self.trace = trace
        source = None if self._attached is None else self._attached[0]()
        if trace is not None and source is not None:
            trace.follow(source)

    def refresh(self) -> None:
        """Copy the workers' numbers since :meth:`attach` (and the stages timed here) into the current epoch."""
        if self._times is not None and self.current is not None:
            self.current.account.add(self._times.take())
        seen = self._seen()
        if seen is None or self.current is None:
            return
        (now, base), cur = seen, self.current
        cur.workers = worker_deltas(now, base)
        cur.executor = now.get("executor", "process")
        reads = now["reads"] - base["reads"]
        cur.ready_mean = (now["ready_sum"] - base["ready_sum"]) / reads if reads else 0.0
        cur.shm_bytes = now["shm_bytes"] - base["shm_bytes"]
        cur.worker_restarts = now["restarts"] - base["restarts"]
        if now["stages"]:
            cur.account.seconds = {k: v - base["stages"].get(k, 0.0) for k, v in now["stages"].items()}

    def _seen(self) -> Optional[tuple[dict, dict]]:
        """``(counters now, counters at attach)`` of the epoch's ``Prefetch``, if it is alive."""
        attached = self._attached
        if attached is None:
            return None
        source = attached[0]()
        return None if source is None else (source.counters(), attached[1])

    def read_totals(self) -> dict:
        """:meth:`Totals.read <seqloader.loader.tuning.totals.Totals.read>`, the live epoch's worker
        numbers read now. It changes nothing: a scrape calls it from its own thread while the loop runs
        (reading the epochs gone first, it can count less than the truth for a moment, never more)."""
        gone, seen, cur = self.totals.gone, self._seen(), self.current   # (in this order: see begin())
        if seen is not None:
            live = (worker_deltas(*seen), seen[0]["restarts"] - seen[1]["restarts"])
        else:   # as last refreshed (its workers closed), unless retired already
            live = ([], 0) if cur is None or cur is gone[2] else (cur.workers, cur.worker_restarts)
        return self.totals.read(gone, *live, cur)

    def report(self, num_workers: int, cores: Optional[int], persistent: bool = False,
               dataset: Any = None) -> dict[str, Any]:
        """``DataLoader.stats()``: the current and last epoch, resumes, and a hint (or ``None``).

        Returns:
            ``{"current": {...} or None, "last": {...} or None, "resumes": int, "hint": str or
            None}``. Each epoch entry has ``epoch``, ``batches``, ``wait_s`` (time inside
            ``next()``), ``work_s`` (time between ``next()`` calls), ``input_bound`` (their
            ratio: the fraction of wall time spent waiting), ``batches_per_s``, ``startup_s``
            (time in ``iter()``), ``stages`` (the per-stage account, with ``profile_stages``) and,
            with workers, ``workers`` (per worker ``busy_s`` and ``items``), ``ready_mean``
            (batches already computed when one was read) and ``shm_bytes``. ``hint``: see
            :meth:`EpochStats.hint` (``dataset``: checked for open files before threads are advised).
        """
        self.refresh()
        cur = self.current
        return {"current": None if cur is None else cur.as_dict(),
                "last": None if self.last is None else self.last.as_dict(),
                "resumes": self.resumes,
                "hint": None if cur is None else cur.hint(num_workers, cores, persistent, dataset)}

    def reading(self, epoch: int) -> None:
        """The current iterator reads ``epoch`` after all (a ``set_epoch`` between ``iter()`` and its
        first ``next()``)."""
        if self.current is not None:
            self.current.epoch = epoch

    def start(self) -> float:
        """A ``next()`` begins: the time since the previous one returned was the loop's work."""
        now = time.perf_counter()
        clock = self.clock
        returned, clock.work_s = clock.returned_at, None
        if returned is not None and self.current is not None:
            clock.work_s = now - returned
            self.current.work_s += clock.work_s
        return now

    def returned(self, start: float, batch: Any = RAISED) -> None:
        """The ``next()`` begun at ``start`` returned ``batch`` (or raised: the batch is consumed)."""
        assert self.current is not None, "LoaderStats.begin() first"
        self._count(self.current, start)
        self.totals.add(self.clock.wait_s, batch)

    def stopped(self) -> None:
        """The ``next()`` raised ``StopIteration``: the epoch is over."""
        self.clock.returned_at = None

    def _count(self, cur: EpochStats, start: float) -> None:
        end = time.perf_counter()
        clock = self.clock
        clock.wait_s = end - start
        cur.wait_s += clock.wait_s
        cur.batches += 1
        clock.returned_at = end
        if self.trace is not None:  # loader.trace(): the wait on the training loop's lane
            self.trace.waited(start, end)
        if self.log_every_s is not None and end - self._logged >= self.log_every_s:
            self._logged = end
            _log.info("seqloader: epoch %d, %d batches, %.1f batches/s, input-bound %.0f%%",
                      cur.epoch, cur.batches, cur.batches_per_s, 100 * cur.input_bound)
