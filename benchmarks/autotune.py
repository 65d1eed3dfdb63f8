"""``DataLoader(autotune=True)`` against a grid of fixed configurations, torch's default and Grain's (issue 38).

Four workloads, each a whole epoch read as fast as the loop can (the loop does nothing else),
from building the loader to its last batch, in one process, one after the other. The epochs are
sized like real ones, 15-25 s at the best configuration on a 2-core machine, so that "converges
in a few seconds of an epoch" is what is measured:

* ``autotune_latency``: 19,200 items that wait 10-20 ms (a remote read), batch 32;
* ``autotune_python``: 192,000 items of ~0.3 ms of pure Python (the GIL held), batch 64
  (``benchmarks.threads_data.PythonItems``);
* ``autotune_parquet``: the block-shuffled Parquet epoch of ``benchmarks.threads``
  (``parquet(columnar=True)``, ``BlockShuffleSampler(window=4)``, batch 64) over 48 files, each
  also linked 9 more times under other names (480 files, 1.97 M rows);
* ``autotune_tar``: tar shards of 160x160 JPEGs decoded by ``seqloader.ImageDecoder()`` (``tar_shards``,
  ``BlockShuffleSampler(window=2)``), batch 64: 16 shards of 500, each linked 7 more times (64,000).

Every workload runs the same grid of :data:`GRID` fixed configurations (at most 2 worker
processes, as ``autotune`` with ``num_workers=2``: the machine's cores), ``autotune=True``
(``num_workers=2``: at most 2 processes, 16 thread workers), and torch's ``DataLoader`` with
``num_workers=2`` (what a user writes). ``ratio`` is each row's samples/s over the best fixed
configuration of the grid (the goal for autotune: >= 0.9); the worst row of the grid is what a
wrong guess costs. A fixed configuration (and torch's and Grain's defaults) that has not finished
after :data:`LIMIT` seconds is stopped and its epoch extrapolated: the time so far, start-up
included, plus the batches left at the rate of the second half of what it read (its steady rate;
the notes say so). ``autotune=True`` always reads its whole epoch. *peak PSS* is the
process tree's proportional set size above what it was before the loader was built, sampled
every 50 ms (psutil, a benchmark-only dependency), against autotune's ``memory_budget`` (half the
memory available). Grain's default is its RAM heuristic
(``grain.experimental.pick_performance_config``: workers = RAM budget / element size, at most the
CPUs) with the same budget, where grain is installed (the ``bench`` extra).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, default_convert

import seqloader
from benchmarks.common import Options, Row
from benchmarks.threads_data import (DecodeSample, PssSampler, PythonItems, RowIndex, write_jpeg_shards,
                                     write_token_files)

__all__ = ["AUTOTUNE_WORKLOADS", "GRID", "JitteryItems"]

#: (label, num_workers, worker_method, threads_per_worker): the fixed configurations of the grid.
GRID = [("0 workers", 0, "multiprocessing", 1), ("1 process", 1, "multiprocessing", 1),
        ("2 processes", 2, "multiprocessing", 1), ("2 threads", 2, "thread", 1),
        ("16 threads", 16, "thread", 1), ("2 processes x 4 threads", 2, "multiprocessing", 4)]


#: seconds a fixed configuration, torch's or Grain's default runs before its epoch is extrapolated
LIMIT = 10.0


def _copies(folder: str, copies: int) -> None:
    """Hard links ``-copyK`` of each file in ``folder``, ``copies`` files in all: a longer epoch
    of distinct paths (each decoded and cached on its own) without writing the data again."""
    for name in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(name)
        for k in range(1, copies):
            os.link(os.path.join(folder, name), os.path.join(folder, f"{stem}-copy{k}{ext}"))


class JitteryItems:
    """Item ``i`` waits 10-20 ms (a remote read's latency), then is a small tensor."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.010 + 0.001 * (i * 7919 % 11))
        return torch.full((16,), i, dtype=torch.int64)


def _timed(make: Callable[[], Any], n_batches: int, limit: float) -> tuple[float, bool, int, Any]:
    """``(seconds for the epoch, extrapolated?, peak PSS above the start, the loader)``: build the
    loader with ``make()`` and read it to its end, or for ``limit`` seconds and extrapolate: the
    time so far (start-up included, once) plus the batches left at the rate of the second half of
    what was read (a fixed configuration's steady rate)."""
    with PssSampler() as pss:
        base = pss.peak
        t0 = time.perf_counter()
        made = make()
        it = iter(made)
        done, cut, stamps = 0, False, []
        for _ in it:
            done += 1
            now = time.perf_counter()
            stamps.append(now)
            if now - t0 > limit and done < n_batches:
                cut = True
                break
        seconds = time.perf_counter() - t0
        del it
    if cut:
        half = done // 2
        steady = (stamps[-1] - stamps[half - 1]) / (done - half) if half >= 1 else seconds / done
        seconds += (n_batches - done) * steady
    return seconds, cut, max(0, pss.peak - base), made


def _fixed(data: Any, sampler: Callable[[], Any], bs: int, w: int, method: str, threads: int, **kw: Any) -> Any:
    extra: dict[str, Any] = {} if w == 0 else {"worker_method": method}
    if threads > 1:
        extra["threads_per_worker"] = threads
    return seqloader.DataLoader(data, batch_size=bs, sampler=sampler(), num_workers=w, seed=0, **extra, **kw)


def _compare(workload: str, what: str, n: int, bs: int, make_data: Callable[[str, int, str, int], Any],
             sampler: Callable[[Any], Any], limit: float, torch_data: Any = None, **kw: Any) -> list[Row]:
    """Run the grid, autotune and torch's default on one workload; rows with ratios over the grid's best."""
    batches = -(-n // bs)
    results: dict[str, tuple[float, bool, int]] = {}
    for label, w, method, threads in GRID:
        data = make_data(label, w, method, threads)
        s, cut, mem, _ = _timed(lambda: _fixed(data, lambda: sampler(data), bs, w, method, threads, **kw), batches,
                                limit)
        results[label] = (s, cut, mem)
    data = make_data("autotune", 16, "thread", 1)
    s, cut, mem, tuned = _timed(lambda: seqloader.DataLoader(data, batch_size=bs, sampler=sampler(data), num_workers=2,
                                                             seed=0, autotune=True, **kw), batches, float("inf"))
    report = tuned.stats()["autotune"]
    tdata = torch_data if torch_data is not None else data
    ts, tcut, tmem, _ = _timed(lambda: DataLoader(tdata, batch_size=bs, sampler=sampler(tdata), num_workers=2, **kw),
                               batches, limit)
    best_label = min(results, key=lambda k: results[k][0])
    worst_label = max(results, key=lambda k: results[k][0])
    best = results[best_label][0]

    def row(label: str, seconds: float, cut: bool, mem: int, notes: str, workers: int = 2) -> Row:
        extra = "; extrapolated from its first batches" if cut else ""
        return Row(workload, label, workers, n / seconds, "samples/s", ratio=best / seconds,
                   notes=f"{notes}{extra}; peak PSS +{mem / 2**20:.0f} MiB")

    budget = report["memory_budget"]
    trials = ", ".join(f"{t['config']} {t['batches_per_s']:.0f}/s" for t in report["trials"])
    out = [row("seqloader autotune=True (tuning included)", s, cut, mem,
               f"chose {report['chosen'] or report['current']}; trials: {trials}; {report['switches']} switches; "
               f"memory_budget {budget / 2**30:.1f} GiB, its own peak measure +{report['peak_bytes'] / 2**20:.0f} MiB"
               f"{' (within)' if mem <= budget else ' (EXCEEDED)'}")]
    for label, _, _, _ in GRID:
        s_, c_, m_ = results[label]
        tag = " (the grid's best)" if label == best_label else (" (the grid's worst)" if label == worst_label else "")
        out.append(row(f"fixed: {label}{tag}", s_, c_, m_, what if label == best_label else "fixed configuration"))
    out.append(row("torch DataLoader(num_workers=2) (torch's default as users write it)", ts, tcut, tmem,
                   "torch's own loader"))
    out.append(_grain_row(workload, data, bs, n, batches, best, budget, limit))
    return out


def _grain_row(workload: str, data: Any, bs: int, n: int, batches: int, best: float, budget: int, limit: float) -> Row:
    """Grain's default: ``grain.experimental.pick_performance_config`` (its RAM heuristic: workers =
    RAM budget / element size, at most the CPUs; read buffer likewise) with autotune's memory
    budget, over a ``MapDataset`` of the same items (a global shuffle, batches as lists)."""
    label = "Grain default (pick_performance_config, the same RAM budget)"
    try:
        import grain
    except ImportError:
        return Row(workload, label, 0, float("nan"), "samples/s", notes="not measured: grain is not installed")

    def build(read_options: Any = None) -> Any:
        return (grain.MapDataset.source(data).shuffle(seed=0).to_iter_dataset(read_options)
                .batch(bs, batch_fn=list))

    perf = grain.experimental.pick_performance_config(build(), ram_budget_mb=budget // 2**20, max_workers=None,
                                                      max_buffer_size=None)
    workers = perf.multiprocessing_options.num_workers
    s, cut, mem, _ = _timed(lambda: build(perf.read_options).mp_prefetch(perf.multiprocessing_options), batches, limit)
    extra = "; extrapolated from its first batches" if cut else ""
    return Row(workload, label, workers, n / s, "samples/s", ratio=best / s,
               notes=f"{workers} mp_prefetch workers, read buffer {perf.read_options.prefetch_buffer_size}{extra}; "
                     f"peak PSS +{mem / 2**20:.0f} MiB")


def autotune_latency(opts: Options) -> list[Row]:
    """Items that wait 10-20 ms: threads win, processes lose."""
    n, bs = (1_280, 32) if opts.quick else (19_200, 32)
    data = JitteryItems(n)
    return _compare("autotune_latency", f"{n:,} items of 10-20 ms, batch {bs}", n, bs, lambda *a: data,
                    lambda d: None, limit=6.0 if opts.quick else LIMIT)


def autotune_python(opts: Options) -> list[Row]:
    """Items of ~0.3 ms of pure Python: processes win, threads take turns on the GIL."""
    n, bs = (6_400, 64) if opts.quick else (192_000, 64)
    data = PythonItems(n)
    return _compare("autotune_python", f"{n:,} items of ~0.3 ms of pure Python, batch {bs}", n, bs, lambda *a: data,
                    lambda d: None, limit=6.0 if opts.quick else LIMIT)


def autotune_parquet(opts: Options) -> list[Row]:
    """The block-shuffled Parquet epoch of ``benchmarks.threads`` (token rows, batch 64)."""
    files, rows, tokens, window, bs, copies = (20, 256, 512, 4, 64, 1) if opts.quick else (48, 4096, 512, 4, 64, 10)
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        folder = os.path.join(tmp, "tokens")
        write_token_files(folder, files, rows, tokens)
        _copies(folder, copies)
        files *= copies

        def make(label: str, w: int, method: str, threads: int) -> Any:
            # the docs' defaults: cache_blocks sized by the loader for the configuration in force
            return seqloader.parquet(folder, columnar=True)

        return _compare("autotune_parquet", f"{files} files x {rows:,} rows x {tokens} tokens, window {window}, "
                        f"batch {bs}", files * rows, bs, make,
                        lambda d: seqloader.BlockShuffleSampler(d, window=window, seed=0),
                        limit=6.0 if opts.quick else LIMIT, collate_fn=default_convert,
                        torch_data=RowIndex(sorted(os.path.join(folder, f) for f in os.listdir(folder)), window))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def autotune_tar(opts: Options) -> list[Row]:
    """Tar shards of JPEGs decoded by ``seqloader.ImageDecoder()`` (simplejpeg when installed: the GIL released)."""
    shards, per, side, bs, copies = (4, 64, 160, 64, 1) if opts.quick else (16, 500, 160, 64, 8)
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        folder = os.path.join(tmp, "shards")
        write_jpeg_shards(folder, shards, per, side)
        _copies(folder, copies)
        shards *= copies
        src = seqloader.tar_shards(folder, transform=DecodeSample(seqloader.ImageDecoder("auto")))
        ends = np.cumsum([per] * shards)
        return _compare("autotune_tar", f"{shards} shards x {per} JPEGs {side}x{side}, ImageDecoder, batch {bs}",
                        shards * per, bs, lambda *a: src,
                        lambda d: seqloader.BlockShuffleSampler(d, blocks=ends, window=2, seed=0, lanes=2, chunk=bs),
                        limit=6.0 if opts.quick else LIMIT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: Workload name -> function(Options) -> rows.
AUTOTUNE_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "autotune_latency": autotune_latency,
    "autotune_python": autotune_python,
    "autotune_parquet": autotune_parquet,
    "autotune_tar": autotune_tar,
}
