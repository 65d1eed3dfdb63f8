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
"""

from __future__ import annotations

import time
from typing import Any, Callable

from torch.utils.data import default_convert

import seqloader
from benchmarks.columnar import BATCH, _scan, issue_files, least_seconds
from benchmarks.common import Options, Row
from benchmarks.threads_data import RowIndex

__all__ = ["COLUMNAR_WORKER_WORKLOADS", "columnar_workers"]

#: label -> DataLoader keywords (``None``: torch's DataLoader over the row index)
CONFIGS: dict[str, Any] = {
    "seqloader, 0 workers": {"num_workers": 0},
    "seqloader, 2 worker processes": {"num_workers": 2},
    "seqloader, 2 worker processes, prefetch_factor=2": {"num_workers": 2, "prefetch_factor": 2},
    "seqloader, 2 thread workers": {"num_workers": 2, "worker_method": "thread"},
    "seqloader, 2 processes x 2 threads": {"num_workers": 2, "threads_per_worker": 2},
    "torch DataLoader over a map-style row index": None,
}


def _loaders(folder: str, paths: list[str]) -> dict[str, Callable[[], float]]:
    """label -> one epoch's seconds, each loader built once (and warmed up by one epoch)."""
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


COLUMNAR_WORKER_WORKLOADS = {"columnar_workers": columnar_workers}
