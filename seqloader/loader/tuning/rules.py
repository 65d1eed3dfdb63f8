"""L3, pure: the rules of ``autotune``'s search, each a function of the trials' numbers.

:class:`~seqloader.loader.tuning.policy.Tuner` runs the search; the rules that decide which
configurations are worth a trial live here, one function each, so that each is tested by
feeding it numbers: the first trials from the first batch's CPU share (:func:`executors`), the
trials a finished one rules out (:func:`pruned`), the next cheaper configuration
(:func:`smaller`), and when a settled search starts again (:class:`StepWatch`). Beside the
measurements, what the user asked for or the pipeline allows rules out whole kinds of
configuration, each with its reason in words (:func:`ruled_out`, :func:`floor`): a tuner never
trades away a promise.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from seqloader.loader.tuning.trials import Config, Trial

__all__ = ["KINDS", "PROCESS_THREADS", "THREADS_PER_WORKER", "StepWatch", "executors", "floor", "kinds", "pruned",
           "not_tried_words", "ruled_out", "smaller"]

#: thread workers per allowed worker, and threads inside each worker process, at most
THREADS_PER_WORKER = 8
PROCESS_THREADS = 4
KEEPS_UP = 0.10      # the loop waits less than this fraction of its time: consumer-bound
CPU_BOUND = 0.3      # under this share of a core busy, the items wait (latency) rather than compute
SATURATED = 0.9      # threads keeping this share of the cores busy leave no core for processes to add
LATENCY = 0.7        # threads within this of processes' rate: threads inside processes are tried
RETUNE = 2.0         # the loop's work per batch changed by more than this factor: search again
WINDOW = 32          # the loop's step is the median of its last 32 (a preempted step is no change) ...
EVERY = 8            # ... looked at every 8 batches
STEP_FLOOR = 1e-3    # steps shorter than 1 ms count as 1 ms (their jitter is no change of the loop)
MEMORY_EVERY = 5.0   # settled, the memory held is measured every 5 s (a measure costs milliseconds)
#: the kinds of configuration a promise or a check rules out (``stats()["autotune"]["not_tried"]``)
KINDS = ("num_workers=0", "thread workers", "processes", "threads inside processes")


def kinds(c: Config) -> tuple:
    """What ``c`` runs on, in the words of :data:`KINDS`.

    Example:
        >>> kinds(Config("main")), kinds(Config("thread", 2)), kinds(Config("process", 2, 4))
        (('num_workers=0',), ('thread workers',), ('processes', 'threads inside processes'))
    """
    if c.method == "main":
        return ("num_workers=0",)
    if c.method == "thread":
        return ("thread workers",)
    return ("processes", "threads inside processes") if c.threads > 1 else ("processes",)


def ruled_out(c: Config, not_tried: dict) -> Optional[str]:
    """Why ``c`` may not be tried, from ``not_tried`` (kind: why), or ``None``.

    Example:
        >>> no = {"threads inside processes": "the batches draw from the global generators"}
        >>> ruled_out(Config("process", 2, 4), no), ruled_out(Config("process", 2), no)
        ('threads inside processes not tried: the batches draw from the global generators', None)
    """
    return next((f"{k} not tried: {not_tried[k]}" for k in kinds(c) if k in not_tried), None)


def not_tried_words(not_tried: dict) -> list:
    """``not_tried`` (kind: why) in sentences, the kinds of one reason together.

    Example:
        >>> not_tried_words({"thread workers": "they draw", "threads inside processes": "they draw"})
        ['thread workers and threads inside processes not tried: they draw']
    """
    by_why: dict = {}
    for k, why in not_tried.items():
        by_why.setdefault(why, []).append(k)
    return [f"{' and '.join(ks)} not tried: {why}" for why, ks in by_why.items()]


def floor(not_tried: dict) -> Config:
    """The configuration kept when nothing else fits: ``num_workers=0``, or one worker process
    where ``num_workers=0`` is ruled out (``max_worker_restarts`` needs worker processes).

    Example:
        >>> floor({}).label, floor({"num_workers=0": "max_worker_restarts=1 needs worker processes"}).label
        ('num_workers=0', '1 processes, prefetch 2')
    """
    return Config("process", 1) if "num_workers=0" in not_tried else Config("main")


def executors(max_workers: int, share: Optional[float]) -> list:
    """The executors' trials, in order, from the share of a core the first batch kept busy while it
    was computed in this process (``None``: not measured).

    Items that wait (``share < 0.3``: a remote read) start with the most thread workers; items
    that compute start with as many threads as workers (fewer turns on the GIL, no process to
    start); processes, then processes of threads, follow unless a trial rules them out
    (:func:`pruned`).

    Example:
        >>> [c.label for c in executors(2, 0.05)][:1]
        ['16 threads, prefetch 2']
        >>> [c.label for c in executors(2, 0.9)]
        ['2 threads, prefetch 2', '2 processes, prefetch 2', '2 processes x 4 threads, prefetch 2']
    """
    w = max_workers
    first = Config("thread", w) if share is not None and share >= CPU_BOUND else \
        Config("thread", THREADS_PER_WORKER * w)
    return [first, Config("process", w), Config("process", w, PROCESS_THREADS)]


def pruned(trial: Trial, queue: list, trials: list, max_workers: int, cores: int) -> tuple[list, list, str]:
    """What ``trial`` (just measured) shows about the queued trials ``queue``: ``(added, dropped,
    why)``. The rules, in order:

    * the loop did not wait (consumer-bound): nothing is faster than the loop, so no other
      executor is tried (only cheaper ones follow, see :func:`smaller`);
    * the most thread workers kept under 0.3 of a core busy: the items wait, they do not
      compute, and processes only add cores: processes are not tried; at least 0.3, they compute,
      and as many threads as workers are tried first (fewer turns on the GIL);
    * thread workers kept 90% of the cores busy: the GIL is released and the cores are used;
      processes add none: they are not tried;
    * processes: threads inside them are tried only if threads reached 70% of their rate but
      not all of it (the items wait as well as compute, and the GIL holds threads back).

    Example:
        >>> t = Trial(Config("thread", 2), batches=20, wall_s=1.0, wait_s=0.9, work_s=0.1, cpu_s=1.9)
        >>> added, dropped, why = pruned(t, [Config("process", 2)], [t], max_workers=2, cores=2)
        >>> added, [c.label for c in dropped]
        ([], ['2 processes, prefetch 2'])
        >>> why
        'threads kept 1.90 of 2 cores busy: processes add no core'
        >>> fed = Trial(Config("thread", 2), batches=20, wall_s=1.0, wait_s=0.01, work_s=0.99, cpu_s=0.4)
        >>> pruned(fed, [Config("process", 2)], [fed], 2, 2)[2]   # the loop never waited
        'the loop kept up with 2 threads, prefetch 2 (it waited 1%): only cheaper configurations are tried'
    """
    cores_busy = trial.cpu_s / trial.wall_s if trial.wall_s > 0 else 0.0
    c = trial.config
    if c.workers and trial.waiting < KEEPS_UP:
        return [], list(queue), f"the loop kept up with {c.label} (it waited {trial.waiting:.0%}): only cheaper " \
                                "configurations are tried"
    many = Config("thread", THREADS_PER_WORKER * max_workers)
    if c == many and cores_busy < CPU_BOUND:
        return [], [q for q in queue if q.method == "process"], \
            f"threads used {cores_busy:.2f} cores (< {CPU_BOUND}): the items wait, they do not compute"
    added = [Config("thread", max_workers)] if c == many and max_workers < many.workers else []
    if c.method == "thread" and cores_busy >= SATURATED * cores:
        return added, [q for q in queue if q.method == "process"], \
            f"threads kept {cores_busy:.2f} of {cores} cores busy: processes add no core"
    if c.method == "process" and c.threads == 1:
        threads = max((t.rate for t in trials if t.config.method == "thread"), default=0.0)
        inside = [q for q in queue if q.method == "process" and q.threads > 1]
        if threads < LATENCY * trial.rate:
            return added, inside, "threads were well behind processes (or not tried): the items compute, they " \
                                  "do not wait"
        if threads >= trial.rate:
            return added, inside, "threads were as fast as processes: the GIL is not what limits them"
    return added, [], ""


def smaller(c: Config) -> Optional[Config]:
    """The next cheaper configuration than ``c``: fewer threads inside, then fewer workers, then none.

    Example:
        >>> [smaller(c).label for c in (Config("process", 2, 4), Config("thread", 2), Config("thread", 1))]
        ['2 processes x 2 threads, prefetch 2', '1 threads, prefetch 2', 'num_workers=0']
        >>> smaller(Config("main")) is None
        True
    """
    if c.method == "process" and c.threads > 1:
        return dataclasses.replace(c, threads=c.threads // 2)
    if c.workers > 1:
        return dataclasses.replace(c, workers=c.workers // 2)
    if c.workers == 1:
        return Config("main")
    return None


class StepWatch:
    """Settled: whether the loop's step changed by more than 2x, and when the memory is due.

    The step is the median of the last 32 (a preempted step is no change), looked at every 8
    batches, against ``step`` at settling. Steps shorter than half the loop's ``wait`` at
    settling (or 1 ms) count as that: while the loop waits, a shorter step changes nothing. The
    memory held is due every 5 s with ``memory`` (worker processes), never without.

    Example:
        >>> w = StepWatch(step=0.001, wait=0.009)
        >>> [w.changed(0.002) for _ in range(40)][-1], [w.changed(0.030) for _ in range(40)][-1]
        (None, True)
        >>> StepWatch(0.001, 0.0).changed(None) is None   # the first batch of an iterator
        True
    """

    def __init__(self, step: float = 0.0, wait: float = 0.0, memory: bool = False):
        self.step, self.floor, self.memory = step, max(STEP_FLOOR, 0.5 * wait), memory
        self._work: list[float] = []
        self._seen = 0
        self._memory_at: Optional[float] = None

    def memory_due(self, now: float) -> bool:
        """Whether the memory held is to be measured now (every 5 s)."""
        if not self.memory:
            return False
        if self._memory_at is None or now - self._memory_at < MEMORY_EVERY:
            self._memory_at = now if self._memory_at is None else self._memory_at
            return False
        self._memory_at = now
        return True

    def changed(self, work_s: Optional[float]) -> Optional[bool]:
        """The loop worked ``work_s`` before this batch: ``True`` (slower by more than 2x),
        ``False`` (faster), or ``None`` (no change)."""
        self._seen += 1
        if work_s is None:
            return None
        work = self._work
        work.append(work_s)
        if len(work) < WINDOW or self._seen % EVERY:
            return None
        del work[:-WINDOW]
        recent = max(sorted(work)[WINDOW // 2], self.floor)
        base = max(self.step, self.floor)
        if base / RETUNE <= recent <= RETUNE * base:
            return None
        return recent > base
