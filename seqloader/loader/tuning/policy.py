"""L3, pure policy: which configuration of the workers to try next, from measurements (``autotune=True``).

A :class:`Config` is one way to compute an epoch's batches: in this process (``"main"``), in
thread workers (``"thread"``), or in worker processes with threads inside each (``"process"``),
with a read-ahead depth (``prefetch``, torch's ``prefetch_factor``). Batches never depend on it,
so the loader may switch at any batch boundary (``loader/epoch/tuned.py`` does, seeking the new
workers to the position the user has consumed).

:class:`Tuner` decides. It is fed one :class:`BatchTiming` per delivered batch (the loop's wait in
``next()`` and its own work between calls) and, at the ends of each trial, a :class:`Usage` (CPU
seconds and the memory the loader holds, measured by the caller); it answers with the next
configuration to run, or ``None``. It knows nothing of processes, clocks or ``/proc``, so it is
tested by feeding it numbers. The search, in order (the rules are ``loader/tuning/rules.py``):

0. the first batch is computed in this process (with ``needs_processes``, none is: the search
   starts at 1, with processes): a one-batch trial of ``num_workers=0``; the share of a core it
   kept busy says whether the items compute or wait, and its size predicts the memory of the
   batches in flight before any worker holds one;
1. the executors: items that wait start with ``8 * max_workers`` thread workers, items that
   compute with ``max_workers`` threads; then ``max_workers`` processes and processes of 4
   threads, unless a trial rules them out (the loop kept up: nothing is faster; threads waited
   on the items, or kept the cores busy: processes add no core; threads far behind processes:
   threads inside them cannot help, nor where threads matched them). A trial does not count its
   first round of batches (the workers' start-up and the burst of batches they computed
   together), then measures at least ``trial_s`` seconds, 8 batches and two rounds, in whole
   rounds; it ends early when, after half its time, it is under 0.6 of the best rate so far;
2. ``num_workers=0`` gets a full trial if its first batch came at 0.7 of the best rate or more;
   if the loop was not waiting (``< 10%`` of its time in ``next()``: it is consumer-bound),
   halve its workers (then threads, then ``num_workers=0``) while it keeps up, and keep the
   cheapest in CPU per batch among those within 5% of the best rate;
3. if the loop still waits 20-50% of its time with the winner (fed, but not always: a deeper
   read-ahead can absorb the jitter; waiting more, the workers are the limit), one trial with
   twice the read-ahead;
4. the winner is measured again, in place, for ``4 * trial_s``: if it delivers under 0.85 of the
   runner-up's rate, its first trial was lucky (a loaded machine misjudges a short trial by up
   to 2x), and the runner-up is measured again before choosing; each configuration is confirmed
   once;
5. settle, and stay there until the loop's own time per batch changes by more than 2x, or the
   memory the loader holds (measured every 5 s) exceeds ``memory_budget`` (then the winner is
   refused and the search goes on without it). A slower loop re-measures the configuration in
   force in place and tries only cheaper ones; a faster loop searches the executors again.

The step the search stands at is a :class:`~seqloader.loader.tuning.trials.Stage`, and the
trial being measured a :class:`~seqloader.loader.tuning.trials.Measuring`.

A configuration whose predicted memory exceeds the budget is never tried: a worker process is
predicted at the size measured for one in an earlier trial (before any, at ``worker_bytes``, the
training process's own size), and each batch in flight at the size of a delivered batch. Nor is
a kind of configuration ruled out by what the user asked for or the pipeline allows
(``needs_processes``: ``max_worker_restarts``; :meth:`Tuner.no_threads`, :meth:`Tuner.no_processes`):
each is reported, with its reason, under ``not_tried``, and the choice's reason says it.
:class:`~seqloader.loader.tuning.trials.Schedule` is the other policy: switches at fixed batch
counts, for tests. The configurations, measurements and trials are ``loader/tuning/trials.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from seqloader.loader.tuning.rules import (KEEPS_UP, PROCESS_THREADS, THREADS_PER_WORKER, StepWatch, executors,
                                             floor, not_tried_words, pruned, ruled_out, smaller)
from seqloader.loader.tuning.trials import BatchTiming, Config, Measuring, Policy, Schedule, Stage, Trial, Usage

__all__ = ["BatchTiming", "Config", "Policy", "Schedule", "Stage", "Trial", "Tuner", "Usage"]

__all__ += ["PROCESS_THREADS", "THREADS_PER_WORKER"]
_WAITS = 0.20        # the loop waits at least this (and less than _STARVED): a deeper read-ahead is tried
_STARVED = 0.50      # the loop waits this much: the workers are the limit, a deeper read-ahead cannot help
_MAIN = 0.7          # num_workers=0 gets a full trial if its first batch came at this share of the best rate
_SAME_RATE = 0.95    # rates within 5% of the best are equal (then the least CPU per batch wins)
_LOSING = 0.6        # after half its time, a trial under this share of the best rate ends early
_MIN_BATCHES = 8     # a trial measures at least this many batches after its first round
_CONFIRM = 4         # the winner is measured again in place for this many trial lengths ...
_DISAGREE = 0.85     # ... and under this share of the runner-up's rate, the runner-up is measured again


class Tuner:
    """The measuring policy; see the module docstring.

    Args:
        max_workers: worker processes at most (``num_workers``, or the cores); thread workers at
            most ``8 * max_workers``.
        memory_budget: bytes the loader may hold (its worker processes and what this process grows).
        worker_bytes: a worker process's predicted size before one is measured.
        trial_s: seconds of delivered batches per trial.
        cores: the cores this process may run on (default ``max_workers``).
        needs_processes: why only worker processes may run the batches (``max_worker_restarts``:
            ``"max_worker_restarts=3 needs worker processes"``), or ``""``. Then no batch is
            computed in this process: the first trial is ``max_workers`` processes, threads are
            never tried (whether the batches draw from the global generators is checked on a
            batch computed here), and the smallest configuration is one process.

    Example:
        >>> t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, trial_s=1.0)
        >>> t.first().label
        'num_workers=0'
        >>> clock = {"now": 0.0}    # a batch every 0.1 s (0.3 s here), the loop waits 30% of it, one core busy
        >>> use = lambda memory=True: Usage(cpu_s=clock["now"], loader_bytes=0)
        >>> def batch(k):           # (the first batch, computed here, kept its core busy: they compute)
        ...     clock["now"] = 0.1 * k
        ...     return t.observe(BatchTiming(now=clock["now"], wait_s=0.3 if k == 1 else 0.03, work_s=0.07,
        ...                                  cpu_s=0.3 if k == 1 else None), use)
        >>> asked = [batch(k) for k in range(1, 100)]
        >>> [c.label for c in asked if c is not None]
        ['2 threads, prefetch 2', '2 processes, prefetch 2', '2 threads, prefetch 4']
        >>> t.report()["switches"], t.report()["trying"], t.chosen.label   # confirmed, settled
        (3, None, '2 threads, prefetch 4')
        >>> t.report()["skipped"]["2 processes x 4 threads, prefetch 2"]
        'threads were as fast as processes: the GIL is not what limits them'
        >>> Tuner(max_workers=0, memory_budget=1, worker_bytes=0)
        Traceback (most recent call last):
        ValueError: autotune: max_workers must be >= 1 (got 0)
    """

    def __init__(self, max_workers: int, memory_budget: int, worker_bytes: int, trial_s: float = 0.3,
                 cores: Optional[int] = None, needs_processes: str = ""):
        if max_workers < 1:
            raise ValueError(f"autotune: max_workers must be >= 1 (got {max_workers})")
        self.max_workers, self.memory_budget, self.trial_s = max_workers, memory_budget, trial_s
        self.cores = cores or max_workers
        self._worker_bytes, self._batch_bytes = worker_bytes, 0
        #: the kinds of configuration never tried (``rules.KINDS``), each with its reason
        self.not_tried: dict[str, str] = {}
        if needs_processes:
            healed = f"{needs_processes} (a crash in the training process or in a thread worker cannot be healed)"
            self.not_tried = {"num_workers=0": healed, "thread workers": healed,
                              "threads inside processes": f"{needs_processes}, and the check that the batches draw "
                              "nothing from the global generators (which threads share) computes a batch in the "
                              "training process"}
        self._share: Optional[float] = None   # the share of a core the first batch kept busy here
        self.trials: list[Trial] = []
        self.refused: dict[Config, str] = {}
        self.chosen: Optional[Config] = None
        self.reason = "searching"
        self.switches = 0
        self._running = floor(self.not_tried)   # the configuration in force (the last one asked for)
        self._watching = StepWatch()
        self._search(stage=Stage.EXECUTORS if needs_processes else Stage.PROBE)
        if needs_processes:   # no batch computed here: the first trial is of worker processes
            self._queue = executors(max_workers, None)
            nxt = self._next_allowed()
            if nxt is None:
                self._settle()   # nothing fits the budget: the floor, in force already
            else:
                self._begin(nxt, switched=True)
                self._running = nxt

    # -- the search ---------------------------------------------------------------------------

    def _search(self, queue: Optional[list] = None, stage: Stage = Stage.EXECUTORS) -> None:
        """A search starts at ``stage`` (``PROBE``: one batch in this process first; its size
        predicts the memory of the others) with ``queue`` to try."""
        self._queue = list(queue or [])
        self.chosen, self.reason, self._stage = None, "searching", stage
        self._measuring: Optional[Measuring] = None   # the trial being measured
        self._open_probe: Optional[Trial] = None
        self._confirmed: set = set()
        self.skipped: dict[str, str] = {}

    def _begin(self, config: Config, switched: bool) -> None:
        """A trial of ``config`` starts: after a switch its first round is not counted."""
        self._measuring = Measuring(Trial(config), max(1, config.workers * config.threads) if switched else 1)

    def _predicted(self, c: Config) -> int:
        procs = c.workers if c.method == "process" else 0
        return procs * self._worker_bytes + c.in_flight * self._batch_bytes

    def _next_allowed(self) -> Optional[Config]:
        """The next queued configuration within the budget (refusing the others), or ``None``."""
        while self._queue:
            c = self._queue.pop(0)
            if c in self.refused or any(t.config == c for t in self.trials):
                continue
            why = ruled_out(c, self.not_tried)
            if why:
                self.refused[c] = why
                continue
            if self._predicted(c) > self.memory_budget:
                self.refused[c] = f"predicted {self._predicted(c)} bytes > memory_budget {self.memory_budget}"
                continue
            return c
        return None

    def first(self) -> Config:
        """The configuration to start with (asked once, before any batch: the one in force)."""
        return self._running

    def no_threads(self, why: str) -> None:
        """Never try threads (thread workers, threads inside processes): ``why``."""
        self._rule_out(("thread workers", "threads inside processes"), why)

    def no_processes(self, why: str) -> None:
        """Never try worker processes (with or without threads inside): ``why``."""
        self._rule_out(("processes",), why)

    def _rule_out(self, kinds: tuple, why: str) -> None:
        for k in kinds:
            self.not_tried.setdefault(k, why)
        for c in [*self._queue, *([self._measuring.trial.config] if self._measuring else [])]:
            refusal = ruled_out(c, self.not_tried)
            if refusal:
                self.refused[c] = refusal

    def observe(self, timing: BatchTiming, usage: Callable[..., Usage]) -> Optional[Config]:
        if timing.nbytes > self._batch_bytes:
            self._batch_bytes = timing.nbytes
        if self._stage is Stage.PROBE:   # the first batch, computed here: a one-batch trial of num_workers=0
            self._stage = Stage.EXECUTORS
            cpu = timing.wait_s if timing.cpu_s is None else timing.cpu_s
            probe = Trial(Config("main"), batches=1, wall_s=timing.wait_s, wait_s=timing.wait_s, cpu_s=cpu)
            if timing.cpu_s is not None and timing.wait_s > 0:
                self._share = timing.cpu_s / timing.wait_s
            self.trials.append(probe)
            self._open_probe = probe
            self._queue = executors(self.max_workers, self._share)
            return self._next_or_settle(None)
        if self._open_probe is not None and timing.work_s is not None:   # the loop's work after it
            self._open_probe.work_s = timing.work_s
            self._open_probe.wall_s += timing.work_s
            self._open_probe = None
        measuring = self._measuring
        if measuring is None:
            return self._watch(timing, usage)
        if not measuring.count(timing, usage) or not self._ended(measuring.trial):
            return None
        used = usage()
        trial = measuring.finish(used)
        if used.worker_bytes:
            self._worker_bytes = used.worker_bytes
        if used.loader_bytes > self.memory_budget:
            self.refused[trial.config] = f"measured {used.loader_bytes} bytes > memory_budget {self.memory_budget}"
        if self._stage is Stage.CONFIRM:
            return self._confirm(trial)
        self.trials.append(trial)
        return self._next_or_settle(trial)

    def _ended(self, trial: Trial) -> bool:
        """Whether ``trial`` has measured enough: whole rounds of its workers (they deliver in
        bursts: each computes a whole batch), at least two and 8 batches, over ``trial_s`` (a
        confirmation: 4x that); or, after half that time, it is clearly losing."""
        rounds = max(1, trial.config.workers * trial.config.threads)
        length = self.trial_s * (_CONFIRM if self._stage is Stage.CONFIRM else 1)
        rivals = [t.rate for t in self._ok() if t.config != trial.config]
        if trial.wall_s >= 0.5 * length and trial.batches >= rounds and trial.rate < _LOSING * max(rivals, default=0):
            trial.cut_short = True
            return True
        return trial.wall_s >= length and trial.batches >= max(_MIN_BATCHES, 2 * rounds) and \
            trial.batches % rounds == 0

    def _ok(self) -> list:
        return [t for t in self.trials if t.config not in self.refused]

    def _prune(self, trial: Trial) -> None:
        """Apply the rules of ``loader/tuning/rules.py`` (:func:`pruned`) to the queue."""
        added, dropped, why = pruned(trial, self._queue, self.trials, self.max_workers, self.cores)
        for c in dropped:
            self._queue.remove(c)
            self.skipped[c.label] = why
        self._queue[:0] = added

    def _next_or_settle(self, trial: Optional[Trial]) -> Optional[Config]:
        """A trial ended (or the probe): the next trial, or settle."""
        if trial is not None and self._stage is Stage.EXECUTORS:
            self._prune(trial)
        if not self._queue and trial is not None:
            self._queue = self._follow_up(trial)
        nxt = self._next_allowed()
        if nxt is not None:
            self._begin(nxt, switched=nxt != self._running)
            return self._go(nxt)
        return self._settle()

    def _go(self, config: Config) -> Optional[Config]:
        """``config`` is in force from the next batch: the switch to ask for, or ``None``."""
        if config == self._running:
            return None
        self._running = config
        self.switches += 1
        return config

    def _follow_up(self, trial: Trial) -> list:
        """What the trials so far suggest trying: a smaller configuration while the loop keeps up,
        then a deeper read-ahead while it waits."""
        ok = self._ok()
        if not ok or self._stage in (Stage.CONFIRM, Stage.RECHECK):
            return []
        best = max(ok, key=lambda t: t.rate)
        if self._stage is Stage.EXECUTORS:
            self._stage = Stage.SMALLER
            probe = next((t for t in ok if t.config.method == "main" and t.batches == 1), None)
            if probe is not None and probe.rate >= _MAIN * best.rate:   # this process alone may do
                self.trials.remove(probe)
                return [Config("main")]
            if best.waiting < KEEPS_UP and smaller(best.config) is not None:
                return [smaller(best.config)]
        elif self._stage is Stage.SMALLER and trial in ok and trial.waiting < KEEPS_UP \
                and trial.rate >= _SAME_RATE * best.rate and smaller(trial.config) is not None:
            return [smaller(trial.config)]
        if self._stage is not Stage.DEEPER:
            self._stage = Stage.DEEPER
            pool = [t for t in ok if t.config.workers]
            top = max(pool, key=lambda t: t.rate) if pool else None
            if top is not None and _WAITS <= top.waiting < _STARVED:
                return [dataclasses.replace(top.config, prefetch=2 * top.config.prefetch)]
        return []

    def _pick(self) -> tuple:
        """The best rate; among the rates within 5% of it, the least CPU per batch; the one
        running if it costs at most 25% more CPU (a switch drops the batches in flight)."""
        ok = self._ok()
        top = max(t.rate for t in ok)
        same = [t for t in ok if t.rate >= _SAME_RATE * top]
        pick = min(same, key=lambda t: t.cpu_per_batch)
        stay = next((t for t in same if t.config == self._running), None)
        if stay is not None and stay.cpu_per_batch <= 1.25 * pick.cpu_per_batch:
            pick = stay
        return pick, len(same), top

    def _settle(self) -> Optional[Config]:
        self._measuring, self._stage, self._watching = None, Stage.SETTLED, StepWatch()
        if not self._ok():
            self.chosen = floor(self.not_tried)
            self.reason = f"{self.chosen.label}: every other configuration exceeds memory_budget"
        else:
            pick, n_same, top = self._pick()
            bound = "consumer-bound" if pick.waiting < KEEPS_UP else "input-bound"
            self.chosen = pick.config
            self.reason = (f"{pick.config.label}: {pick.rate:.1f} batches/s ({bound}: the loop waits "
                           f"{pick.waiting:.0%} of its time), {pick.cpu_per_batch * 1e3:.1f} ms CPU per batch, the "
                           f"least of {n_same} within 5% of the best rate ({top:.1f}/s)")
            if pick.batches > 1 and pick.config not in self._confirmed:
                self._stage = Stage.CONFIRM   # measured again in place (after the switch's first round)
                self._begin(pick.config, switched=pick.config != self._running)
            else:
                self._watching = StepWatch(pick.work_s / max(1, pick.batches), pick.wait_s / max(1, pick.batches),
                                           memory=bool(pick.config.workers))
        self.reason = "; ".join([self.reason, *not_tried_words(self.not_tried)])
        return self._go(self.chosen)

    def _confirm(self, trial: Trial) -> Optional[Config]:
        """The winner measured again (``trial``): its numbers replace its first trial's; if it
        falls under 0.85 of the runner-up's rate, the runner-up is measured again, then the
        choice is made again."""
        self._confirmed.add(trial.config)
        self.trials = [trial if t.config == trial.config else t for t in self.trials]
        rivals = [t for t in self._ok() if t.config != trial.config and t.config not in self._confirmed
                  and t.batches > 1]
        runner = max(rivals, key=lambda t: t.rate, default=None)
        if runner is not None and trial.rate < _DISAGREE * runner.rate:
            self.trials.remove(runner)
            self._queue, self._stage = [runner.config], Stage.RECHECK
        return self._next_or_settle(trial)

    # -- settled --------------------------------------------------------------------------------

    def _watch(self, timing: BatchTiming, usage: Callable[..., Usage]) -> Optional[Config]:
        """Settled: search again when the loop's work per batch changed by more than 2x, or the
        memory held exceeds the budget."""
        if self._watching.memory_due(timing.now):
            held = usage().loader_bytes
            if held > self.memory_budget and self.chosen is not None:
                self.refused[self.chosen] = f"measured {held} bytes > memory_budget {self.memory_budget}"
                self.trials = []
                self._search(executors(self.max_workers, self._share))
                return self._next_or_settle(None)
        slower = self._watching.changed(timing.work_s)
        return None if slower is None else self._retune(slower)

    def _retune(self, slower: bool) -> Optional[Config]:
        """The loop's step changed: the configuration in force is measured again in place (no
        switch, no worker started); a slower loop then tries only cheaper configurations (it
        needs fewer batches per second), a faster one the executors again."""
        current = self._running
        self.trials, self.refused = [], {c: why for c, why in self.refused.items() if why.startswith("measured")}
        if slower:
            self._search(stage=Stage.SMALLER)
        else:   # (no probe: the first search's measured the batches' size and CPU share)
            self._search([c for c in executors(self.max_workers, self._share) if c != current])
        self._begin(current, switched=False)
        return None

    def report(self) -> dict:
        return {"policy": "tuner", "chosen": None if self.chosen is None else self.chosen.label,
                "reason": self.reason, "switches": self.switches,
                "trying": None if self._measuring is None else self._measuring.trial.config.label,
                "trials": [t.as_dict() for t in self.trials],
                "refused": {c.label: why for c, why in self.refused.items()}, "skipped": dict(self.skipped),
                "not_tried": dict(self.not_tried),
                "memory_budget": self.memory_budget}
