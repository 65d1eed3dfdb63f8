"""L3: the advice of ``DataLoader.stats()["hint"]``: more workers (:func:`load_hint`), persistent
workers (:func:`startup_hint`), and which executor fits, measured before it is advised
(:func:`executor_hint`).

The workers report, per item, the wall seconds it took and the CPU seconds of the thread that
computed it. Wall time off the CPU is either a wait on I/O (threads overlap those) or a wait for a
core (nothing overlaps that: a busy machine). The two are told apart by the machine, measured when
the hint is made: the 1-minute load average against the cores this process may use
(``os.getloadavg``, ``os.sched_getaffinity``). The thresholds are autotune's, one number for each
notion (:mod:`~seqloader.loader.tuning.rules`: :func:`~seqloader.loader.tuning.rules.computes`,
:func:`~seqloader.loader.tuning.rules.saturated`, :func:`~seqloader.loader.tuning.rules.takes_turns`).
Threads are advised only for waits on a machine with
cores to spare, never for a dataset that holds an open file object (threads would share its
position: :func:`open_files`), and always with the one thing they change: draws from the global
generators are not reproducible under threads.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any, Optional

from seqloader.loader.tuning.rules import PROCESS_THREADS, computes, saturated, takes_turns, waits

__all__ = ["executor_hint", "load_hint", "machine_busy", "open_files", "startup_hint", "waiting"]

HINT_BATCHES = 10  # the hint speaks after this many batches of an epoch (fewer: start-up, the first burst)

#: The advice that goes with every recommendation of threads.
THREADS_CAVEAT = ("(threads share the global random, numpy.random and torch generators: items that draw from them "
                  "are no longer reproducible; draw from torch.thread_safe_generator() or seqloader.rng_map)")


def machine_busy(load: Optional[float] = None, cores: Optional[int] = None) -> Optional[tuple[float, int]]:
    """``(load, cores)`` when the machine has no core to spare (the 1-minute load average
    saturates the cores this process may use: :func:`~seqloader.loader.tuning.rules.saturated`),
    else ``None``; ``load``/``cores`` measured when not given.

    Example:
        >>> machine_busy(load=3.5, cores=2), machine_busy(load=0.4, cores=2)
        ((3.5, 2), None)
    """
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # pragma: no cover - no load average here
            return None
    return (load, cores) if saturated(load, cores) else None


def open_files(dataset: Any) -> list[str]:
    """The attributes of ``dataset`` (its ``__dict__``, one level) that hold an open file object
    (an ``io.IOBase``, or anything with ``fileno``, ``seek`` and ``read``): a position that threads
    reading one object would share.

    Example:
        >>> class D:
        ...     def __init__(self):
        ...         self.f, self.n = io.BytesIO(b"x"), 3
        >>> open_files(D()), open_files([1, 2])
        (['f'], [])
    """
    found = []
    for name, value in getattr(dataset, "__dict__", {}).items():
        if isinstance(value, io.IOBase):
            if not value.closed:
                found.append(name)
        elif all(callable(getattr(value, m, None)) for m in ("fileno", "seek", "read")):
            found.append(name)
    return found


def executor_hint(executor: str, num_workers: int, workers: list, wall: float, dataset: Any = None,
                  busy_machine: Optional[tuple[float, int]] = None) -> Optional[str]:
    """Threads or processes, from the workers' numbers (the caller checked that the loop waits):
    worker processes that wait (on the CPU under 30% of their busy time: not
    :func:`~seqloader.loader.tuning.rules.computes`) on a machine with cores to spare are advised
    threads; thread workers that take turns on the GIL
    (:func:`~seqloader.loader.tuning.rules.takes_turns`) are advised processes.

    Args:
        executor: ``"process"`` or ``"thread"``.
        num_workers: workers.
        workers: per worker ``{"busy_s", "cpu_s", ...}``.
        wall: the epoch's wall seconds so far.
        dataset: the loader's dataset, checked for open files (``None``: not checked).
        busy_machine: :func:`machine_busy`'s answer, measured by the caller.

    Returns:
        One clause, or ``None``.

    Example:
        >>> w = [{"busy_s": 10.0, "cpu_s": 1.0}] * 2
        >>> executor_hint("process", 2, w, 12.0, busy_machine=(3.0, 2)).split(":")[1]
        ' on the CPU 10% of their busy time, but the machine is busy (load 3.0 on 2 cores)'
        >>> "worker_method='thread'" in executor_hint("process", 2, w, 12.0)
        True
    """
    busy = sum(w["busy_s"] for w in workers)
    cpu = sum(w.get("cpu_s", 0.0) for w in workers)
    if busy <= 0:
        return None
    if executor == "process" and not computes(cpu, busy):
        on_cpu = f"workers: on the CPU {cpu / busy:.0%} of their busy time"
        if busy_machine is not None:
            load, cores = busy_machine
            return (f"{on_cpu}, but the machine is busy (load {load:.1f} on {cores} cores): they wait for a core "
                    "as much as on I/O, and neither threads nor more workers add one; keep the executor")
        files = open_files(dataset) if dataset is not None else []
        if files:
            return (f"{on_cpu} (they wait on I/O), but the dataset holds open file objects "
                    f"({', '.join(files)}) that threads would share: open them per thread (threading.local) "
                    f"before trying worker_method='thread' or threads_per_worker={PROCESS_THREADS}")
        return (f"{on_cpu} (they wait on I/O, with cores to spare): worker_method='thread', or "
                f"threads_per_worker={PROCESS_THREADS}, overlaps the waits for less memory {THREADS_CAVEAT}")
    if executor == "thread" and num_workers > 1 and takes_turns(cpu, busy, wall):
        return (f"workers: {num_workers} threads busy but {cpu / wall:.1f} core(s) of CPU between them "
                "(they take turns on the GIL: Python-heavy items): worker_method='multiprocessing'")
    return None


def waiting(epoch: Any) -> bool:
    """Whether the numbers of ``epoch`` (an :class:`~seqloader.loader.tuning.stats.EpochStats`)
    support a hint on the loop's waiting: 10 batches or more, waiting at least 20% of the time
    (:func:`~seqloader.loader.tuning.rules.waits`)."""
    return epoch.batches >= HINT_BATCHES and waits(epoch.input_bound)


def load_hint(epoch: Any, num_workers: int, cores: Optional[int]) -> Optional[str]:
    """More workers, when the loop waits (:func:`waiting`): at ``num_workers=0``, as many as the
    waiting over the work per batch suggests; with workers, only if every one is saturated (busy
    90% of the wall time) and cores are free.

    Example:
        >>> from seqloader.loader.tuning.stats import EpochStats
        >>> load_hint(EpochStats(0, batches=100, wait_s=6.0, work_s=4.0), 0, cores=8)
        'input-bound: 60% of wall time waiting for data with num_workers=0; try num_workers=2'
        >>> load_hint(EpochStats(0, batches=9, wait_s=6.0, work_s=4.0), 0, cores=8) is None   # too few batches
        True
    """
    if not waiting(epoch):
        return None
    bound = epoch.input_bound
    if num_workers == 0:
        if cores is not None and cores < 2:
            return (f"input-bound: {bound:.0%} of wall time waiting for data with "
                    "num_workers=0 and one core: make the items cheaper")
        want = max(1, math.ceil(epoch.wait_s / epoch.work_s)) if epoch.work_s > 0 else 8
        want = min(want, cores if cores is not None else 8)
        return f"input-bound: {bound:.0%} of wall time waiting for data with num_workers=0; try num_workers={want}"
    if not epoch.workers or not saturated(min(w["busy_s"] for w in epoch.workers), epoch.wait_s + epoch.work_s):
        return None
    if cores is not None and num_workers >= cores:
        return (f"input-bound: {bound:.0%} of wall time waiting for data and all "
                f"{num_workers} workers busy, with no idle core left: make the items cheaper")
    want = int(num_workers / max(1e-9, 1 - bound) + 0.999)
    want = want if cores is None else min(want, cores)
    return f"input-bound: {bound:.0%} of wall time waiting for data and all {num_workers} workers busy; try " \
           f"num_workers={want}"


def startup_hint(epoch: Any, num_workers: int, persistent: bool) -> Optional[str]:
    """Persistent workers, when starting them in ``iter()`` took 20% of the epoch or more."""
    wall = epoch.startup_s + epoch.wait_s + epoch.work_s
    if num_workers == 0 or persistent or epoch.batches == 0 or not waits(epoch.startup_s, wall):
        return None
    return (f"start-up: iter() took {epoch.startup_s:.2f} s of the epoch's {wall:.2f} s starting "
            "workers; persistent_workers=True starts them once")
