"""Issue 43's pipeline on every executor: do two workers beat none on fast, decode-bound batches?

* ``columnar_workers``: the issue's files (:func:`benchmarks.columnar.write_issue_files`: 20
  Parquet files of 5,000 rows in row groups of 1,000, ``id``/``tokens`` (512 x int32)/``label``),
  batch 64, ``parquet(columnar=True)`` + ``BlockShuffleSampler(src)`` + ``default_convert`` (the
  docs' defaults), each loader built once with ``persistent_workers=True`` (as a training script
  keeps it) and read one epoch to warm up; then the epochs of every configuration alternated
  ``max(3, --repeat)`` times, the least seconds kept: ``num_workers=0``, 2 worker processes with
  the read-ahead the loader derives (``prefetch_factor`` left out) and with torch's
  ``prefetch_factor=2``, 2 thread workers, 2 processes x 2 threads, and torch's ``DataLoader``
  over a hand-written row index (2 workers, the same block shuffle: the ratio base). Notes give
  each row over ``num_workers=0`` and over a one-process pyarrow scan of the same files.
* ``columnar_costs``: the same loaders (torch's excepted), ``max(3, --repeat)`` more warm epochs
  each (more, up to 200, until they used 0.2 CPU-s: ``/proc`` counts 10 ms clock ticks), the
  means over them measured from ``/proc`` (Linux): a batch's CPU in every process and thread of the loader (the training
  process's threads and its worker processes), the training thread's own share
  (``time.thread_time``), and the context switches per batch (voluntary and not, every thread of
  every process): where a batch's CPU goes beyond the one-thread budget of ``columnar_budget``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from torch.utils.data import default_convert

import seqloader
from benchmarks.columnar import BATCH, _scan, issue_files, least_seconds
from benchmarks.common import Options, Row
from benchmarks.threads_data import RowIndex

__all__ = ["COLUMNAR_WORKER_WORKLOADS", "columnar_costs", "columnar_workers"]

#: label -> DataLoader keywords (``None``: torch's DataLoader over the row index)
CONFIGS: dict[str, Any] = {
    "seqloader, 0 workers": {"num_workers": 0},
    "seqloader, 2 worker processes": {"num_workers": 2},
    "seqloader, 2 worker processes, prefetch_factor=2": {"num_workers": 2, "prefetch_factor": 2},
    "seqloader, 2 thread workers": {"num_workers": 2, "worker_method": "thread"},
    "seqloader, 2 processes x 2 threads": {"num_workers": 2, "threads_per_worker": 2},
    "torch DataLoader over a map-style row index": None,
}


def _loaders(folder: str, paths: list[str], keep: Any = None) -> dict[str, Callable[[], float]]:
    """label -> one epoch's seconds, each loader built once (and warmed up by one epoch); ``keep``:
    a dict that receives label -> loader."""
    import torch

    runs: dict[str, Callable[[], float]] = {}
    for label, kw in CONFIGS.items():
        if kw is None:
            rows = RowIndex(paths, cache_blocks=8)
            sampler = seqloader.BlockShuffleSampler(rows, window=8, seed=0, lanes=2, chunk=BATCH)
            loader: Any = torch.utils.data.DataLoader(rows, batch_size=BATCH, sampler=sampler, num_workers=2,
                                                      persistent_workers=True)
        else:
            src = seqloader.parquet(folder, columnar=True)
            extra = {"persistent_workers": True} if kw["num_workers"] else {}
            loader = seqloader.DataLoader(src, batch_size=BATCH, sampler=seqloader.BlockShuffleSampler(src, seed=0),
                                          seed=0, collate_fn=default_convert, **kw, **extra)

        def epoch(loader: Any = loader) -> float:
            t0 = time.perf_counter()
            for _ in loader:
                pass
            return time.perf_counter() - t0

        epoch()   # warm-up: workers started, row groups' files opened
        runs[label] = epoch
        if keep is not None:
            keep[label] = loader
    return runs


def columnar_workers(opts: Options) -> list[Row]:
    """Each configuration's epoch and the pyarrow scan, alternated; see the module docstring."""
    with issue_files(opts) as (folder, paths, (files, rows, group)):
        best = least_seconds({**_loaders(folder, paths), "scan": lambda: _scan(paths)}, opts)
    n = files * rows
    base, zero, scan = best["torch DataLoader over a map-style row index"], best["seqloader, 0 workers"], best["scan"]
    size = f"{files} files x {rows:,} rows, row groups of {group:,}, batch {BATCH}; persistent workers, warm"
    out = []
    for label in CONFIGS:
        s = best[label]
        torch_row = label.startswith("torch")
        out.append(Row("columnar_workers", label, 0 if label.endswith("0 workers") else 2, n / s, "rows/s",
                       ratio=None if torch_row else base / s,
                       notes=(f"the ratio base; {size}" if torch_row else
                              f"{zero / s:.2f}x num_workers=0, {scan / s:.2f}x the pyarrow scan")))
    out.append(Row("columnar_workers", "pyarrow scan: iter_batches(64) -> tensors", 0, n / scan, "rows/s",
                   ratio=base / scan, notes="one process, file order"))
    return out


def _tree() -> list[int]:
    """This process and its descendants (``/proc/<pid>/task/<tid>/children``)."""
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:   # (a process that ended meanwhile)
            pass
    return out


#: the least CPU seconds measured per loader (many clock ticks), and the most epochs read for it
MIN_CPU_S, MOST_EPOCHS = 0.2, 200


def _usage() -> tuple[float, int]:
    """``(CPU seconds, context switches)`` of every thread of :func:`_tree`'s processes."""
    tick, cpu, switches = os.sysconf("SC_CLK_TCK"), 0.0, 0
    for pid in _tree():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick   # utime, stime (every thread)
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    switches += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            pass
    return cpu, switches


def columnar_costs(opts: Options) -> list[Row]:
    """Per executor: a batch's CPU (every process), the training thread's share, context switches."""
    out = []
    with issue_files(opts) as (folder, paths, (files, rows, group)):
        loaders: dict[str, Any] = {}
        _loaders(folder, paths, loaders)
        for label, loader in loaders.items():
            if label.startswith("torch"):
                continue
            fastest, epochs, batches, cpu_s, own_s, switches = float("inf"), 0, 0, 0.0, 0.0, 0
            # (at least MIN_CPU_S in all: /proc counts clock ticks, 10 ms, and a quick epoch is shorter)
            while epochs < max(3, opts.repeat) or (cpu_s < MIN_CPU_S and epochs < MOST_EPOCHS):
                cpu0, sw0, own0, t0 = *_usage(), time.thread_time(), time.perf_counter()
                n = sum(1 for _ in loader)
                fastest = min(fastest, (time.perf_counter() - t0) / n)
                cpu, sw = _usage()
                epochs, batches, cpu_s = epochs + 1, batches + n, cpu_s + cpu - cpu0
                own_s, switches = own_s + time.thread_time() - own0, switches + sw - sw0
            out.append(Row("columnar_costs", label, loader.num_workers, cpu_s / batches * 1e6, "CPU us/batch",
                           notes=f"training thread {own_s / batches * 1e6:.0f} us/batch; {switches / batches:.1f} "
                                 f"context switches/batch; {BATCH / fastest:,.0f} rows/s (the fastest of the "
                                 f"{epochs} epochs; CPU and switches: their mean)"))
    return out


COLUMNAR_WORKER_WORKLOADS = {"columnar_workers": columnar_workers, "columnar_costs": columnar_costs}
