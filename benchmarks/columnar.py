"""Where a columnar batch's CPU goes at ``num_workers=0``, against a one-process pyarrow scan (issue 43).

* ``columnar_budget``: the issue's files: 20 Parquet files of 5,000 rows in row groups of 1,000
  (100 in all; snappy, dictionary pages), ``id`` int64, ``tokens`` ``list<int32>`` of 512,
  ``label`` int32; batch 64. Two epochs, alternated ``max(3, --repeat)`` times (the machine's load
  hits both alike; the least seconds and the least CPU-s of each are kept): the pyarrow scan
  (``ParquetFile.iter_batches(64)``, every column to a tensor, file order: the base) and
  ``seqloader.DataLoader(parquet(columnar=True), sampler=BlockShuffleSampler(src),
  num_workers=0, collate_fn=default_convert)``, the docs' defaults, the source built inside the
  epoch; and the same loader with 2 worker processes as the first epoch of a fresh interpreter
  (what a training script's first epoch, and every epoch's new workers, pay once per process:
  imports and first conversions; its CPU-s count the workers). Then the budget of a batch, each part timed on its own in this thread, all row groups
  read first where a part is not the read (the per-block parts are spread over the epoch's
  batches): the decode (``read_row_group``), the conversion of the decoded columns to numpy
  (:func:`seqloader.sources._to_numpy.to_numpy`), the copy into the slot buffers, the gather (one
  ``numpy.take`` per column into reused arrays, what the scan's copy is), the source's own Python
  per batch beyond that gather (``__getitems__``), ``default_convert`` (the collate), and the
  loader's own bookkeeping per batch (its epoch over the decoded source less the above).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import default_convert

import seqloader
from benchmarks.common import Options, Row
from benchmarks.threads_data import with_cpu

__all__ = ["COLUMNAR_WORKLOADS", "columnar_budget", "issue_files", "least_seconds", "write_issue_files"]

BATCH = 64


def write_issue_files(folder: str, files: int, rows: int, group: int, tokens: int = 512) -> list[str]:
    """``files`` Parquet files of ``rows`` rows in row groups of ``group`` (snappy, dictionary
    pages): ``id`` int64 (numbered across files), ``tokens`` list<int32> of ``tokens`` random ids
    (vocabulary 50,000), ``label`` int32; returns the paths in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    offsets = pa.array(np.arange(0, rows * tokens + 1, tokens, dtype=np.int32))
    paths = []
    for f in range(files):
        table = pa.table({"id": np.arange(f * rows, (f + 1) * rows, dtype=np.int64),
                          "tokens": pa.ListArray.from_arrays(offsets, rng.integers(0, 50_000, rows * tokens,
                                                                                   dtype=np.int32)),
                          "label": rng.integers(0, 10, rows).astype(np.int32)})
        paths.append(os.path.join(folder, f"part-{f:05d}.parquet"))
        pq.write_table(table, paths[-1], row_group_size=group, compression="snappy", use_dictionary=True)
    return paths


def _scan(paths: list[str]) -> float:
    """Seconds of the pyarrow scan: ``iter_batches(64)`` of every file, each column to a tensor."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    for path in paths:
        for rb in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            out = {}
            for name, col in zip(rb.schema.names, rb.columns):
                values = col.flatten().to_numpy().reshape(len(col), -1) if name == "tokens" else col.to_numpy()
                out[name] = torch.from_numpy(values.copy())
    return time.perf_counter() - t0


def _seqloader(folder: str) -> float:
    """Seconds of a block-shuffled epoch at ``num_workers=0``, the docs' defaults, the source built inside."""
    t0 = time.perf_counter()
    src = seqloader.parquet(folder, columnar=True)
    loader = seqloader.DataLoader(src, batch_size=BATCH, sampler=seqloader.BlockShuffleSampler(src, seed=0),
                                  num_workers=0, seed=0, collate_fn=default_convert)
    for _ in loader:
        pass
    return time.perf_counter() - t0


_FRESH = """
import json, resource, sys, time
import torch
import seqloader
from torch.utils.data import default_convert
def cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
src = seqloader.parquet(sys.argv[1], columnar=True)
c0, t0 = cpu(), time.perf_counter()
for _ in seqloader.DataLoader(src, batch_size=64, sampler=seqloader.BlockShuffleSampler(src, seed=0), num_workers=2,
                              seed=0, collate_fn=default_convert):
    pass
print(json.dumps([time.perf_counter() - t0, cpu() - c0]))
"""


def _fresh(folder: str, cpu: dict[str, float]) -> float:
    """Seconds of the first epoch of a fresh interpreter with 2 worker processes (the source built
    before the timing); its CPU-s, workers included, go to ``cpu["fresh"]`` (the least)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(seqloader.__file__)))   # (this checkout's seqloader)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _FRESH, folder], capture_output=True, text=True, check=True, env=env,
                         timeout=600)
    seconds, used = json.loads(out.stdout.splitlines()[-1])
    cpu["fresh"] = min(cpu.get("fresh", float("inf")), used)
    return float(seconds)


def _least(f: Callable[[], Any], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def _budget(folder: str) -> dict[str, float]:
    """Microseconds per batch of each part of a columnar batch (see the module docstring)."""
    from seqloader.sources._to_numpy import to_numpy

    src = seqloader.parquet(folder, columnar=True)
    blocks = len(src.blocks())
    src.size_cache(blocks)   # (every row group kept: the parts after the read are timed without it)
    sampler = seqloader.BlockShuffleSampler(src, seed=0, lanes=1, chunk=BATCH)
    order = np.fromiter(iter(sampler), dtype=np.int64, count=len(src))
    batches = [order[i:i + BATCH].tolist() for i in range(0, len(order) - BATCH + 1, BATCH)]
    per = 1e6 / len(batches)
    tables = src._read_blocks(list(range(blocks)))   # (the benchmark looks inside the source)
    names = src.columns
    read = _least(lambda: [src._read_blocks([b]) for b in range(blocks)], 2) * per
    convert = _least(lambda: [[to_numpy(t.column(n)) for n in names] for t in tables]) * per
    cols = [{n: to_numpy(t.column(n)) for n in names} for t in tables]
    from seqloader.sources._slots import Slots, slot_rows

    rows = slot_rows(src._index.ends - src._index.starts)
    spare = Slots(blocks, "budget")
    store = _least(lambda: [spare.store(c, b, rows, b, blocks) for b, c in enumerate(cols)]) * per
    for b in batches:
        src.__getitems__(b)
    slots = src._slots.get()
    index = [slots._base[bl] + r for bl, r in (src._index.locate(b) for b in batches)]
    outs = {n: np.empty((BATCH, *slots._buffers[n].shape[1:]), slots._buffers[n].dtype) for n in names}

    def takes() -> None:
        for i in index:
            for n in names:
                np.take(slots._buffers[n], i, axis=0, out=outs[n], mode="clip")

    gather = _least(takes) * per
    def getitems() -> None:   # (each batch dropped before the next, as a training loop does: buffers reused)
        for b in batches:
            src.__getitems__(b)

    def collates() -> None:
        for _ in batches:
            default_convert(batch)

    source_us = _least(getitems) * per
    batch = src.__getitems__(batches[0])
    collate = _least(collates) * per

    def epoch() -> None:
        for _ in seqloader.DataLoader(src, batch_size=BATCH, sampler=sampler, num_workers=0, seed=0,
                                      collate_fn=default_convert):
            pass

    loader = _least(epoch, 3) * per
    return {"decode (read_row_group), per block spread over the batches": read,
            "conversion to numpy (to_numpy), per block spread over the batches": convert,
            "copy into the slot buffers, per block spread over the batches": store,
            "gather (numpy.take per column into reused arrays)": gather,
            "the source's Python per batch beyond the gather (__getitems__)": source_us - gather,
            "collate (default_convert)": collate,
            "the loader's own bookkeeping per batch": loader - source_us - collate}


@contextlib.contextmanager
def issue_files(opts: Options) -> Iterator[tuple[str, list[str], tuple[int, int, int]]]:
    """``(folder, paths, (files, rows, group))``: the issue's files (:func:`write_issue_files`; small
    ones with ``--quick``) in a temporary folder, removed when the block ends."""
    sizes = (4, 500, 100) if opts.quick else (20, 5000, 1000)
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        folder = os.path.join(tmp, "tokens")
        yield folder, write_issue_files(folder, *sizes), sizes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def least_seconds(runs: dict[str, Callable[[], float]], opts: Options) -> dict[str, float]:
    """Each run's least seconds over ``max(3, --repeat)`` rounds, the runs alternated in each."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(max(3, opts.repeat)):
        for label, run in runs.items():
            best[label] = min(best[label], run())
    return best


def columnar_budget(opts: Options) -> list[Row]:
    """The pyarrow scan and seqloader's ``num_workers=0`` epoch, alternated, then a batch's budget."""
    with issue_files(opts) as (folder, paths, (files, rows, group)):
        runs = {"scan": lambda: _scan(paths), "seqloader": lambda: _seqloader(folder)}
        cpu: dict[str, float] = {}
        best = least_seconds({**with_cpu(runs, cpu), "fresh": lambda: _fresh(folder, cpu)}, opts)
        budget = _budget(folder)
    n = files * rows
    size = f"{files} files x {rows:,} rows, row groups of {group:,}, id/tokens(512 x int32)/label, batch {BATCH}"
    scan, ours = best["scan"], best["seqloader"]
    out = [Row("columnar_budget", "pyarrow scan: iter_batches(64) -> tensors", 0, n / scan, "rows/s",
               notes=f"{size}; one process, file order: the base ({cpu['scan']:.2f} CPU-s)"),
           Row("columnar_budget", "seqloader, 0 workers, block shuffle", 0, n / ours, "rows/s", ratio=scan / ours,
               notes=f"ratio: over the scan ({cpu['seqloader']:.2f} CPU-s, {cpu['scan'] / cpu['seqloader']:.2f}x "
                     "the scan's); parquet(columnar=True), BlockShuffleSampler(src), default_convert"),
           Row("columnar_budget", "seqloader, 2 worker processes, a fresh interpreter's first epoch", 2,
               n / best["fresh"], "rows/s", ratio=scan / best["fresh"],
               notes=f"ratio: over the scan ({cpu['fresh']:.2f} CPU-s, workers included); the same loader, in a new "
                     "process: what each process pays once")]
    out += [Row("columnar_budget", part, 0, us, "us", notes="per batch, one thread") for part, us in budget.items()]
    return out


COLUMNAR_WORKLOADS = {"columnar_budget": columnar_budget}
