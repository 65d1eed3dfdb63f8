"""Thread workers against worker processes (issue 28): the same loader on each executor, and the anchors.

Each workload runs seqloader's executors (``worker_method="thread"``, worker processes, threads
inside worker processes with ``threads_per_worker``, ``num_workers=0``) on the same data, with the
baselines of issue 28, interleaved (``best_of``) so that the machine's load hits every row alike.
``ratio`` is over torch's ``DataLoader`` on the same data unless the notes name another base;
*CPU-s* (Parquet, tar) is the least CPU time an epoch used, this process's threads and its worker
processes together: the machine's load disturbs it less than the wall clock; *cores busy*
(``threads_tiny``) is that CPU time over the epoch's seconds.

* ``threads_parquet``: 20 Parquet files of 5 row groups (100 in all), 512 int32 tokens a row
  (``list<int32>``), batch 64, a block shuffle (``BlockShuffleSampler(src)``: ``window=8``), as the
  docs build it: ``parquet(columnar=True)`` with its default ``cache_blocks`` (sized by the
  loader). A one-process pyarrow scan (``iter_batches(64)`` to tensors, file order), torch's
  ``DataLoader`` over a map-style row index (the ratio base, 2 workers, the same sampler),
  seqloader's ``parquet(columnar=True)`` (a batch is a dict holding a ``(64, 512)`` tensor) on 0
  workers, 2 processes, 2 threads and 2 processes x 2 threads, and an SPDL pipeline over the row
  groups (one process, 2 threads). The timed epochs use ``collate_fn=default_convert`` (the docs'
  collate: no user code, so the loader skips seeding the global RNGs per batch). *bytes decoded /
  dataset*: Arrow bytes of the row groups decoded in all processes, over the dataset's, counted in
  one more epoch per executor, untimed, whose collate returns each process's counter. A last row
  measures the Python a columnar batch costs beyond its gather, in one thread, and the loader's
  own work per batch.
* ``threads_tar``: tar shards of 160x160 JPEGs, batch 64, 2 workers, a block shuffle
  (``window=2``), decoded by ``seqloader.ImageDecoder("auto")`` (simplejpeg, which releases the
  GIL, when installed): ``tar_shards`` and a hand-written offset index (``os.pread``) through
  ``seqloader.DataLoader`` on threads, on processes and (``tar_shards``) on 2 processes x 2
  threads and at ``num_workers=0``, torch's ``DataLoader`` over the offset index (the ratio
  base) and ``webdataset``'s ``WebLoader``, all with that decoder; then ``tar_shards`` (threads, processes) and ``webdataset``
  decoding with PIL (issue 28's rows), each compared with the other PIL rows.
* ``threads_memory``: a map-style dataset holding 1.2M ``(path, label)`` pairs, batch 256, 2
  workers, each loader in a fresh subprocess (in this process with ``--quick``): peak PSS of the
  process tree over an epoch and the seconds to the first batch.
* ``threads_tiny``: 200,000 ints, batch 256, at 0 workers (seqloader against torch: the per-batch
  path in the training process) and with 2 workers (the items cost nothing: what is measured
  is each loader's own work per batch), and 4,000 items of ~0.3 ms of pure Python each, batch 64
  (the GIL lets one thread run at a time: where threads lose).
* ``threads_latency``: items that wait 20 ms (``benchmarks.sources.SleepyFiles``), batch 32, 2
  processes: ``threads_per_worker=16`` against Grain (``ReadOptions(num_threads=16)``, 2
  ``mp_prefetch`` workers; the ratio base; not with ``--quick``), and 32 thread workers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, default_convert

import seqloader
from benchmarks.common import IntDataset, Options, Row, best_of
from benchmarks.threads_data import (DecodeSample, PathLabels, PssSampler, PythonItems, RowIndex, TarIndex, decode_jpeg,
                                     read_tokens, with_cpu, write_jpeg_shards, write_token_files)

__all__ = ["THREADS_WORKLOADS", "threads_latency", "threads_memory", "threads_parquet", "threads_tar",
           "threads_tiny"]

BATCH = 64
#: (label, num_workers, worker_method, threads_per_worker): seqloader's executors, in row order.
EXECUTORS = [("seqloader, 0 workers", 0, "multiprocessing", 1), ("seqloader, processes", 2, "multiprocessing", 1),
             ("seqloader, threads", 2, "thread", 1), ("seqloader, 2 processes x 2 threads", 2, "multiprocessing", 2)]


def _loader(dataset: Any, sampler: Any, num_workers: int, method: str, threads: int, **kw: Any) -> Any:
    extra = {} if num_workers == 0 else {"worker_method": method}
    if threads > 1:
        extra["threads_per_worker"] = threads
    return seqloader.DataLoader(dataset, batch_size=kw.pop("batch_size", BATCH), sampler=sampler,
                                num_workers=num_workers, seed=0, **extra, **kw)


def _epoch(make: Callable[[], Any]) -> float:
    """Seconds to build an iterable with ``make()`` and read it to its end."""
    t0 = time.perf_counter()
    for _ in make():
        pass
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- Parquet


def _scan(paths: list[str]) -> float:
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    for path in paths:
        for rb in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            col = rb.column("tokens")
            torch.from_numpy(col.flatten().to_numpy().reshape(len(col), -1).copy())
    return time.perf_counter() - t0


def _spdl(groups: list[tuple[str, int]], order: list[int]) -> float:
    from spdl.pipeline import PipelineBuilder

    def split(rows: np.ndarray) -> list[torch.Tensor]:
        return [torch.from_numpy(rows[i:i + BATCH].copy()) for i in range(0, len(rows), BATCH)]

    t0 = time.perf_counter()
    pipeline = (PipelineBuilder().add_source([groups[k] for k in order])
                .pipe(lambda group: read_tokens(*group), concurrency=2).pipe(split).disaggregate()
                .add_sink(8).build(num_threads=2))
    with pipeline.auto_stop():
        for _ in pipeline:
            pass
    return time.perf_counter() - t0


def _python_per_batch(folder: str, n: int) -> tuple[float, float, float]:
    """Microseconds per batch, in one thread, all row groups decoded: ``__getitems__`` of a
    columnar source beyond its gather (the ``numpy.take`` of the same rows into a reused array),
    the gather itself, and the loader's own work per batch at ``num_workers=0`` (its epoch over
    the decoded source, less the ``__getitems__`` and ``default_convert`` of its batches)."""
    src = seqloader.parquet(folder, columnar=True)
    src.size_cache(len(src.blocks()))   # (every row group kept: what is timed is the Python, not the decode)
    sampler = seqloader.BlockShuffleSampler(src, seed=0, lanes=1, chunk=BATCH)
    order = np.fromiter(iter(sampler), dtype=np.int64, count=n)
    batches = [order[i:i + BATCH].tolist() for i in range(0, n - BATCH + 1, BATCH)]
    for b in batches:
        src.__getitems__(b)
    slots = src._slots.get()   # (the benchmark looks inside: the same buffers and positions)
    blocks_rows = [src._index.locate(b) for b in batches]
    buf = slots._buffers["tokens"]
    index = [slots._base[blocks] + rows for blocks, rows in blocks_rows]
    out = np.empty((BATCH, buf.shape[1]), buf.dtype)

    def best(f: Callable[[], None]) -> float:
        return min(_seconds(f) for _ in range(5)) / len(batches) * 1e6

    def getitems() -> None:
        for b in batches:
            default_convert(src.__getitems__(b))

    def takes() -> None:
        for i in index:
            np.take(buf, i, axis=0, out=out, mode="clip")

    def after_first() -> float:   # (the epoch's set-up, fingerprints included, is not per batch)
        it = iter(seqloader.DataLoader(src, batch_size=BATCH, sampler=sampler, num_workers=0, seed=0,
                                       collate_fn=default_convert))
        next(it)
        t0 = time.perf_counter()
        for _ in it:
            pass
        return (time.perf_counter() - t0) / (len(batches) - 1) * 1e6

    source, take = best(getitems), best(takes)
    loader = min(after_first() for _ in range(5))
    return source - take, take, loader - source


def _seconds(f: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def threads_parquet(opts: Options) -> list[Row]:
    """A block-shuffled Parquet epoch of token rows on every executor, against pyarrow, torch and SPDL,
    as the docs build it: ``parquet(columnar=True)`` and ``BlockShuffleSampler(src)``, their defaults."""
    files, rows, groups, tokens = (20, 128, 2, 512) if opts.quick else (20, 4100, 5, 512)
    window = 8   # BlockShuffleSampler's default (the torch baseline's sampler and LRU take it by hand)
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    decoded: dict[str, float] = {}
    caches: dict[str, int] = {}
    try:
        folder = os.path.join(tmp, "tokens")
        write_token_files(folder, files, rows, tokens, groups)
        paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
        probe = seqloader.parquet(folder)
        total = sum(probe._read_blocks([b])[0].nbytes for b in range(len(probe.blocks())))  # what the counters count
        n = files * rows

        def seq(label: str, num_workers: int, method: str, threads: int) -> float:
            src = seqloader.parquet(folder, columnar=True)        # the defaults: the loader sizes the cache
            sampler = seqloader.BlockShuffleSampler(src, seed=0)
            t0 = time.perf_counter()
            for _ in _loader(src, sampler, num_workers, method, threads, collate_fn=default_convert):
                pass
            dt = time.perf_counter() - t0
            caches[label] = src.cache_blocks
            return dt

        def count_decoded(label: str, num_workers: int, method: str, threads: int) -> None:
            """Bytes decoded in an epoch like ``seq``'s, untimed: a collate of its own (user code,
            which keeps the per-batch seeding) returns each process's counter with the batch."""
            src = seqloader.parquet(folder, columnar=True)
            seen: dict[int, int] = {}

            def collate(batch: dict) -> tuple:   # (the batch, and its process's decoded bytes so far)
                return default_convert(batch), os.getpid(), src.counters()["bytes_decoded"]

            for _, pid, nbytes in _loader(src, seqloader.BlockShuffleSampler(src, seed=0), num_workers, method,
                                          threads, collate_fn=collate):
                seen[pid] = max(seen.get(pid, 0), nbytes)
            decoded[label] = sum(seen.values()) / total

        def torch_epoch() -> float:
            ds = RowIndex(paths, cache_blocks=window)
            sampler = seqloader.BlockShuffleSampler(ds, window=window, seed=0, lanes=2, chunk=BATCH)
            t0 = time.perf_counter()
            for _ in DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2):
                pass
            return time.perf_counter() - t0

        where = [(p, g) for p in paths for g in range(groups)]
        order = np.random.default_rng(0).permutation(len(where)).tolist()
        runs: dict[str, Callable[[], float]] = {"scan": lambda: _scan(paths), "torch": torch_epoch}
        for label, w, method, threads in EXECUTORS:
            runs[label] = lambda label=label, w=w, method=method, threads=threads: seq(label, w, method, threads)
        if importlib.util.find_spec("spdl") is not None:   # (the bench extra; a smoke test goes without)
            runs["spdl"] = lambda: _spdl(where, order)
        cpu: dict[str, float] = {}
        best = best_of(opts.repeat, with_cpu(runs, cpu))
        for label, w, method, threads in EXECUTORS:
            count_decoded(label, w, method, threads)
        python, gather, loader_work = _python_per_batch(folder, n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = total / 1e6
    size = (f"{files} files x {rows:,} rows ({files * groups} row groups) x {tokens} int32 tokens, {mb:.0f} MB "
            f"decoded, batch {BATCH}")
    scan, base = best["scan"], best["torch"]
    spdl = best.get("spdl")

    def row(label: str, key: str, workers: int, notes: str) -> Row:
        t = best[key]
        vs_spdl = f"{spdl / t:.2f}x SPDL; " if spdl and key != "spdl" else ""
        return Row("threads_parquet", label, workers, n / t, "rows/s", mb / t, ratio=base / t,
                   notes=f"{scan / t:.2f}x the pyarrow scan ({cpu[key]:.2f} CPU-s); {vs_spdl}{notes}")

    out = [Row("threads_parquet", "pyarrow scan: iter_batches(64) -> tensors", 0, n / scan, "rows/s", mb / scan,
               ratio=base / scan, notes=f"{size}; one process, file order: the 'x the pyarrow scan' base "
                                        f"({cpu['scan']:.2f} CPU-s)"),
           Row("threads_parquet", "torch DataLoader over a map-style row index", 2, n / base, "rows/s", mb / base,
               notes=f"the ratio base ({cpu['torch']:.2f} CPU-s); BlockShuffleSampler(window={window}, lanes=2), an "
                     f"LRU of {window} row groups per worker, a row per __getitem__")]
    for label, w, method, threads in EXECUTORS:
        out.append(row(label, label, w, f"bytes decoded / dataset {decoded[label]:.2f}; the defaults "
                                        f"(cache_blocks sized by the loader: {caches[label]})"))
    if spdl:
        out.append(row("SPDL pipeline over the row groups, 2 threads", "spdl", 2,
                       "one process; row groups in a shuffled order, rows in file order"))
    out.append(Row("threads_parquet", "seqloader columnar batch: Python per batch beyond the gather", 0, python,
                   "us", notes=f"one thread, row groups decoded: __getitems__ + default_convert less the gather "
                               f"(one numpy.take into a reused array: {gather:.1f} us); the loader's own work per "
                               f"batch at num_workers=0: {loader_work:.1f} us more"))
    return out


# --------------------------------------------------------------------------- tar shards of JPEGs


def _wds(urls: list[str], decode: Callable[[dict], Any]) -> float:
    import webdataset as wds

    t0 = time.perf_counter()
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(decode).batched(BATCH)
    for _ in wds.WebLoader(ds, batch_size=None, num_workers=2):
        pass
    return time.perf_counter() - t0


def threads_tar(opts: Options) -> list[Row]:
    """Tar shards of JPEGs decoded with ``seqloader.ImageDecoder`` (simplejpeg when installed):
    tar_shards and an offset index on threads, processes and threads inside processes, against
    torch and webdataset with the same decoder; and tar_shards and webdataset decoding with PIL."""
    shards, per, side = (2, 32, 160) if opts.quick else (8, 250, 160)
    fast = DecodeSample(seqloader.ImageDecoder("auto"))   # what every row but the PIL ones decodes with
    jpeg = fast.decode.jpeg
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        folder = os.path.join(tmp, "shards")
        urls = write_jpeg_shards(folder, shards, per, side)
        src = seqloader.tar_shards(folder, transform=fast)   # every index built before timing
        src_pil = seqloader.tar_shards(folder, transform=decode_jpeg)
        index = TarIndex(urls, fast)
        ends = np.cumsum([per] * shards)

        def sampler(data: Any) -> Any:
            return seqloader.BlockShuffleSampler(data, blocks=ends, window=2, seed=0, lanes=2, chunk=BATCH)

        def tar(data: Any, method: str, threads: int = 1) -> Any:
            return _loader(data, sampler(data), 2, method, threads)

        runs: dict[str, Callable[[], float]] = {
            "torch": lambda: _epoch(lambda: DataLoader(index, batch_size=BATCH, sampler=sampler(index), num_workers=2)),
            "tar-processes": lambda: _epoch(lambda: tar(src, "multiprocessing")),
            "tar-threads": lambda: _epoch(lambda: tar(src, "thread")),
            "tar-zero": lambda: _epoch(lambda: _loader(src, sampler(src), 0, "thread", 1)),
            "tar-inside": lambda: _epoch(lambda: tar(src, "multiprocessing", 2)),
            "index-processes": lambda: _epoch(lambda: tar(index, "multiprocessing")),
            "index-threads": lambda: _epoch(lambda: tar(index, "thread")),
            "tar-threads-pil": lambda: _epoch(lambda: tar(src_pil, "thread")),
            "tar-processes-pil": lambda: _epoch(lambda: tar(src_pil, "multiprocessing"))}
        try:
            import webdataset  # noqa: F401

            runs["webdataset"] = lambda: _wds(urls, fast)
            runs["webdataset-pil"] = lambda: _wds(urls, decode_jpeg)
        except ImportError:
            pass
        cpu: dict[str, float] = {}
        best = best_of(opts.repeat, with_cpu(runs, cpu))
        mb = sum(os.path.getsize(u) for u in urls) / 1e6
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n, base = shards * per, best["torch"]
    wds_t, wds_pil = best.get("webdataset"), best.get("webdataset-pil")

    def row(label: str, key: str, notes: str, workers: int = 2) -> Row:
        t = best[key]
        against = wds_pil if key.endswith("-pil") else wds_t
        vs_wds = f"{against / t:.2f}x webdataset; " if against else ""
        return Row("threads_tar", label, workers, n / t, "samples/s", mb / t, ratio=base / t,
                   notes=f"{vs_wds}{notes}; {cpu[key]:.2f} CPU-s")

    size = f"{shards} shards x {per} JPEGs {side}x{side} ({mb:.0f} MB), decoded by {fast.decode!r}, batch {BATCH}"
    out = [row("seqloader.tar_shards, threads", "tar-threads",
               f"{best['tar-zero'] / best['tar-threads']:.2f}x num_workers=0; "
               f"{best['tar-processes'] / best['tar-threads']:.2f}x tar_shards on processes; "
               f"{best['tar-threads-pil'] / best['tar-threads']:.2f}x itself decoding with PIL; "
               f"{best['index-threads'] / best['tar-threads']:.2f}x the offset index on threads"),
           row("seqloader.tar_shards, processes", "tar-processes",
               f"{best['index-processes'] / best['tar-processes']:.2f}x the offset index on processes"),
           row("seqloader.tar_shards, 2 processes x 2 threads", "tar-inside", "threads_per_worker=2"),
           row("seqloader.tar_shards, num_workers=0", "tar-zero", "the same pipeline in the training thread", 0),
           row("offset index (os.pread) through seqloader.DataLoader, threads", "index-threads", "hand-written"),
           row("offset index (os.pread) through seqloader.DataLoader, processes", "index-processes", "hand-written"),
           Row("threads_tar", "torch DataLoader over the offset index", 2, n / base, "samples/s", mb / base,
               notes=f"{size}; the ratio base; every row: BlockShuffleSampler(window=2, lanes=2) over the shards; "
                     f"{cpu['torch']:.2f} CPU-s")]
    if wds_t:
        out.append(Row("threads_tar", "webdataset WebLoader", 2, n / wds_t, "samples/s", mb / wds_t, ratio=base / wds_t,
                       notes=f"shards split between the 2 workers, file order, webdataset's batched(64), "
                             f"the same decoder ({jpeg}); {cpu['webdataset']:.2f} CPU-s"))
    out += [row("seqloader.tar_shards, threads, PIL decode", "tar-threads-pil",
                f"{best['tar-processes-pil'] / best['tar-threads-pil']:.2f}x tar_shards on processes with PIL"),
            row("seqloader.tar_shards, processes, PIL decode", "tar-processes-pil", "PIL")]
    if wds_pil:
        out.append(Row("threads_tar", "webdataset WebLoader, PIL decode", 2, n / wds_pil, "samples/s", mb / wds_pil,
                       ratio=base / wds_pil, notes=f"issue 28's base; {cpu['webdataset-pil']:.2f} CPU-s"))
    return out


# --------------------------------------------------------------------------- memory


def memory_child(loader: str, n: int) -> dict:
    """In a fresh process: build :class:`PathLabels` of ``n``, read one epoch (batch 256, 2 workers)
    with ``loader`` (``"thread"``, ``"process"`` or ``"torch"``); peak PSS, first batch, epoch."""
    torch.set_num_threads(1)
    data = PathLabels(n)
    with PssSampler() as pss:
        t0 = time.perf_counter()
        if loader == "torch":
            made = DataLoader(data, batch_size=256, shuffle=True, num_workers=2)
        else:
            made = seqloader.DataLoader(data, batch_size=256, shuffle=True, num_workers=2, seed=0,
                                        worker_method="thread" if loader == "thread" else "multiprocessing")
        it = iter(made)
        next(it)
        first = time.perf_counter() - t0
        for _ in it:
            pass
        epoch = time.perf_counter() - t0
        del it, made
    return {"pss": pss.peak, "first": first, "epoch": epoch}


_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _memory_in_subprocess(loader: str, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))
    code = f"import json; from benchmarks.threads import memory_child; print(json.dumps(memory_child({loader!r}, {n})))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def threads_memory(opts: Options) -> list[Row]:
    """Peak PSS and first batch of 1.2M (path, label) pairs, threads against processes (and torch)."""
    n = 120_000 if opts.quick else 1_200_000
    measure = (lambda k: memory_child(k, n)) if opts.quick else (lambda k: _memory_in_subprocess(k, n))
    results: dict[str, list[dict]] = {k: [] for k in ("thread", "process", "torch")}
    for _ in range(opts.repeat):
        for k in results:
            results[k].append(measure(k))
    pss = {k: min(r["pss"] for r in v) for k, v in results.items()}
    first = {k: min(r["first"] for r in v) for k, v in results.items()}
    names = {"thread": "seqloader, threads", "process": "seqloader, processes", "torch": "torch DataLoader"}
    out = []
    for k in ("thread", "process", "torch"):
        extra = f"{pss['thread'] / pss['process']:.2f}x the processes' PSS (goal <= 0.6); " if k == "thread" else ""
        out.append(Row("threads_memory", f"{names[k]}: peak PSS", 2, pss[k] / 2**20, "MiB",
                       ratio=None if k == "torch" else pss["torch"] / pss[k],
                       notes=f"{extra}{n:,} (path, label) pairs, batch 256, main process + workers, "
                             + ("this process (--quick)" if opts.quick else "fresh process")))
    for k in ("thread", "process", "torch"):
        out.append(Row("threads_memory", f"{names[k]}: first batch", 2, first[k], "s",
                       ratio=None if k == "torch" else first["torch"] / first[k],
                       notes="from building the loader (dataset built) to the first batch"
                             + ("; goal <= 0.3 s" if k == "thread" else "")))
    return out


# --------------------------------------------------------------------------- GIL-bound and latency-bound


def threads_tiny(opts: Options) -> list[Row]:
    """200,000 ints, batch 256, 2 workers (and 4,000 items of pure Python work, batch 64):
    threads against processes and torch, where the GIL decides."""
    tiny, heavy = (IntDataset(5_000), PythonItems(200)) if opts.quick else (IntDataset(200_000), PythonItems(4_000))

    runs: dict[str, Callable[[], float]] = {}
    for name, data, bs in (("tiny", tiny, 256), ("python", heavy, 64)):
        runs[f"{name}-threads"] = lambda d=data, b=bs: _epoch(lambda: _loader(d, None, 2, "thread", 1, batch_size=b,
                                                                               shuffle=True))
        runs[f"{name}-processes"] = lambda d=data, b=bs: _epoch(lambda: _loader(d, None, 2, "multiprocessing", 1,
                                                                                 batch_size=b, shuffle=True))
        runs[f"{name}-torch"] = lambda d=data, b=bs: _epoch(lambda: DataLoader(d, batch_size=b, shuffle=True,
                                                                               num_workers=2))
    # num_workers=0 on the ints, in the same run (issue 37: the per-batch path in the training process)
    runs["tiny-zero"] = lambda: _epoch(lambda: _loader(tiny, None, 0, "multiprocessing", 1, batch_size=256, shuffle=True))
    runs["tiny-torch-zero"] = lambda: _epoch(lambda: DataLoader(tiny, batch_size=256, shuffle=True, num_workers=0))
    cpu: dict[str, float] = {}
    best = best_of(opts.repeat, with_cpu(runs, cpu))
    out = []
    zero, torch_zero = best["tiny-zero"], best["tiny-torch-zero"]
    out += [Row("threads_tiny", "seqloader, 0 workers", 0, len(tiny) / zero, "samples/s", ratio=torch_zero / zero,
                notes=f"ratio: over torch at 0 workers; {cpu['tiny-zero']:.3f} CPU-s "
                      f"({cpu['tiny-torch-zero'] / cpu['tiny-zero']:.2f}x torch's CPU)"),
            Row("threads_tiny", "torch DataLoader, 0 workers", 0, len(tiny) / torch_zero, "samples/s",
                notes=f"{len(tiny):,} ints, batch 256; {cpu['tiny-torch-zero']:.3f} CPU-s")]
    for name, data, what in (("tiny", tiny, f"{len(tiny):,} ints, batch 256"),
                             ("python", heavy, f"{len(heavy):,} items of ~0.3 ms of pure Python, batch 64")):
        n, t, p, base = len(data), best[f"{name}-threads"], best[f"{name}-processes"], best[f"{name}-torch"]
        label = "" if name == "tiny" else " (Python items)"
        busy = {k: cpu[f"{name}-{k}"] / best[f"{name}-{k}"] for k in ("threads", "processes", "torch")}
        out += [Row("threads_tiny", f"seqloader, threads{label}", 2, n / t, "samples/s", ratio=base / t,
                    notes=f"{p / t:.2f}x seqloader's processes; {busy['threads']:.2f} cores busy; "
                          f"{cpu[f'{name}-threads']:.3f} CPU-s"),
                Row("threads_tiny", f"seqloader, processes{label}", 2, n / p, "samples/s", ratio=base / p,
                    notes=f"{busy['processes']:.2f} cores busy; {cpu[f'{name}-processes']:.3f} CPU-s"),
                Row("threads_tiny", f"torch DataLoader{label}", 2, n / base, "samples/s",
                    notes=f"{what}; {busy['torch']:.2f} cores busy; {cpu[f'{name}-torch']:.3f} CPU-s")]
    return out


def threads_latency(opts: Options) -> list[Row]:
    """Items that wait 20 ms: 2 processes x 16 threads against Grain's 2 processes x 16 read threads."""
    from benchmarks.sources import SleepyFiles, _grain_batches, _steady

    n, bs = (256, 32) if opts.quick else (3_840, 32)
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        paths = []
        for i in range(n):
            paths.append(os.path.join(tmp, f"{i:05d}.bin"))
            with open(paths[-1], "wb") as f:
                f.write(os.urandom(1024))
        data = SleepyFiles(paths)
        runs = {"inside": lambda: _steady(_loader(data, None, 2, "multiprocessing", 16, batch_size=bs, shuffle=True,
                                                  collate_fn=list)),
                "threads": lambda: _steady(_loader(data, None, 32, "thread", 1, batch_size=bs, shuffle=True,
                                                   collate_fn=list))}
        try:
            import grain  # noqa: F401

            if not opts.quick:   # (its spawned workers take seconds to start: not in a smoke test)
                runs["grain"] = lambda: _steady(_grain_batches(paths, bs))
        except ImportError:
            pass
        results = {k: [f() for _ in range(opts.repeat)] for k, f in runs.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    steady = {k: max(r[1] for r in v) for k, v in results.items()}
    total = {k: min(r[0] for r in v) for k, v in results.items()}
    grain = steady.get("grain")

    def ratio(k: str) -> float | None:
        return None if grain is None else steady[k] / grain

    common = f"{n:,} items, 20 ms each, batch {bs}; rate after the first batch"
    out = [Row("threads_latency", "seqloader, 2 processes x 16 threads", 2, steady["inside"], "samples/s",
               ratio=ratio("inside"), notes=f"ratio: over Grain (goal >= 1.5); {common}; "
                                            f"{n / total['inside']:,.0f}/s with start-up"),
           Row("threads_latency", "seqloader, 32 threads", 32, steady["threads"], "samples/s", ratio=ratio("threads"),
               notes=f"ratio: over Grain; {n / total['threads']:,.0f}/s with start-up")]
    if grain is not None:
        out.append(Row("threads_latency", "Grain, 2 mp_prefetch workers x ReadOptions(num_threads=16)", 2, grain,
                       "samples/s",
                       notes=f"the ratio base; {n / total['grain']:,.0f}/s with start-up (spawned workers)"))
    return out


#: Workload name -> function(Options) -> rows.
THREADS_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "threads_parquet": threads_parquet,
    "threads_tar": threads_tar,
    "threads_memory": threads_memory,
    "threads_tiny": threads_tiny,
    "threads_latency": threads_latency,
}
