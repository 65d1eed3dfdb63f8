"""L3: which executor fits, measured before it is advised (``DataLoader.stats()["hint"]``).

The workers report, per item, the wall seconds it took and the CPU seconds of the thread that
computed it. Wall time off the CPU is either a wait on I/O (threads overlap those) or a wait for a
core (nothing overlaps that: a busy machine). The two are told apart by the machine, measured when
the hint is made: the 1-minute load average against the cores this process may use
(``os.getloadavg``, ``os.sched_getaffinity``). Threads are advised only for waits on a machine with
cores to spare, never for a dataset that holds an open file object (threads would share its
position: :func:`open_files`), and always with the one thing they change: draws from the global
generators are not reproducible under threads.
"""

from __future__ import annotations

import io
import os
from typing import Any, Optional

__all__ = ["executor_hint", "machine_busy", "open_files"]

#: The advice that goes with every recommendation of threads.
THREADS_CAVEAT = ("(threads share the global random, numpy.random and torch generators: items that draw from them "
                  "are no longer reproducible; draw from torch.thread_safe_generator() or seqloader.rng_map)")


def machine_busy(load: Optional[float] = None, cores: Optional[int] = None) -> Optional[tuple[float, int]]:
    """``(load, cores)`` when the machine has no core to spare (the 1-minute load average at least
    the cores this process may use), else ``None``; ``load``/``cores`` measured when not given.

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
    return (load, cores) if load >= 0.9 * cores else None


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
    """Threads or processes, from the workers' numbers (the caller checked that the loop waits).

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
    if executor == "process" and cpu < 0.5 * busy:
        on_cpu = f"workers: on the CPU {cpu / busy:.0%} of their busy time"
        if busy_machine is not None:
            load, cores = busy_machine
            return (f"{on_cpu}, but the machine is busy (load {load:.1f} on {cores} cores): they wait for a core "
                    "as much as on I/O, and neither threads nor more workers add one; keep the executor")
        files = open_files(dataset) if dataset is not None else []
        if files:
            return (f"{on_cpu} (they wait on I/O), but the dataset holds open file objects "
                    f"({', '.join(files)}) that threads would share: open them per thread (threading.local) "
                    "before trying worker_method='thread' or threads_per_worker=4")
        return (f"{on_cpu} (they wait on I/O, with cores to spare): worker_method='thread', or "
                f"threads_per_worker=4, overlaps the waits for less memory {THREADS_CAVEAT}")
    if executor == "thread" and num_workers > 1 and cpu >= 0.7 * wall and busy >= 1.5 * wall:
        return (f"workers: {num_workers} threads busy but {cpu / wall:.1f} core(s) of CPU between them "
                "(they take turns on the GIL: Python-heavy items): worker_method='multiprocessing'")
    return None
