"""L3, pure: the rules of "which configuration fits", each a function of measured numbers.

One rule set for the two that ask: ``stats()["hint"]`` (:mod:`~seqloader.loader.tuning.hint`,
from an epoch's numbers) and ``autotune``'s search (:class:`~seqloader.loader.tuning.policy.Tuner`,
from its trials). Each notion is one named number and one predicate that both call: the loop
keeps up (:func:`keeps_up`), waits enough to act on (:func:`waits`) or is starved
(:func:`starved`); the items compute or wait (:func:`computes`); a resource is saturated
(:func:`saturated`); threads take turns on the GIL (:func:`takes_turns`). The search's own rules
follow, one function each, so that each is tested by feeding it numbers: the first trials from
the first batch's CPU share (:func:`executors`), the trials a finished one rules out
(:func:`pruned`), the next cheaper configuration (:func:`smaller`), and when a settled search
starts again (:class:`StepWatch`). Beside the measurements, what the user asked for or the
pipeline allows rules out whole kinds of configuration, each with its reason in words
(:func:`ruled_out`, :func:`floor`): a tuner never trades away a promise.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from seqloader.loader.tuning.trials import Config, Stage, Trial

__all__ = ["KINDS", "PROCESS_THREADS", "THREADS_PER_WORKER", "StepWatch", "computes", "executors", "floor",
           "follow_up", "keeps_up", "kinds", "not_tried_words", "pick", "pruned", "ruled_out", "saturated", "smaller",
           "starved", "takes_turns", "waits"]

#: thread workers per allowed worker, and threads inside each worker process, at most
THREADS_PER_WORKER = 8
PROCESS_THREADS = 4
# -- what the numbers mean: the hint and the tuner read them through the predicates below
KEEPS_UP = 0.10      # the loop waits less than this share of its time: the loader keeps up (consumer-bound)
WAITS = 0.20         # a share of the loop's time worth acting on: waiting for data, starting workers, pinning
STARVED = 0.50       # the loop waits this much: the workers are the limit, a deeper read-ahead cannot help
CPU_BOUND = 0.3      # on the CPU under this share of their time, the items wait (latency) rather than compute
SATURATED = 0.9      # in use at this share of what there is (cores, wall time, a machine's cores): none to add
GIL_CORE = 0.7       # threads keeping this much of a core busy between them ...
GIL_THREADS = 1.5    # ... while this many are busy at a time: they take turns on the GIL
# -- the search's own
MAIN = 0.7           # num_workers=0 gets a full trial if its first batch came at this share of the best rate
SAME_RATE = 0.95     # rates within 5% of the best are equal (then the least CPU per batch wins) ...
STAY = 1.25          # ... or the one running, if it costs at most this much more CPU (a switch drops batches)
LATENCY = 0.7        # threads within this of processes' rate: threads inside processes are tried
RETUNE = 2.0         # the loop's work per batch changed by more than this factor: search again
WINDOW = 32          # the loop's step is the median of its last 32 (a preempted step is no change) ...
EVERY = 8            # ... looked at every 8 batches
STEP_FLOOR = 1e-3    # steps shorter than 1 ms count as 1 ms (their jitter is no change of the loop)
MEMORY_EVERY = 5.0   # settled, the memory held is measured every 5 s (a measure costs milliseconds)
#: the kinds of configuration a promise or a check rules out (``stats()["autotune"]["not_tried"]``)
KINDS = ("num_workers=0", "thread workers", "processes", "threads inside processes")


def keeps_up(waiting: float) -> bool:
    """The loop waits under 10% of its time (``waiting``): the loader keeps up, nothing is faster.

    Example (each predicate on either side of its number):
        >>> keeps_up(0.05), keeps_up(0.1), waits(0.2), waits(0.5, whole=10.0), starved(0.3), starved(0.5)
        (True, False, True, False, False, True)
        >>> computes(0.9), computes(2.0, busy_s=18.0), saturated(1.9, 2), saturated(3.0, 8)
        (True, False, True, False)
        >>> takes_turns(cpu_s=9.5, busy_s=19.0, wall_s=10.0), takes_turns(1.0, 19.0, 10.0)
        (True, False)
    """
    return waiting < KEEPS_UP


def waits(part: float, whole: float = 1.0) -> bool:
    """``part`` of the loop's time ``whole`` (waiting for data, starting workers, pinning) is at
    least 20% of it: worth acting on (the hint speaks; the tuner tries a deeper read-ahead)."""
    return part >= WAITS * whole


def starved(waiting: float) -> bool:
    """The loop waits at least half its time: the workers are the limit (a deeper read-ahead cannot help)."""
    return waiting >= STARVED


def computes(cpu_s: float, busy_s: float = 1.0) -> bool:
    """The items kept a core busy at least 30% of the time they took (``cpu_s`` of ``busy_s``):
    they compute; under it, they wait (I/O, a remote read's latency), which threads overlap."""
    return cpu_s >= CPU_BOUND * busy_s


def saturated(used: float, capacity: float) -> bool:
    """``used`` is at least 90% of ``capacity`` (cores busy of the cores, a worker's busy time of
    the wall time, a machine's load of its cores): nothing is left to add."""
    return used >= SATURATED * capacity


def takes_turns(cpu_s: float, busy_s: float, wall_s: float) -> bool:
    """Thread workers busy 1.5 at a time or more (``busy_s`` over ``wall_s``), keeping 0.7 of a
    core or more busy between them (``cpu_s``): Python-heavy items taking turns on the GIL."""
    return cpu_s >= GIL_CORE * wall_s and busy_s >= GIL_THREADS * wall_s


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
    first = Config("thread", w) if share is not None and computes(share) else \
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
      not 95% of it (the items wait as well as compute, and the GIL holds threads back; within
      5%, the rates are the same, as :func:`pick` has them).

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
    if c.workers and keeps_up(trial.waiting):
        return [], list(queue), f"the loop kept up with {c.label} (it waited {trial.waiting:.0%}): only cheaper " \
                                "configurations are tried"
    many = Config("thread", THREADS_PER_WORKER * max_workers)
    if c == many and not computes(cores_busy):
        return [], [q for q in queue if q.method == "process"], \
            f"threads used {cores_busy:.2f} cores (< {CPU_BOUND}): the items wait, they do not compute"
    added = [Config("thread", max_workers)] if c == many and max_workers < many.workers else []
    if c.method == "thread" and saturated(cores_busy, cores):
        return added, [q for q in queue if q.method == "process"], \
            f"threads kept {cores_busy:.2f} of {cores} cores busy: processes add no core"
    if c.method == "process" and c.threads == 1:
        threads = max((t.rate for t in trials if t.config.method == "thread"), default=0.0)
        inside = [q for q in queue if q.method == "process" and q.threads > 1]
        if threads < LATENCY * trial.rate:
            return added, inside, "threads were well behind processes (or not tried): the items compute, they " \
                                  "do not wait"
        if threads >= SAME_RATE * trial.rate:
            return added, inside, "threads were as fast as processes: the GIL is not what limits them"
    return added, [], ""


def follow_up(stage: Stage, trial: Trial, ok: list) -> tuple[Stage, list, Optional[Trial]]:
    """What the trials so far (``ok``: those not refused) suggest once the queue of ``stage`` is
    empty after ``trial``: ``(the next stage, configurations to try, the probe whose full trial
    replaces it)``. After the executors, ``num_workers=0`` gets a full trial if its probe came at
    0.7 of the best rate, else a smaller configuration is tried while the loop keeps up (and
    while the smaller one stays within 5% of the best rate); then a deeper read-ahead while the
    loop waits 20-50% of its time with the best (waiting more, the workers are the limit).

    Example:
        >>> probe = Trial(Config("main"), batches=1, wall_s=0.1, wait_s=0.1)
        >>> fed = Trial(Config("thread", 4), batches=100, wall_s=1.0, wait_s=0.05, work_s=0.95)
        >>> stage, queue, drop = follow_up(Stage.EXECUTORS, fed, [probe, fed])
        >>> stage, [c.label for c in queue], drop
        (<Stage.SMALLER: 'smaller'>, ['2 threads, prefetch 2'], None)
        >>> waiting = Trial(Config("process", 2), batches=100, wall_s=1.0, wait_s=0.3, work_s=0.7)
        >>> stage, queue, _ = follow_up(Stage.SMALLER, waiting, [waiting])
        >>> stage, [c.label for c in queue]
        (<Stage.DEEPER: 'deeper'>, ['2 processes, prefetch 4'])
    """
    if not ok or stage in (Stage.CONFIRM, Stage.RECHECK):
        return stage, [], None
    best = max(ok, key=lambda t: t.rate)
    if stage is Stage.EXECUTORS:
        stage = Stage.SMALLER
        probe = next((t for t in ok if t.config.method == "main" and t.batches == 1), None)
        if probe is not None and probe.rate >= MAIN * best.rate:   # this process alone may do
            return stage, [Config("main")], probe
        if keeps_up(best.waiting) and smaller(best.config) is not None:
            return stage, [smaller(best.config)], None
    elif stage is Stage.SMALLER and trial in ok and keeps_up(trial.waiting) \
            and trial.rate >= SAME_RATE * best.rate and smaller(trial.config) is not None:
        return stage, [smaller(trial.config)], None
    if stage is not Stage.DEEPER:
        stage = Stage.DEEPER
        pool = [t for t in ok if t.config.workers]
        top = max(pool, key=lambda t: t.rate) if pool else None
        if top is not None and waits(top.waiting) and not starved(top.waiting):
            return stage, [dataclasses.replace(top.config, prefetch=2 * top.config.prefetch)], None
    return stage, [], None


def pick(trials: list, running: Config) -> tuple[Trial, int, float]:
    """The trial to choose among ``trials``: the best rate; among the rates within 5% of it, the
    least CPU per batch; the one ``running`` if it costs at most 25% more CPU (a switch drops the
    batches in flight). Returns ``(pick, how many were within 5%, the best rate)``.

    Example:
        >>> fast = Trial(Config("process", 2), batches=100, wall_s=1.0, cpu_s=2.0)
        >>> cheap = Trial(Config("thread", 2), batches=96, wall_s=1.0, cpu_s=1.0)
        >>> pick([fast, cheap], running=Config("main"))[0].config.label, pick([fast, cheap], Config("main"))[1:]
        ('2 threads, prefetch 2', (2, 100.0))
    """
    top = max(t.rate for t in trials)
    same = [t for t in trials if t.rate >= SAME_RATE * top]
    best = min(same, key=lambda t: t.cpu_per_batch)
    stay = next((t for t in same if t.config == running), None)
    if stay is not None and stay.cpu_per_batch <= STAY * best.cpu_per_batch:
        best = stay
    return best, len(same), top


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
