"""L3, pure policy: which configuration of the workers to try next, from measurements (``autotune=True``).

A :class:`Config` is one way to compute an epoch's batches: in this process (``"main"``), in
thread workers (``"thread"``), or in worker processes with threads inside each (``"process"``),
with a read-ahead depth (``prefetch``, torch's ``prefetch_factor``). Batches never depend on it,
so the loader may switch at any batch boundary (``loader/autotune.py`` does, seeking the new
workers to the position the user has consumed).

:class:`Tuner` decides. It is fed one :class:`BatchTiming` per delivered batch (the loop's wait in
``next()`` and its own work between calls) and, at the end of each trial, a :class:`Usage` (CPU
seconds and the memory the loader holds, measured by the caller); it answers with the next
configuration to run, or ``None``. It knows nothing of processes, clocks or ``/proc``, so it is
tested by feeding it numbers. The search, in order:

0. the first batch is computed in this process: a one-batch trial of ``num_workers=0`` (its
   time and the loop's work after it), and its size predicts the memory of the batches in
   flight before any worker holds one;
1. a trial of ``threads`` (``8 * max_workers`` thread workers); then, only if the threads kept
   at least 0.3 of a core busy (else the items wait rather than compute, and processes only add
   cores; threads that wait on a lock busy little CPU too, so the bar is low), of ``max_workers`` threads (fewer turns on the GIL) and of ``processes``
   (``max_workers``); then of ``processes x threads``
   (``max_workers`` processes of 4 threads) only if threads reached 70% of the processes' rate
   (the items wait as well as compute). A trial lasts ``trial_s`` seconds of delivered batches
   (at least 4, its first one not counted: start-up) and ends early when it is clearly slower
   (under half the best rate so far after half its time);
2. ``num_workers=0`` gets a full trial if its first batch came at half the best rate or more;
   the best rate wins; if the loop was not waiting (``< 10%`` of its time in ``next()``: it is
   consumer-bound), halve its workers (then threads, then ``num_workers=0``) while it keeps up,
   and keep the cheapest in CPU per batch among those within 5% of the best rate;
3. if the loop still waits 20-50% of its time with the winner (fed, but not always: a deeper
   read-ahead can absorb the jitter; waiting more, the workers are the limit), one trial with
   twice the read-ahead;
4. settle, and stay there until the loop's own time per batch changes by more than 2x (then
   search again), or the memory the loader holds (measured every 64 batches) exceeds
   ``memory_budget`` (then the winner is refused and the search goes on without it).

A configuration whose predicted memory exceeds the budget is never tried: a worker process is
predicted at the size measured for one in an earlier trial (before any, at ``worker_bytes``, the
training process's own size), and each batch in flight at the size of a delivered batch.
:class:`~seqloader.loader.autotune_trials.Schedule` is the other policy: switches at fixed batch
counts, for tests. The configurations, measurements and trials are ``loader/autotune_trials.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from seqloader.loader.autotune_trials import BatchTiming, Config, Policy, Schedule, Trial, Usage

__all__ = ["BatchTiming", "Config", "Policy", "Schedule", "Trial", "Tuner", "Usage"]

#: thread workers per allowed worker, and threads inside each worker process, at most
THREADS_PER_WORKER = 8
PROCESS_THREADS = 4
_KEEPS_UP = 0.10     # the loop waits less than this fraction of its time: consumer-bound
_WAITS = 0.20        # ... at least this (and less than _STARVED): a deeper read-ahead is tried
_STARVED = 0.50      # the loop waits this much: the workers are the limit, a deeper read-ahead cannot help
_SAME_RATE = 0.95    # rates within 5% of the best are equal (then the least CPU per batch wins)
_RETUNE = 2.0        # the loop's work per batch changed by more than this factor: search again
_WINDOW = 32         # the loop's step is the median of its last 32 (a preempted step is no change)
_STEP_FLOOR = 1e-3   # steps shorter than 1 ms count as 1 ms (their jitter is no change of the loop)
_CPU_BOUND = 0.3     # thread workers using fewer cores than this wait (latency): fewer threads, processes are not tried
_LATENCY = 0.7       # threads within this of processes' rate: threads inside processes are tried


class Tuner:
    """The measuring policy; see the module docstring.

    Args:
        max_workers: worker processes at most (``num_workers``, or the cores); thread workers at
            most ``8 * max_workers``.
        memory_budget: bytes the loader may hold (its worker processes and what this process grows).
        worker_bytes: a worker process's predicted size before one is measured.
        trial_s: seconds of delivered batches per trial.

    Example:
        >>> t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=1.0)
        >>> t.first().label
        'num_workers=0'
        >>> clock = {"now": 0.0}    # a batch every 0.1 s (0.3 s here), the loop waits 30% of it, one core busy
        >>> use = lambda: Usage(cpu_s=clock["now"], loader_bytes=0)
        >>> def batch(k):
        ...     clock["now"] = 0.1 * k
        ...     return t.observe(BatchTiming(now=clock["now"], wait_s=0.3 if k == 1 else 0.03, work_s=0.07), use)
        >>> asked = [batch(k) for k in range(1, 80)]
        >>> [c.label for c in asked if c is not None]
        ['16 threads, prefetch 2', '2 threads, prefetch 2', '2 processes, prefetch 2', '2 processes x 4 threads, prefetch 2', 'num_workers=0']
        >>> t.report()["switches"], t.report()["trying"]
        (5, 'num_workers=0')
        >>> Tuner(max_workers=0, memory_budget=1, worker_bytes=0)
        Traceback (most recent call last):
        ValueError: autotune: max_workers must be >= 1 (got 0)
    """

    def __init__(self, max_workers: int, memory_budget: int, worker_bytes: int, trial_s: float = 0.3):
        if max_workers < 1:
            raise ValueError(f"autotune: max_workers must be >= 1 (got {max_workers})")
        self.max_workers, self.memory_budget, self.trial_s = max_workers, memory_budget, trial_s
        self._worker_bytes, self._batch_bytes = worker_bytes, 0
        self._no_threads = ""
        self.trials: list[Trial] = []
        self.refused: dict[Config, str] = {}
        self.chosen: Optional[Config] = None
        self.reason = "searching"
        self.switches = 0
        self._queue: list[Config] = []
        self._trial: Optional[Trial] = None
        self._start: Optional[tuple[float, float]] = None   # (time, cpu_s) of the current trial's first batch
        self._work: list[float] = []                        # the loop's work per batch since settling
        self._settled_work = self._interval = 0.0
        self._search()

    # -- the search ---------------------------------------------------------------------------

    def _search(self) -> None:
        w = self.max_workers
        self._queue = [Config("thread", THREADS_PER_WORKER * w), Config("process", w),
                       Config("process", w, PROCESS_THREADS)]
        self.chosen, self.reason, self._stage = None, "searching", "executors"
        self._trial, self._start = None, None
        self._probing = True   # one batch in this process first: its size predicts the memory of the others
        self._open_probe: Optional[Trial] = None
        self.skipped: dict[str, str] = {}

    def _predicted(self, c: Config) -> int:
        procs = c.workers if c.method == "process" else 0
        return procs * self._worker_bytes + c.in_flight * self._batch_bytes

    def _next_allowed(self) -> Optional[Config]:
        """The next queued configuration within the budget (refusing the others), or ``None``."""
        while self._queue:
            c = self._queue.pop(0)
            if c in self.refused or any(t.config == c for t in self.trials):
                continue
            if self._no_threads and (c.method == "thread" or c.threads > 1):
                self.refused[c] = self._no_threads
                continue
            if self._predicted(c) > self.memory_budget:
                self.refused[c] = f"predicted {self._predicted(c)} bytes > memory_budget {self.memory_budget}"
                continue
            return c
        return None

    def first(self) -> Config:
        return Config("main")

    def no_threads(self, why: str) -> None:
        """Never try threads (thread workers, threads inside processes): ``why``."""
        self._no_threads = why
        for c in [*self._queue, *([self._trial.config] if self._trial else [])]:
            if c.method == "thread" or c.threads > 1:
                self.refused[c] = why

    def observe(self, timing: BatchTiming, usage: Callable[[], Usage]) -> Optional[Config]:
        self._batch_bytes = max(self._batch_bytes, timing.nbytes)
        if self._probing:   # the first batch, computed here: a one-batch trial of num_workers=0
            self._probing = False
            probe = Trial(Config("main"), batches=1, wall_s=timing.wait_s, wait_s=timing.wait_s,
                          cpu_s=timing.wait_s)   # (at most one core: its CPU is not measured)
            self.trials.append(probe)
            self._open_probe = probe
            return self._next_or_settle(None)
        if self._open_probe is not None and timing.work_s is not None:   # the loop's work after it
            self._open_probe.work_s = timing.work_s
            self._open_probe.wall_s += timing.work_s
            self._open_probe = None
        trial = self._trial
        if trial is None:
            return self._watch(timing, usage)
        if self._start is None:   # the trial's first batch: start-up is behind it
            self._start = (timing.now, usage().cpu_s)
            return None
        trial.batches += 1
        trial.wait_s += timing.wait_s
        trial.work_s += timing.work_s or 0.0
        trial.wall_s = timing.now - self._start[0]
        best = max((t.rate for t in self.trials), default=0.0)
        # workers deliver in bursts (each computes a whole batch): a trial spans two rounds of them
        rounds = trial.config.workers * trial.config.threads
        slow = trial.wall_s >= 0.5 * self.trial_s and trial.batches > rounds and trial.rate < 0.5 * best
        if not slow and (trial.wall_s < self.trial_s or trial.batches < max(4, 2 * rounds)):
            return None
        trial.cut_short = slow
        used = usage()
        trial.cpu_s = used.cpu_s - self._start[1]
        trial.memory_bytes = used.loader_bytes
        if used.worker_bytes:
            self._worker_bytes = used.worker_bytes
        self.trials.append(trial)
        if used.loader_bytes > self.memory_budget:
            self.refused[trial.config] = f"measured {used.loader_bytes} bytes > memory_budget {self.memory_budget}"
        return self._next_or_settle(trial)

    def _ok(self) -> list:
        return [t for t in self.trials if t.config not in self.refused]

    def _prune(self, trial: Trial) -> None:
        """Drop the queued trials that ``trial`` shows cannot win: processes when threads did not
        keep a core busy (not CPU-bound: processes add cores that nothing waits for), threads inside
        processes when threads were well behind processes (CPU-bound, not latency-bound)."""
        cores = trial.cpu_s / trial.wall_s if trial.wall_s > 0 else 0.0
        many = Config("thread", THREADS_PER_WORKER * self.max_workers)
        if trial.config == many and cores < _CPU_BOUND:
            drop = [c for c in self._queue if c.method == "process"]
            why = f"threads used {cores:.2f} cores (< {_CPU_BOUND}): the items wait, they do not compute"
        elif trial.config == many:   # they compute: as few threads as cores take fewer turns on the GIL
            if self.max_workers < many.workers:
                self._queue.insert(0, Config("thread", self.max_workers))
            return
        elif trial.config.method == "process" and trial.config.threads == 1:
            threads = [t for t in self.trials if t.config.method == "thread"]
            if threads and max(t.rate for t in threads) >= _LATENCY * trial.rate:
                return
            drop = [c for c in self._queue if c.method == "process" and c.threads > 1]
            why = "threads were well behind processes (or not tried): the items compute, they do not wait"
        else:
            return
        for c in drop:
            self._queue.remove(c)
            self.skipped[c.label] = why

    def _next_or_settle(self, trial: Optional[Trial]) -> Optional[Config]:
        """A trial ended (or the probe): the next trial, or settle."""
        if trial is not None and self._stage == "executors":
            self._prune(trial)
        if not self._queue and trial is not None:
            self._queue = self._follow_up(trial)
        nxt = self._next_allowed()
        if nxt is not None:
            self._trial, self._start = Trial(nxt), None
            self.switches += 1
            return nxt
        return self._settle(trial)

    def _follow_up(self, trial: Trial) -> list:
        """What the trials so far suggest trying: a smaller configuration while the loop keeps up,
        then a deeper read-ahead while it waits."""
        ok = self._ok()
        if not ok:
            return []
        best = max(ok, key=lambda t: t.rate)
        if self._stage == "executors":
            self._stage = "smaller"
            probe = next((t for t in ok if t.config.method == "main" and t.batches == 1), None)
            computes = any(t.config.method == "thread" and t.cpu_s >= _CPU_BOUND * t.wall_s for t in ok)
            if probe is not None and (computes or probe.rate >= 0.5 * best.rate):   # this process may do
                self.trials.remove(probe)
                return [Config("main")]
            smaller = _smaller(best.config) if best.waiting < _KEEPS_UP else None
            if smaller is not None:
                return [smaller]
        elif self._stage == "smaller" and trial in ok and trial.waiting < _KEEPS_UP \
                and trial.rate >= _SAME_RATE * best.rate:
            smaller = _smaller(trial.config)
            if smaller is not None:
                return [smaller]
        if self._stage != "deeper":
            self._stage = "deeper"
            pool = [t for t in ok if t.config.workers]
            top = max(pool, key=lambda t: t.rate) if pool else None
            if top is not None and _WAITS <= top.waiting < _STARVED:
                return [dataclasses.replace(top.config, prefetch=2 * top.config.prefetch)]
        return []

    def _settle(self, last: Optional[Trial]) -> Optional[Config]:
        ok = self._ok()
        self._trial, self._start, self._work, self._watched = None, None, [], 0
        if not ok:
            self.chosen = Config("main")
            self.reason = "num_workers=0: every other configuration exceeds memory_budget"
        else:
            top = max(t.rate for t in ok)
            same = [t for t in ok if t.rate >= _SAME_RATE * top]
            pick = min(same, key=lambda t: t.cpu_per_batch)
            stay = next((t for t in same if last is not None and t.config == last.config), None)
            if stay is not None and stay.cpu_per_batch <= 1.25 * pick.cpu_per_batch:
                pick = stay   # a switch drops the batches in flight: not for a few percent
            bound = "consumer-bound" if pick.waiting < _KEEPS_UP else "input-bound"
            self.chosen = pick.config
            self._settled_work = pick.work_s / max(1, pick.batches)
            self._interval = 1 / pick.rate if pick.rate > 0 else 0.0
            self.reason = (f"{pick.config.label}: {pick.rate:.1f} batches/s ({bound}: the loop waits "
                           f"{pick.waiting:.0%} of its time), {pick.cpu_per_batch * 1e3:.1f} ms CPU per batch, the "
                           f"least of {len(same)} within 5% of the best rate ({top:.1f}/s)")
        current = Config("main") if last is None else last.config
        if self.chosen == current:
            return None
        self.switches += 1
        return self.chosen

    def _watch(self, timing: BatchTiming, usage: Callable[[], Usage]) -> Optional[Config]:
        """Settled: search again when the loop's work per batch changed by more than 2x, or the
        memory held exceeds the budget."""
        self._watched += 1
        if self._watched % 64 == 0 and self.chosen is not None and self.chosen.workers:
            held = usage().loader_bytes
            if held > self.memory_budget:
                self.refused[self.chosen] = f"measured {held} bytes > memory_budget {self.memory_budget}"
                self.trials = []
                self._search()
                self._probing = False
                return self._next_or_settle(None)
        if timing.work_s is None:
            return None
        self._work.append(timing.work_s)
        if len(self._work) < _WINDOW:
            return None
        # the median (a hiccup is no change), and steps far shorter than a batch's interval are all alike
        floor = max(_STEP_FLOOR, 0.5 * self._interval)
        recent = max(sorted(self._work[-_WINDOW:])[_WINDOW // 2], floor)
        base = max(self._settled_work, floor)
        if recent > _RETUNE * base or recent < base / _RETUNE:
            self.trials, self.refused = [], {c: why for c, why in self.refused.items() if why.startswith("measured")}
            self._search()
            self._probing = False   # (the first search's probe measured the batches' size)
            return self._next_or_settle(None)
        del self._work[:-_WINDOW]
        return None

    def report(self) -> dict:
        return {"policy": "tuner", "chosen": None if self.chosen is None else self.chosen.label,
                "reason": self.reason, "switches": self.switches,
                "trying": None if self._trial is None else self._trial.config.label,
                "trials": [t.as_dict() for t in self.trials],
                "refused": {c.label: why for c, why in self.refused.items()}, "skipped": dict(self.skipped),
                "memory_budget": self.memory_budget}


def _smaller(c: Config) -> Optional[Config]:
    """The next cheaper configuration than ``c``: fewer threads inside, then fewer workers, then none."""
    if c.method == "process" and c.threads > 1:
        return dataclasses.replace(c, threads=c.threads // 2)
    if c.workers > 1:
        return dataclasses.replace(c, workers=c.workers // 2)
    if c.workers == 1:
        return Config("main")
    return None

