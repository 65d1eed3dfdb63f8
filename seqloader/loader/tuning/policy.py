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
   together), nor, over a block shuffle, the first cycle of its windows (:meth:`Tuner.set_period`:
   the new workers' refill, at most ``2 * trial_s`` more), then measures at least ``trial_s``
   seconds, 8 batches and two rounds, in whole rounds and whole cycles (as many window stalls
   per batch as the epoch has); it ends early when, after half its time, it is under 0.6 of the
   best rate so far;
2. ``num_workers=0`` gets a full trial if its first batch came at 0.7 of the best rate or more;
   if the loop was not waiting (``< 10%`` of its time in ``next()``: it is consumer-bound),
   halve its workers (then threads, then ``num_workers=0``) while it keeps up, and keep the
   cheapest in CPU per batch among those within 5% of the best rate;
3. if the loop still waits 20-50% of its time with the winner (fed, but not always: a deeper
   read-ahead can absorb the jitter; waiting more, the workers are the limit), one trial with
   twice the read-ahead;
4. the winner is measured again, in place, for ``4 * trial_s``: if it delivers under 0.85 of the
   runner-up's rate, its first trial was lucky (a loaded machine misjudges a short trial by up
   to 2x), and the runner-up is measured again before choosing; so it is if the winner delivers
   under 0.85 of its own first rate (lucky, or the machine's speed changed since the trials), but
   a runner-up under 0.6 of its new rate is not; each configuration is confirmed once;
5. settle, and stay there until the loop's own time per batch changes by more than 2x, or the
   memory the loader holds (measured every 5 s) exceeds ``memory_budget`` (then the winner is
   refused and the search goes on without it). A slower loop re-measures the configuration in
   force in place and tries only cheaper ones; a faster loop searches the executors again.

The step the search stands at is a :class:`~seqloader.loader.tuning.trials.Stage`, and the
trial being measured a :class:`~seqloader.loader.tuning.trials.Measuring`.

A configuration whose predicted memory exceeds the budget is never tried
(:class:`~seqloader.loader.tuning.budget.Budget`): a worker process is predicted at the size
measured for one in an earlier trial (before any, at ``worker_bytes``, the training process's own
size), and each batch in flight at the size of a delivered batch. Nor is
a kind of configuration ruled out by what the user asked for or the pipeline allows
(``needs_processes``: ``max_worker_restarts``; :meth:`Tuner.no_threads`, :meth:`Tuner.no_processes`):
each is reported, with its reason, under ``not_tried``, and the choice's reason says it.
:class:`~seqloader.loader.tuning.trials.Schedule` is the other policy: switches at fixed batch
counts, for tests. The configurations, measurements and trials are ``loader/tuning/trials.py``.
"""

from __future__ import annotations

from typing import Callable, Optional

from seqloader.loader.tuning.budget import Budget
from seqloader.loader.tuning.rules import (PROCESS_THREADS, THREADS_PER_WORKER, StepWatch, executors, floor,
                                             follow_up, keeps_up, not_tried_words, pick, pruned, ruled_out)
from seqloader.loader.tuning.trials import (LOSING, BatchTiming, Config, Measuring, Policy, Probe, Schedule, Stage,
                                             Trial, Usage)

__all__ = ["BatchTiming", "Config", "Policy", "Schedule", "Stage", "Trial", "Tuner", "Usage"]

__all__ += ["PROCESS_THREADS", "THREADS_PER_WORKER"]
_CONFIRM = 4         # the winner is measured again in place for this many trial lengths ...
_DISAGREE = 0.85     # ... and under this share of the runner-up's rate, the runner-up is measured again
_WARMUP = 2          # after a switch, the first cycle is not counted, for at most this many trial lengths


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
        self.max_workers, self.trial_s, self.cores = max_workers, trial_s, cores or max_workers
        self.period = 1   # the loader's cycle in batches (:meth:`set_period`)
        self.memory = Budget(memory_budget, worker_bytes)   # what each configuration will hold
        #: the kinds of configuration never tried (``rules.KINDS``), each with its reason
        self.not_tried: dict[str, str] = {}
        if needs_processes:
            healed = f"{needs_processes} (a crash in the training process or in a thread worker cannot be healed)"
            self.not_tried = {"num_workers=0": healed, "thread workers": healed,
                              "threads inside processes": f"{needs_processes}, and the check that the batches draw "
                              "nothing from the global generators (which threads share) computes a batch in the "
                              "training process"}
        self._probe = Probe()   # the first batch, computed here (its share of a core busy: compute or wait)
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
        self._confirmed: set = set()
        self.skipped: dict[str, str] = {}

    def _begin(self, config: Config, switched: bool) -> None:
        """A trial of ``config`` starts: after a switch its first round and cycle are not counted."""
        self._switched = switched
        warmup = max(config.rounds, self.period) if switched else 1
        self._measuring = Measuring(Trial(config), warmup, self.period,
                                    _WARMUP * self.trial_s if switched else float("inf"))

    def set_period(self, batches: int) -> None:
        """The loader's cycle is ``batches`` (a block shuffle's batches between two windows of a
        lane, :func:`~seqloader.loader.epoch.block_caches.window_batches`; 1 elsewhere): after a
        switch, a trial does not count the first cycle, and it counts whole cycles. A trial whose
        clock has not started takes it at once.

        Example:
            >>> t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0, needs_processes="restarts")
            >>> t.set_period(24); t.report()["trying"], t._measuring.warmup, t._measuring.unit
            ('2 processes, prefetch 2', 24, 24)
        """
        self.period = max(1, batches)
        m = self._measuring
        if m is not None and m.start is None:
            self._begin(m.trial.config, self._switched)
            again = self._measuring
            assert again is not None, "_begin sets the trial measured"
            again.seen, again.began = m.seen, m.began

    def _next_allowed(self) -> Optional[Config]:
        """The next queued configuration within the budget (refusing the others), or ``None``."""
        while self._queue:
            c = self._queue.pop(0)
            if c in self.refused or any(t.config == c for t in self.trials):
                continue
            why = ruled_out(c, self.not_tried) or self.memory.over(c)
            if why:
                self.refused[c] = why
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
        self.memory.saw(timing.nbytes)
        if self._stage is Stage.PROBE:   # the first batch, computed here: a one-batch trial of num_workers=0
            self._stage = Stage.EXECUTORS
            self.trials.append(self._probe.take(timing))
            self._queue = executors(self.max_workers, self._probe.share)
            return self._next_or_settle(None)
        self._probe.after(timing)   # the loop's work after the first batch
        measuring = self._measuring
        if measuring is None:
            return self._watch(timing, usage)
        if not measuring.count(timing, usage) or not self._ended(measuring):
            return None
        used = usage()
        trial = measuring.finish(used)
        why = self.memory.measured(used)
        if why:
            self.refused[trial.config] = why
        if self._stage is Stage.CONFIRM:
            return self._confirm(trial)
        self.trials.append(trial)
        return self._next_or_settle(trial)

    def _ended(self, m: Measuring) -> bool:
        """Whether the trial measured enough (:meth:`Measuring.ended`) over ``trial_s`` (a
        confirmation: 4x that), against the best rate of the others."""
        length = self.trial_s * (_CONFIRM if self._stage is Stage.CONFIRM else 1)
        return m.ended(length, max((t.rate for t in self._ok() if t.config != m.trial.config), default=0.0))

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
        """What the trials so far suggest trying (:func:`~seqloader.loader.tuning.rules.follow_up`)."""
        self._stage, queue, probe = follow_up(self._stage, trial, self._ok())
        if probe is not None:   # num_workers=0 gets a full trial instead
            self.trials.remove(probe)
        return queue

    def _settle(self) -> Optional[Config]:
        self._measuring, self._stage, self._watching = None, Stage.SETTLED, StepWatch()
        if not self._ok():
            self.chosen = floor(self.not_tried)
            self.reason = f"{self.chosen.label}: every other configuration exceeds memory_budget"
        else:
            won, n_same, top = pick(self._ok(), self._running)
            bound = "consumer-bound" if keeps_up(won.waiting) else "input-bound"
            self.chosen = won.config
            self.reason = (f"{won.config.label}: {won.rate:.1f} batches/s ({bound}: the loop waits "
                           f"{won.waiting:.0%} of its time), {won.cpu_per_batch * 1e3:.1f} ms CPU per batch, the "
                           f"least of {n_same} within 5% of the best rate ({top:.1f}/s)")
            if won.batches > 1 and won.config not in self._confirmed:
                self._stage = Stage.CONFIRM   # measured again in place (after the switch's first round)
                self._begin(won.config, switched=won.config != self._running)
            else:
                self._watching = StepWatch(won.work_s / max(1, won.batches), won.wait_s / max(1, won.batches),
                                           memory=bool(won.config.workers))
        self.reason = "; ".join([self.reason, *not_tried_words(self.not_tried)])
        return self._go(self.chosen)

    def _confirm(self, trial: Trial) -> Optional[Config]:
        """The winner measured again (``trial``): its numbers replace its first trial's; if it
        falls under 0.85 of the runner-up's rate, or of its own first rate (the first was lucky,
        or the machine's speed changed since the trials: the runner-up's, measured then, is no
        measure now; unless the runner-up is clearly losing, under 0.6 of the winner's new rate),
        the runner-up is measured again, then the choice is made again.

        Example:
            >>> t = Tuner(max_workers=2, memory_budget=2**40, worker_bytes=0)
            >>> t.trials = [Trial(Config("thread", 2), 150, 1.0), Trial(Config("process", 2), 300, 1.0)]
            >>> _ = t._confirm(Trial(Config("process", 2), 200, 1.0))   # 200/s: under 0.85 of its own 300/s
            >>> t.report()["trying"], t._stage.value
            ('2 threads, prefetch 2', 'recheck')
        """
        first = next((t for t in self.trials if t.config == trial.config), trial)
        self._confirmed.add(trial.config)
        self.trials = [trial if t.config == trial.config else t for t in self.trials]
        rivals = [t for t in self._ok() if t.config != trial.config and t.config not in self._confirmed
                  and t.batches > 1]
        runner = max(rivals, key=lambda t: t.rate, default=None)
        changed = trial.rate < _DISAGREE * first.rate and runner is not None and runner.rate >= LOSING * trial.rate
        if runner is not None and (trial.rate < _DISAGREE * runner.rate or changed):
            self.trials.remove(runner)
            self._queue, self._stage = [runner.config], Stage.RECHECK
        return self._next_or_settle(trial)

    # -- settled --------------------------------------------------------------------------------

    def _watch(self, timing: BatchTiming, usage: Callable[..., Usage]) -> Optional[Config]:
        """Settled: search again when the loop's work per batch changed by more than 2x, or the
        memory held exceeds the budget."""
        if self._watching.memory_due(timing.now):
            why = self.memory.held(usage().loader_bytes)
            if why and self.chosen is not None:
                self.refused[self.chosen] = why
                self.trials = []
                self._search(executors(self.max_workers, self._probe.share))
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
            self._search([c for c in executors(self.max_workers, self._probe.share) if c != current])
        self._begin(current, switched=False)
        return None

    def report(self) -> dict:
        return {"policy": "tuner", "chosen": None if self.chosen is None else self.chosen.label,
                "reason": self.reason, "switches": self.switches,
                "trying": None if self._measuring is None else self._measuring.trial.config.label,
                "trials": [t.as_dict() for t in self.trials],
                "refused": {c.label: why for c, why in self.refused.items()}, "skipped": dict(self.skipped),
                "not_tried": dict(self.not_tried),
                "memory_budget": self.memory.budget}
