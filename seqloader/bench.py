"""``python -m seqloader.bench``: seqloader's prefetcher against ``torch.utils.data.DataLoader``.

Each workload runs seqloader and torch on the same dataset, batch size and number of workers in
the same process and returns :class:`Row` objects; ``ratio`` is seqloader's throughput over
torch's (time-to-first-batch rows: torch's time over seqloader's, so higher is better in every
row). Workloads live in :data:`WORKLOADS` (name -> function(:class:`Options`) -> rows), so other
parts can register more::

    python -m seqloader.bench                       # every workload, full size
    python -m seqloader.bench --workloads tiny --quick --markdown

The seqloader pipeline is ``prefetch(batch(gather(dataset, indices), k, collate_fn=default_collate),
num_workers)``; torch's is ``DataLoader(dataset, batch_size=k, num_workers=num_workers)``. Timings
include starting the workers (both start them per epoch here) and never touch the batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from typing import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from seqloader.bench_loader import LOADER_WORKLOADS
from seqloader.prefetch import prefetch
from seqloader.sequences.reorder import gather
from seqloader.sequences.shape import batch

__all__ = ["Options", "Row", "WORKLOADS", "main", "run"]


@dataclasses.dataclass(frozen=True)
class Options:
    """Sizes and repetitions shared by every workload."""

    quick: bool = False
    repeat: int = 1


@dataclasses.dataclass(frozen=True)
class Row:
    """One measurement: ``value`` in ``unit`` (higher is better unless unit is ``s``)."""

    workload: str
    loader: str
    num_workers: int
    value: float
    unit: str
    mb_per_s: float | None = None
    ratio: float | None = None


# --------------------------------------------------------------------------- datasets


class IntDataset:
    """``n`` ints: item ``i`` is ``i``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class ImageDataset:
    """``n`` uint8 arrays of ``shape``, cycling over 256 distinct random images."""

    def __init__(self, n: int, shape=(3, 224, 224), distinct: int = 256):
        self.n = n
        self.images = np.random.default_rng(0).integers(0, 256, (min(distinct, n), *shape), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.images[i % len(self.images)]


class CpuDataset:
    """``n`` items each costing ``size``-element numpy work (~1 ms at 30_000)."""

    def __init__(self, n: int, size: int = 30_000):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        a = np.random.default_rng(i).random(self.size)
        return float(np.sort(a)[:: max(1, self.size // 100)].sum())


# --------------------------------------------------------------------------- timing


def _seq_pipeline(dataset, k: int):
    return batch(gather(dataset, np.arange(len(dataset))), k, collate_fn=default_collate)


def time_seqloader(dataset, k: int, num_workers: int, **prefetch_kwargs) -> float:
    """Seconds for one epoch of the seqloader pipeline (workers started inside the timing)."""
    t0 = time.perf_counter()
    seq = _seq_pipeline(dataset, k)
    if num_workers == 0:
        for _ in seq:
            pass
    else:
        with prefetch(seq, num_workers, **prefetch_kwargs) as p:
            for _ in p:
                pass
    return time.perf_counter() - t0


def time_torch(dataset, k: int, num_workers: int) -> float:
    """Seconds for one epoch of ``DataLoader(dataset, batch_size=k, num_workers=num_workers)``."""
    t0 = time.perf_counter()
    for _ in DataLoader(dataset, batch_size=k, num_workers=num_workers):
        pass
    return time.perf_counter() - t0


def compare(name: str, dataset, k: int, num_workers: int, opts: Options, item_bytes: int | None = None,
            variants: dict | None = None) -> list[Row]:
    """Time torch and seqloader (best of ``opts.repeat``, interleaved); one row per loader.

    ``variants`` maps extra seqloader row labels to ``prefetch`` keyword arguments.
    """
    runs = {"seqloader": {}, **(variants or {})}
    best = dict.fromkeys([*runs, "torch"], float("inf"))
    for _ in range(opts.repeat):
        for label, kwargs in runs.items():
            best[label] = min(best[label], time_seqloader(dataset, k, num_workers, **kwargs))
        best["torch"] = min(best["torch"], time_torch(dataset, k, num_workers))
    n = len(dataset)

    def mb(t):
        return None if item_bytes is None else n * item_bytes / t / 1e6

    rows = [Row(name, label, num_workers, n / best[label], "samples/s", mb(best[label]), best["torch"] / best[label])
            for label in runs]
    return rows + [Row(name, "torch", num_workers, n / best["torch"], "samples/s", mb(best["torch"]))]


# --------------------------------------------------------------------------- workloads


def tiny(opts: Options) -> list[Row]:
    """200_000 int items, batch 256, 2 workers."""
    return compare("tiny", IntDataset(5_000 if opts.quick else 200_000), 256, 2, opts)


def images(opts: Options) -> list[Row]:
    """8_000 uint8 images 3x224x224, batch 64, 2 workers."""
    ds = ImageDataset(256 if opts.quick else 8_000)
    return compare("images", ds, 64, 2, opts, item_bytes=ds.images[0].nbytes,
                   variants={"seqloader torch_worker_info=False": {"torch_worker_info": False}})


def cpu(opts: Options) -> list[Row]:
    """4_000 items of ~1 ms numpy work, batch 32, 0 and 2 workers."""
    ds = CpuDataset(200, size=3_000) if opts.quick else CpuDataset(4_000)
    return compare("cpu", ds, 32, 0, opts) + compare("cpu", ds, 32, 2, opts)


_FIRST_BATCH = """
import sys, time
t0 = time.perf_counter()
from seqloader.bench import ImageDataset, first_batch
ds = ImageDataset({n})
print(first_batch(sys.argv[1], ds, 64, 2) + (time.perf_counter() - t0 if sys.argv[2] == "total" else 0.0))
"""


def first_batch(loader: str, dataset, k: int, num_workers: int) -> float:
    """Seconds from building the loader to holding its first batch."""
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


def first_batch_images(opts: Options) -> list[Row]:
    """Time to the first image batch (batch 64, 2 workers), each in a fresh subprocess."""
    n = 256 if opts.quick else 8_000
    best = {}
    for _ in range(opts.repeat):
        for loader in ("seqloader", "torch"):
            out = subprocess.run([sys.executable, "-c", _FIRST_BATCH.format(n=n), loader, "loader"],
                                 check=True, capture_output=True, text=True).stdout
            best[loader] = min(best.get(loader, float("inf")), float(out.strip().splitlines()[-1]))
    return [Row("first_batch", "seqloader", 2, best["seqloader"], "s", ratio=best["torch"] / best["seqloader"]),
            Row("first_batch", "torch", 2, best["torch"], "s")]


#: Workload name -> function(Options) -> rows. Add entries to benchmark more pipelines.
WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "tiny": tiny,
    "images": images,
    "cpu": cpu,
    "first_batch": first_batch_images,
}
WORKLOADS.update(LOADER_WORKLOADS)


# --------------------------------------------------------------------------- entry point


def run(names: Iterable[str], opts: Options) -> list[Row]:
    """Run the named workloads in order and return all their rows."""
    rows: list[Row] = []
    for name in names:
        rows += WORKLOADS[name](opts)
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def format_rows(rows: list[Row], markdown: bool) -> str:
    """Rows as aligned text or a markdown table."""
    head = ["workload", "loader", "workers", "value", "unit", "MB/s", "ratio"]
    body = [[r.workload, r.loader, str(r.num_workers), _fmt(r.value, ".4g" if r.unit == "s" else ",.0f"), r.unit,
             _fmt(r.mb_per_s, ",.0f"), _fmt(r.ratio, ".2f") + ("x" if r.ratio is not None else "")] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head, *body])


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the workloads, print the table; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m seqloader.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the best is kept")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)} (expected some of {', '.join(WORKLOADS)})")
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1 (got {args.repeat})")
    torch.set_num_threads(1)
    print(format_rows(run(names, Options(quick=args.quick, repeat=args.repeat)), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
