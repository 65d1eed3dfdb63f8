"""L3: what the loader uses, from ``/proc``: CPU seconds and memory of this process and its workers.

``autotune`` measures a configuration's cost as it runs (psutil is not a dependency): the CPU
seconds of this process (every thread: :func:`time.process_time`) and of its loader's worker
processes (the pids its executor reports; ``/proc/<pid>/stat``, ``utime + stime``), and the
proportional set size (PSS, ``/proc/<pid>/smaps_rollup``) of each. PSS divides a page shared by
``n`` processes by ``n``, so the sum over the tree counts memory once: a forked worker's untouched
copy of the training process costs (almost) nothing, as it should. Other children of this process
(another loader's workers) are not counted. Linux only: elsewhere :func:`check_proc` raises.

Beside them, two inputs of the measures the loader supplies: which worker processes are its own
(:func:`worker_pids`) and the bytes of a delivered batch (:func:`batch_bytes`, which predicts the
memory of the batches in flight).
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Optional

import numpy as np
import torch

from seqloader.loader.tuning.policy import Usage

__all__ = ["ProcessTree", "available_memory", "batch_bytes", "check_proc", "default_memory_budget", "worker_pids"]

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


def _cpu(pid: int) -> Optional[tuple]:
    """``(start, cpu_s)`` of ``pid``: its start time (clock ticks after boot: with the pid, which
    process it is, as pids are reused) and its CPU seconds; ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / _TICK   # starttime, utime + stime (22, 14, 15)


class ProcessTree:
    """This process and its loader's worker processes, measured; :meth:`usage` is what the loader
    holds since the tree was first measured.

    The worker processes are the pids the loader's executor reports (``pids``): another loader's
    workers, or any other child of this process, are not counted. A worker's CPU seconds are its
    last read: one that exited (a switch closed it, or it died and was replaced) keeps what it had
    then, so the CPU seconds never decrease. Thread workers and ``num_workers=0`` run in this
    process: its own CPU seconds (every thread) count them.

    Example:
        >>> import subprocess, sys
        >>> tree = ProcessTree()
        >>> child = subprocess.Popen([sys.executable, "-c", "sum(range(10**7))"])
        >>> before = tree.usage(pids=[child.pid])
        >>> child.wait()
        0
        >>> after = tree.usage(pids=[])          # it exited: it keeps its last read, it never subtracts
        >>> after.cpu_s >= before.cpu_s > 0, after.worker_bytes
        (True, 0)
    """

    def __init__(self) -> None:
        check_proc()
        self._pid = os.getpid()
        self.baseline = _pss(self._pid)
        self.peak_bytes = 0
        self._cpu: dict[tuple, float] = {}   # (pid, start): the last CPU seconds read of each worker seen

    def own_bytes(self) -> int:
        """This process's PSS now."""
        return _pss(self._pid)

    def usage(self, memory: bool = True, pids: Iterable[int] = ()) -> Usage:
        """CPU seconds of this process and of the worker processes ``pids`` (and of those seen
        before: their last read), cheap (``/proc/<pid>/stat``); with ``memory``, what this process
        and ``pids`` hold (``smaps_rollup``: milliseconds per process, so not at every measure)."""
        pids = [p for p in pids if p is not None and p != self._pid]
        for p in pids:
            read = _cpu(p)   # (None once it is gone: its last read stands)
            if read is not None:
                self._cpu[(p, read[0])] = read[1]
        cpu = time.process_time() + sum(self._cpu.values())
        if not memory:
            return Usage(cpu_s=cpu, loader_bytes=0)
        sizes = [_pss(p) for p in pids]
        held = max(0, self.own_bytes() + sum(sizes) - self.baseline)
        self.peak_bytes = max(self.peak_bytes, held)
        return Usage(cpu_s=cpu, loader_bytes=held, worker_bytes=max(sizes, default=0))


def worker_pids(source: Any) -> list:
    """The pids of the worker processes reading for ``source`` (an opened epoch's ``Prefetch``,
    as its executor reports them, or its sequence: the decode processes of its read-ahead, if any).

    Example:
        >>> worker_pids([1, 2, 3])
        []
    """
    decoders = getattr(getattr(source, "read_ahead", None), "decoders", None)
    if decoders is not None:   # (the epoch's sequence, its blocks decoded by processes: read_ahead)
        return [] if decoders.closed else list(decoders.pids)
    executor: Any = getattr(source, "executor", None)
    if getattr(executor, "kind", None) != "process" or source.closed:
        return []
    pids = []
    for w in range(executor.num_workers):
        try:
            pids.append(executor.pid(w))
        except IndexError:   # not started yet
            break
    return pids


def batch_bytes(batch: Any, depth: int = 4) -> int:
    """The bytes of a batch's tensors, arrays and bytes (containers walked ``depth`` levels).

    Example:
        >>> batch_bytes({"x": torch.zeros(4, dtype=torch.int32), "y": [b"ab", np.zeros(2)]}), batch_bytes(3)
        (34, 0)
    """
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, (bytes, bytearray)):
        return len(batch)
    if depth == 0:
        return 0
    if isinstance(batch, dict):
        return sum(batch_bytes(v, depth - 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v, depth - 1) for v in batch)
    return 0
