"""Bare-prefetch workloads: seqloader's ``prefetch`` pipeline against ``torch.utils.data.DataLoader``.

The seqloader pipeline is ``prefetch(batch(gather(dataset, indices), k, collate_fn=default_collate),
num_workers)``; torch's is ``DataLoader(dataset, batch_size=k, num_workers=num_workers)``. Both run
on the same dataset, batch size and number of workers in the same process; timings include
starting the workers (both start them per epoch here) and never touch the batches. The bare
``prefetch`` never sets torch's ``WorkerInfo`` in its workers, so ``default_collate`` stacks
batches in ordinary memory there.

* ``tiny``: 200_000 ints, batch 256, 2 workers.
* ``images``: 8_000 uint8 images 3x224x224, batch 64, 2 workers.
* ``cpu``: 4_000 items of ~1 ms numpy work, batch 32, 0 and 2 workers.
* ``first_batch``: seconds to the first image batch, each loader in a fresh subprocess.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from typing import Callable

import numpy as np
from torch.utils.data import DataLoader, default_collate

from benchmarks.common import CpuDataset, ImageDataset, IntDataset, Options, Row, best_of, mb_per_s
from seqloader import batch, gather, prefetch

__all__ = ["PREFETCH_WORKLOADS", "compare", "cpu", "first_batch", "first_batch_images", "images", "tiny",
           "time_seqloader", "time_torch"]


def _seq_pipeline(dataset, k: int):
    return batch(gather(dataset, np.arange(len(dataset))), k, collate_fn=default_collate)


def time_seqloader(dataset, k: int, num_workers: int) -> float:
    """Seconds for one epoch of the seqloader pipeline (workers started inside the timing)."""
    t0 = time.perf_counter()
    seq = _seq_pipeline(dataset, k)
    if num_workers == 0:
        for _ in seq:
            pass
    else:
        with prefetch(seq, num_workers) as p:
            for _ in p:
                pass
    return time.perf_counter() - t0


def time_torch(dataset, k: int, num_workers: int) -> float:
    """Seconds for one epoch of ``DataLoader(dataset, batch_size=k, num_workers=num_workers)``."""
    t0 = time.perf_counter()
    for _ in DataLoader(dataset, batch_size=k, num_workers=num_workers):
        pass
    return time.perf_counter() - t0


def compare(name: str, dataset, k: int, num_workers: int, opts: Options, item_bytes: int | None = None) -> list[Row]:
    """Time seqloader and torch (best of ``opts.repeat``, interleaved); one row per loader."""
    best = best_of(opts.repeat, {"seqloader": lambda: time_seqloader(dataset, k, num_workers),
                                 "torch": lambda: time_torch(dataset, k, num_workers)})
    n = len(dataset)
    return [Row(name, "seqloader", num_workers, n / best["seqloader"], "samples/s",
                mb_per_s(n, item_bytes, best["seqloader"]), best["torch"] / best["seqloader"]),
            Row(name, "torch", num_workers, n / best["torch"], "samples/s", mb_per_s(n, item_bytes, best["torch"]))]


def tiny(opts: Options) -> list[Row]:
    """200_000 int items, batch 256, 2 workers."""
    return compare("tiny", IntDataset(5_000 if opts.quick else 200_000), 256, 2, opts)


def images(opts: Options) -> list[Row]:
    """8_000 uint8 images 3x224x224, batch 64, 2 workers."""
    ds = ImageDataset(256 if opts.quick else 8_000)
    return compare("images", ds, 64, 2, opts, item_bytes=ds.images[0].nbytes)


def cpu(opts: Options) -> list[Row]:
    """4_000 items of ~1 ms numpy work, batch 32, 0 and 2 workers."""
    ds = CpuDataset(200, size=3_000) if opts.quick else CpuDataset(4_000)
    return compare("cpu", ds, 32, 0, opts) + compare("cpu", ds, 32, 2, opts)


def first_batch(loader: str, dataset, k: int, num_workers: int) -> float:
    """Seconds from building the loader (``"seqloader"`` or ``"torch"``) to holding its first batch."""
    t0 = time.perf_counter()
    if loader == "seqloader":
        with prefetch(_seq_pipeline(dataset, k), num_workers) as p:
            p[0]
            return time.perf_counter() - t0
    it = iter(DataLoader(dataset, batch_size=k, num_workers=num_workers))
    next(it)
    dt = time.perf_counter() - t0
    del it
    return dt


_FIRST_BATCH = """
import sys
from benchmarks.common import ImageDataset
from benchmarks.prefetch import first_batch
print(first_batch(sys.argv[1], ImageDataset({n}), 64, 2))
"""

#: The folder that holds the ``benchmarks`` package, for the subprocesses of ``first_batch``.
_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _first_batch_in_subprocess(loader: str, n: int) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _FIRST_BATCH.format(n=n), loader],
                         check=True, capture_output=True, text=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


def first_batch_images(opts: Options) -> list[Row]:
    """Time to the first image batch (batch 64, 2 workers), each in a fresh subprocess."""
    n = 256 if opts.quick else 8_000
    best = best_of(opts.repeat, {loader: lambda loader=loader: _first_batch_in_subprocess(loader, n)
                                 for loader in ("seqloader", "torch")})
    return [Row("first_batch", "seqloader", 2, best["seqloader"], "s", ratio=best["torch"] / best["seqloader"]),
            Row("first_batch", "torch", 2, best["torch"], "s")]


#: Workload name -> function(Options) -> rows.
PREFETCH_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "tiny": tiny,
    "images": images,
    "cpu": cpu,
    "first_batch": first_batch_images,
}
