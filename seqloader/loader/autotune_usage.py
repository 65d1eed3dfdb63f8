"""L3: what the loader uses, from ``/proc``: CPU seconds and memory of this process and its workers.

``autotune`` measures a configuration's cost as it runs (psutil is not a dependency): the CPU
seconds of this process (every thread: :func:`time.process_time`) and of its live descendant
processes (``/proc/<pid>/stat``, ``utime + stime``), and the proportional set size (PSS,
``/proc/<pid>/smaps_rollup``) of each. PSS divides a page shared by ``n`` processes by ``n``, so the
sum over the tree counts memory once: a forked worker's untouched copy of the training process
costs (almost) nothing, as it should. Linux only: elsewhere :func:`check_proc` raises.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from seqloader.loader.autotune_policy import Usage

__all__ = ["ProcessTree", "available_memory", "check_proc", "default_memory_budget"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def check_proc(stage: str = "DataLoader") -> None:
    """Raise ``ValueError`` when ``/proc`` cannot be read (not Linux): autotune measures through it.

    Example:
        >>> check_proc()
    """
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        raise ValueError(f"{stage}: autotune=True measures CPU and memory through /proc/<pid>/stat and "
                         "smaps_rollup, which this system does not have (Linux >= 4.14 does); set the workers "
                         "by hand (num_workers, worker_method, threads_per_worker)")


def available_memory() -> int:
    """``MemAvailable`` of ``/proc/meminfo``, in bytes.

    Example:
        >>> available_memory() > 0
        True
    """
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise ValueError("DataLoader: /proc/meminfo has no MemAvailable line; pass memory_budget= in bytes")


def default_memory_budget() -> int:
    """``autotune``'s default ``memory_budget``: half the memory available when the loader is built.

    Example:
        >>> default_memory_budget() == available_memory() // 2 or True
        True
    """
    return available_memory() // 2


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):  # it exited meanwhile
        return 0
    return 0


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK   # utime, stime (fields 14, 15 of stat)


def _children(pid: int) -> Optional[list[int]]:
    """The children of ``pid`` from ``/proc/<pid>/task/<tid>/children`` (each of its threads may
    have started some); ``None`` where the kernel lacks that file (``CONFIG_PROC_CHILDREN``)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except (ProcessLookupError, PermissionError):   # the thread or process exited meanwhile
            continue
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue
            return None
    return kids


def _descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (a forkserver's workers are grandchildren): the children files
    of its threads, walked down (about 0.1 ms), or one scan of ``/proc`` where the kernel has no
    children files (milliseconds on a machine of a few hundred processes)."""
    found, frontier = [], [root]
    while frontier:
        kids = _children(frontier.pop())
        if kids is None:
            return _scanned(root)
        found += kids
        frontier += kids
    return found


def _scanned(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return found


class ProcessTree:
    """This process and its descendants, measured; :meth:`usage` is what the loader holds since
    the tree was first measured.

    Example:
        >>> tree = ProcessTree()
        >>> u = tree.usage()
        >>> u.cpu_s > 0, u.loader_bytes >= 0, u.worker_bytes >= 0   # (a test run may have other children)
        (True, True, True)
    """

    def __init__(self) -> None:
        check_proc()
        self._pid = os.getpid()
        self.baseline = _pss(self._pid)
        self.peak_bytes = 0

    def own_bytes(self) -> int:
        """This process's PSS now."""
        return _pss(self._pid)

    def usage(self, memory: bool = True) -> Usage:
        """CPU seconds of the tree (cheap: ``/proc/<pid>/stat``) and, with ``memory``, what it
        holds (``smaps_rollup``: milliseconds per process, so not at every measure)."""
        kids = _descendants(self._pid)
        cpu = time.process_time() + sum(_cpu(k) for k in kids)
        if not memory:
            return Usage(cpu_s=cpu, loader_bytes=0)
        sizes = [_pss(k) for k in kids]
        held = max(0, self.own_bytes() + sum(sizes) - self.baseline)
        self.peak_bytes = max(self.peak_bytes, held)
        return Usage(cpu_s=cpu, loader_bytes=held, worker_bytes=max(sizes, default=0))
