"""L3: the vocabulary of ``autotune``: configurations, what is measured, trials, and the policy protocol.

A :class:`Config` is one way to compute an epoch's batches; a :class:`BatchTiming` is what the
loader measures per delivered batch and a :class:`Usage` what it measures at a trial's ends; a
:class:`Trial` is one configuration's numbers, :class:`Measuring` the one being measured (and
when it has measured enough), and :class:`Probe` the first batch's, computed in this process. A
policy (:class:`Policy`) turns them into the next configuration: the measuring
:class:`~seqloader.loader.tuning.policy.Tuner` (whose search stands at a :class:`Stage`), or
:class:`Schedule`, which switches at fixed batch counts (for tests).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Optional, Protocol

__all__ = ["BatchTiming", "Config", "Measuring", "Policy", "Probe", "Schedule", "Stage", "Trial", "Usage"]

LOSING = 0.6         # after half its time, a trial under this share of the best rate ends early
MIN_BATCHES = 8      # a trial measures at least this many batches after its first round


@dataclasses.dataclass(frozen=True)
class Config:
    """One way to compute the batches (see the module docstring).

    Example:
        >>> Config("process", workers=2, threads=4).label, Config("main").in_flight
        ('2 processes x 4 threads, prefetch 2', 0)
        >>> Config("threads", workers=2)
        Traceback (most recent call last):
        ValueError: autotune: Config.method must be 'main', 'thread' or 'process' (got 'threads')
    """

    method: str
    workers: int = 0
    threads: int = 1
    prefetch: int = 2

    def __post_init__(self) -> None:
        if self.method not in ("main", "thread", "process"):
            raise ValueError(f"autotune: Config.method must be 'main', 'thread' or 'process' (got {self.method!r})")
        if (self.method == "main") != (self.workers == 0) or self.threads < 1 or self.prefetch < 1:
            raise ValueError(f"autotune: inconsistent Config (got {self!r}); 'main' has 0 workers, the others "
                             ">= 1, threads and prefetch >= 1")
        if self.threads > 1 and self.method != "process":
            raise ValueError(f"autotune: threads > 1 needs method='process' (got {self!r})")

    @property
    def label(self) -> str:
        """The configuration in words (logs, ``stats()["autotune"]``)."""
        if self.method == "main":
            return "num_workers=0"
        kind = "threads" if self.method == "thread" else "processes"
        inside = f" x {self.threads} threads" if self.threads > 1 else ""
        return f"{self.workers} {kind}{inside}, prefetch {self.prefetch}"

    @property
    def rounds(self) -> int:
        """Batches its workers compute at once (each a whole batch): they are delivered in bursts."""
        return max(1, self.workers * self.threads)

    @property
    def in_flight(self) -> int:
        """Batches computed or held ahead of the loop at most."""
        return self.workers * self.threads * self.prefetch

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BatchTiming:
    """One delivered batch: when ``next()`` returned it (seconds, any clock), how long the loop
    waited inside ``next()``, how long it worked since the previous ``next()`` returned (``None``
    for the first of an iterator), the batch's bytes (tensors and arrays; 0 if not measured), and
    the CPU seconds the loop's thread spent inside ``next()`` (``None`` if not measured: it is,
    while the batches are computed in this process)."""

    now: float
    wait_s: float
    work_s: Optional[float]
    nbytes: int = 0
    cpu_s: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Usage:
    """What the loader used, measured by the caller: ``cpu_s`` (CPU seconds of this process and
    its worker processes, cumulative), ``loader_bytes`` (memory the loader holds now: its worker
    processes' and what this process grew since the loader began), ``worker_bytes`` (the largest
    worker process, 0 without any)."""

    cpu_s: float
    loader_bytes: int
    worker_bytes: int = 0


@dataclasses.dataclass
class Trial:
    """The numbers of one configuration's trial."""

    config: Config
    batches: int = 0
    wall_s: float = 0.0
    wait_s: float = 0.0
    work_s: float = 0.0
    cpu_s: float = 0.0
    memory_bytes: int = 0
    cut_short: bool = False

    @property
    def rate(self) -> float:
        """Batches per second delivered to the loop."""
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def waiting(self) -> float:
        """The fraction of the loop's time spent waiting in ``next()``."""
        total = self.wait_s + self.work_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def cpu_per_batch(self) -> float:
        return self.cpu_s / self.batches if self.batches else 0.0

    def as_dict(self) -> dict:
        return {"config": self.config.label, "batches": self.batches, "batches_per_s": round(self.rate, 3),
                "waiting": round(self.waiting, 3), "cpu_s_per_batch": round(self.cpu_per_batch, 6),
                "cores": round(self.cpu_s / self.wall_s, 3) if self.wall_s > 0 else 0.0,
                "memory_bytes": self.memory_bytes, "cut_short": self.cut_short}


class Stage(enum.Enum):
    """Where the :class:`~seqloader.loader.tuning.policy.Tuner`'s search stands (the steps of
    its module docstring). A trial is being measured in every stage but ``PROBE`` and
    ``SETTLED`` (there, the configuration in force is re-measured in place when the loop's step
    changes, and the search starts again at ``SMALLER`` or ``EXECUTORS``)."""

    PROBE = "probe"            # 0. the first batch, computed in this process
    EXECUTORS = "executors"    # 1. the executors' trials (and a search started again)
    SMALLER = "smaller"        # 2. num_workers=0, then smaller configurations while the loop keeps up
    DEEPER = "deeper"          # 3. twice the read-ahead
    CONFIRM = "confirm"        # 4. the winner measured again, in place, for 4 trial lengths
    RECHECK = "recheck"        # 4. the runner-up of a lucky winner measured again
    SETTLED = "settled"        # 5. watching the loop's step and the memory held


@dataclasses.dataclass
class Measuring:
    """The trial being measured: its first ``warmup`` batches (after a switch, its workers' first
    round and the first ``period``: their start-up, burst and refill) are seen but not counted,
    though no more than ``warmup_s`` seconds past the first round; its clock starts at ``start``,
    ``(time, cpu_s)``, when the last of them is delivered. ``period`` is the loader's cycle in
    batches (a block shuffle's batches between two windows of a lane, whose first batch waits
    for the window's decode; 1 elsewhere): a trial counts whole cycles, as many stalls as the
    epoch has per batch.

    Example:
        >>> m = Measuring(Trial(Config("thread", 2)), warmup=2)
        >>> use = lambda memory=True: Usage(cpu_s=5.0, loader_bytes=0)
        >>> [m.count(BatchTiming(t, 0.1, 0.0), use) for t in (1.0, 1.25, 1.5, 2.0)]
        [False, False, True, True]
        >>> m.trial.batches, m.trial.wall_s, m.finish(Usage(cpu_s=6.5, loader_bytes=7)).cpu_s
        (2, 0.75, 1.5)
        >>> m.ended(length=0.5, best=0.0), m.ended(length=1.0, best=10.0), m.trial.cut_short   # 2 < 8 batches; losing
        (False, True, True)
        >>> cycles = Measuring(Trial(Config("thread", 2)), warmup=6, period=6, warmup_s=1.0)
        >>> [cycles.count(BatchTiming(t, 0.0, 0.0), use) for t in (0.0, 0.5, 1.5, 2.0)]   # warm after 1 s
        [False, False, False, True]
        >>> now = 2.0
        >>> while not cycles.ended(length=1.0, best=0.0):   # a batch every 0.1 s
        ...     now += 0.1; _ = cycles.count(BatchTiming(now, 0.0, 0.0), use)
        >>> cycles.unit, cycles.trial.batches   # whole cycles of 6 batches, over 1 s from the clock's start
        (6, 12)
    """

    trial: Trial
    warmup: int = 1
    period: int = 1
    warmup_s: float = float("inf")
    seen: int = 0
    start: Optional[tuple] = None
    began: Optional[float] = None   # when its first batch was delivered

    @property
    def unit(self) -> int:
        """A trial counts whole units: the cycle rounded up to whole rounds (:attr:`Config.rounds`)."""
        rounds = self.trial.config.rounds
        return rounds * -(-max(1, self.period) // rounds)

    def count(self, timing: BatchTiming, usage: Callable[..., Usage]) -> bool:
        """A batch was delivered: whether it counts (the clock had started)."""
        self.seen += 1
        if self.start is None:   # start-up, the first round's burst and the refill are behind the clock's start
            if self.began is None:
                self.began = timing.now
            warm = self.seen >= self.trial.config.rounds and timing.now - self.began >= self.warmup_s
            if self.seen >= self.warmup or warm:
                self.start = (timing.now, usage(False).cpu_s)
            return False
        t = self.trial
        t.batches += 1
        t.wait_s += timing.wait_s
        t.work_s += timing.work_s or 0.0
        t.wall_s = timing.now - self.start[0]
        return True

    def ended(self, length: float, best: float) -> bool:
        """Whether the trial has measured enough: whole units (:attr:`unit`), at least two and 8
        batches, over ``length`` seconds; or, after half that time, it is clearly losing (under
        0.6 of ``best``, the best rate of the other trials: then it is ``cut_short``)."""
        t = self.trial
        unit = self.unit
        if t.wall_s >= 0.5 * length and t.batches >= t.config.rounds and t.rate < LOSING * best:
            t.cut_short = True
            return True
        return t.wall_s >= length and t.batches >= max(MIN_BATCHES, 2 * unit) and t.batches % unit == 0

    def finish(self, used: Usage) -> Trial:
        """The trial's numbers, with ``used`` measured at its end."""
        assert self.start is not None, "a trial finishes after its clock started"
        self.trial.cpu_s = used.cpu_s - self.start[1]
        self.trial.memory_bytes = used.loader_bytes
        return self.trial


class Probe:
    """The first batch, computed in this process: a one-batch trial of ``num_workers=0``
    (:meth:`take`), completed by the loop's work after it (:meth:`after`), and the share of a core
    it kept busy (``share``: whether the items compute or wait; ``None`` if not measured).

    Example:
        >>> p = Probe()
        >>> t = p.take(BatchTiming(now=1.0, wait_s=0.2, work_s=None, cpu_s=0.1))
        >>> p.after(BatchTiming(1.5, 0.1, work_s=0.3)); p.after(BatchTiming(2.0, 0.1, work_s=0.4))
        >>> p.share, t.wall_s, t.work_s
        (0.5, 0.5, 0.3)
    """

    def __init__(self) -> None:
        self.share: Optional[float] = None
        self._open: Optional[Trial] = None   # the trial, until the loop's work after it is known

    def take(self, timing: BatchTiming) -> Trial:
        """The first batch's trial (its CPU is its wait where the CPU was not measured)."""
        cpu = timing.wait_s if timing.cpu_s is None else timing.cpu_s
        self._open = Trial(Config("main"), batches=1, wall_s=timing.wait_s, wait_s=timing.wait_s, cpu_s=cpu)
        if timing.cpu_s is not None and timing.wait_s > 0:
            self.share = timing.cpu_s / timing.wait_s
        return self._open

    def after(self, timing: BatchTiming) -> None:
        """A later batch: the first loop's work known (not after an iterator's first batch) completes the trial."""
        trial = self._open
        if trial is not None and timing.work_s is not None:
            trial.work_s = timing.work_s
            trial.wall_s += timing.work_s
            self._open = None


class Policy(Protocol):
    """What the loader asks of a policy (:class:`Tuner`, :class:`Schedule`)."""

    def first(self) -> Config:
        """The configuration to start with."""

    def observe(self, timing: BatchTiming, usage: Callable[..., Usage]) -> Optional[Config]:
        """A batch was delivered: the configuration to switch to, or ``None``. ``usage()`` measures
        CPU and memory (milliseconds: call it at a trial's ends only), ``usage(False)`` the CPU
        alone (its ``loader_bytes`` and ``worker_bytes`` are 0)."""

    def report(self) -> dict:
        """``stats()["autotune"]``: JSON types."""


class Schedule:
    """A policy for tests: switch to ``configs[k]`` after ``every * (k + 1)`` delivered batches
    (counted across epochs), cycling through them.

    Example:
        >>> s = Schedule([Config("thread", 2), Config("main")], every=2)
        >>> t = BatchTiming(0.0, 0.0, None)
        >>> [s.observe(t, None) for _ in range(4)][1::2] == [Config("main"), Config("thread", 2)]
        True
    """

    def __init__(self, configs: list, every: int = 1):
        if not configs or every < 1:
            raise ValueError(f"Schedule: needs configs and every >= 1 (got {configs!r}, every={every!r})")
        self._configs, self._every, self._seen, self.switches = list(configs), every, 0, 0

    def first(self) -> Config:
        return self._configs[0]

    def observe(self, timing: BatchTiming, usage: Any) -> Optional[Config]:
        self._seen += 1
        if self._seen % self._every:
            return None
        self.switches += 1
        return self._configs[self.switches % len(self._configs)]

    def report(self) -> dict:
        return {"policy": "schedule", "switches": self.switches, "trials": [], "chosen": None, "reason": "a schedule"}
