"""Source workloads: data in files read through ``seqloader.parquet``, ``tar_shards`` and ``image_folder``.

Each workload writes its files into a temporary folder (removed afterwards); sizes shrink with
``--quick``. The ``ratio`` column compares with the baseline named in each row's notes (higher
is better): a single-process pyarrow scan, the ``webdataset`` package's own loader, torch's
``DataLoader``, or Grain.

* ``sources_parquet``: Parquet files (an int64 id, an int32 label, a 32-float embedding), batch
  256, columnar batches (``collate_fn=default_convert``). An epoch in block-shuffled order
  (``window=4``; with 2 workers ``lanes=2, chunk=256``, so that each worker decodes its own row
  groups) against pyarrow reading the same files sequentially, bare (``read_row_group``) and as
  the same batches of tensors (``iter_batches``); a full shuffle, timed on its first batches
  and reported per epoch. ``bytes decoded / dataset``: Arrow bytes of the row groups decoded over
  the epoch, divided by the dataset's (measured in the process at 0 workers; with workers,
  simulated with ``seqloader.orders.block_quality.bytes_read_ratio`` for the same order).
* ``sources_tar``: tar shards of samples ``{bin: 8 KiB, cls}``; one epoch, 2 workers, batch 64,
  block-shuffled, against ``webdataset.WebDataset`` + ``WebLoader`` (2 workers, shards split
  between them); resuming into the middle of 1,000 small shards with their index cached: the
  seconds from building the source to the first batch.
* ``sources_index``: building the index of 1,000 Parquet files (footers) and of 1,000 tar shards
  (one pass each), local and on an S3-compatible server on localhost (moto), 16 threads.
* ``sources_latency``: files whose every read waits 20 ms (a local fsspec filesystem that sleeps
  in ``cat_file``), batch 32, 2 worker processes: ``image_folder`` over it (16 threads per
  worker) against torch's ``DataLoader`` and Grain (``ReadOptions(num_threads=16)``, 2
  ``mp_prefetch`` workers) on a dataset whose ``__getitem__`` sleeps 20 ms and reads the file.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
import time
from typing import Callable

import numpy as np
import torch
from torch.utils.data import default_convert

import seqloader
from benchmarks.common import Options, Row, best_of

__all__ = ["SOURCE_WORKLOADS", "sources_index", "sources_latency", "sources_parquet", "sources_tar"]

LATENCY_S = 0.02


# --------------------------------------------------------------------------- files


def _write_parquet(folder: str, files: int, groups: int, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for f in range(files):
        start = f * groups * rows
        with pq.ParquetWriter(os.path.join(folder, f"part-{f:05d}.parquet"), _schema()) as w:
            for g in range(groups):
                i = np.arange(start + g * rows, start + (g + 1) * rows)
                emb = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 32, dtype=np.float32)), 32)
                w.write_table(pa.table({"id": i, "label": (i % 1000).astype(np.int32), "emb": emb}, schema=_schema()))


def _schema():
    import pyarrow as pa

    return pa.schema([("id", pa.int64()), ("label", pa.int32()), ("emb", pa.list_(pa.float32(), 32))])


def _write_shards(folder: str, shards: int, per_shard: int, payload: int) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    blob = np.random.default_rng(0).integers(0, 256, payload, dtype=np.uint8).tobytes()
    paths, j = [], 0
    for s in range(shards):
        path = os.path.join(folder, f"shard-{s:06d}.tar")
        with tarfile.open(path, "w") as tf:
            for _ in range(per_shard):
                for ext, data in (("bin", blob), ("cls", str(j % 10).encode())):
                    info = tarfile.TarInfo(f"{j:08d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                j += 1
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- parquet


def _scan_decode(folder: str) -> float:
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    for name in sorted(os.listdir(folder)):
        pf = pq.ParquetFile(os.path.join(folder, name))
        for g in range(pf.num_row_groups):
            pf.read_row_group(g)
    return time.perf_counter() - t0


def _scan_batches(folder: str, batch_size: int) -> float:
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    for name in sorted(os.listdir(folder)):
        for rb in pq.ParquetFile(os.path.join(folder, name)).iter_batches(batch_size=batch_size):
            emb = rb.column("emb")
            {"id": torch.from_numpy(rb.column("id").to_numpy().copy()),
             "label": torch.from_numpy(rb.column("label").to_numpy().copy()),
             "emb": torch.from_numpy(emb.flatten().to_numpy().reshape(len(emb), 32).copy())}
    return time.perf_counter() - t0


def _epoch(loader, limit: int | None = None) -> tuple[float, int]:
    t0, k = time.perf_counter(), 0
    for k, _ in enumerate(loader, 1):
        if limit is not None and k >= limit:
            break
    return time.perf_counter() - t0, k


def sources_parquet(opts: Options) -> list[Row]:
    """A block-shuffled Parquet epoch (0 and 2 workers) and a full shuffle against a pyarrow scan."""
    from seqloader.orders.block_quality import bytes_read_ratio

    files, groups, rows = (2, 4, 2_000) if opts.quick else (8, 8, 20_000)
    window, large = 4, 4096
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        folder = os.path.join(tmp, "pq")
        _write_parquet(folder, files, groups, rows)
        probe = seqloader.parquet(folder, columnar=True, cache_blocks=window)
        n, ends = len(probe), probe.blocks()
        total = sum(probe._read_blocks([b])[0].nbytes for b in range(len(ends)))
        mb = total / 1e6
        bytes_ratio: dict[str, float] = {}

        def block_epoch(num_workers: int, bs: int) -> float:
            src = seqloader.parquet(folder, columnar=True, cache_blocks=window)
            sampler = seqloader.BlockShuffleSampler(src, window=window, seed=0)  # lanes, chunk: the loader's
            loader = seqloader.DataLoader(src, batch_size=bs, sampler=sampler, num_workers=num_workers,
                                          collate_fn=default_convert, seed=0)
            order = np.asarray(sampler.order(0).lookup(np.arange(n, dtype=np.int64)))
            dt, _ = _epoch(loader)
            key = f"block{num_workers}-{bs}"
            if num_workers == 0:
                bytes_ratio[key] = src.counters()["bytes_decoded"] / total
            else:
                bytes_ratio[key] = bytes_read_ratio(order, ends, batch_size=bs, num_workers=num_workers,
                                                    cache_blocks=window, block_bytes=np.diff(ends, prepend=0) * (total / n))
            return dt

        def full_shuffle() -> float:
            src = seqloader.parquet(folder, columnar=True, cache_blocks=8)
            loader = seqloader.DataLoader(src, batch_size=256, shuffle=True, num_workers=0,
                                          collate_fn=default_convert, seed=0)
            limit = 5 if opts.quick else 20
            dt, k = _epoch(loader, limit=limit)
            bytes_ratio["full"] = src.counters()["bytes_decoded"] / total * len(loader) / k
            return dt * len(loader) / k

        best = best_of(opts.repeat, {
            "decode": lambda: _scan_decode(folder), "scan-256": lambda: _scan_batches(folder, 256),
            "scan-4096": lambda: _scan_batches(folder, large),
            "block0-256": lambda: block_epoch(0, 256), "block2-256": lambda: block_epoch(2, 256),
            "block0-4096": lambda: block_epoch(0, large), "full": full_shuffle})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = f"{files} files x {groups} row groups x {rows:,} rows, {mb:.0f} MB decoded"
    out = [Row("sources_parquet", "pyarrow scan: read_row_group", 0, n / best["decode"], "rows/s", mb / best["decode"],
               notes=f"{size}; bare decode, no batches")]
    for bs in (256, large):
        scan = best[f"scan-{bs}"]
        out.append(Row("sources_parquet", f"pyarrow scan: iter_batches({bs}) -> tensors", 0, n / scan, "rows/s",
                       mb / scan, notes=f"the baseline of the batch-{bs} ratios: the same batches, file order"))
        for w in ((0, 2) if bs == 256 else (0,)):
            t = best[f"block{w}-{bs}"]
            out.append(Row("sources_parquet", f"seqloader.parquet, block_shuffle(window={window}), batch {bs}", w,
                           n / t, "rows/s", mb / t, ratio=scan / t,
                           notes=f"bytes decoded / dataset {bytes_ratio[f'block{w}-{bs}']:.2f}"
                                 + ("" if w == 0 else f" (simulated; lanes={w}, chunk={bs})")))
    out.append(Row("sources_parquet", "seqloader.parquet, shuffle=True, batch 256", 0, n / best["full"], "rows/s",
                   mb / best["full"], ratio=best["scan-256"] / best["full"],
                   notes=f"first batches timed, per epoch; bytes decoded / dataset {bytes_ratio['full']:.0f} "
                         "(cache_blocks=8)"))
    return out


# --------------------------------------------------------------------------- tar shards


def _tar_decode(sample: dict) -> tuple[int, int]:
    return len(sample["bin"]), int(sample["cls"])


def _wds_epoch(urls: list[str], bs: int) -> tuple[float, int]:
    import webdataset as wds

    t0 = time.perf_counter()
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_tar_decode).batched(bs)
    k = 0
    for b in wds.WebLoader(ds, batch_size=None, num_workers=2):
        k += len(b[0])
    return time.perf_counter() - t0, k


def _tar_epoch(folder: str, bs: int, window: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    src = seqloader.tar_shards(folder, transform=_tar_decode)
    sampler = seqloader.BlockShuffleSampler(src, window=window, seed=0)
    k = 0
    for b in seqloader.DataLoader(src, batch_size=bs, sampler=sampler, num_workers=2, seed=0):
        k += len(b[0])
    return time.perf_counter() - t0, k


def _resume_first_batch(folder: str, bs: int) -> tuple[float, float]:
    """(seconds to the first batch of a resume at the middle, seconds to build the cache)."""
    t0 = time.perf_counter()
    src = seqloader.tar_shards(folder, transform=_tar_decode)
    built = time.perf_counter() - t0
    loader = seqloader.DataLoader(src, batch_size=bs, shuffle=True, seed=0, num_workers=2)
    it = iter(loader)
    for _ in range(len(loader) // 2):
        next(it)
    state = loader.state_dict()
    del it
    t0 = time.perf_counter()
    src = seqloader.tar_shards(folder, transform=_tar_decode)
    resumed = seqloader.DataLoader(src, batch_size=bs, shuffle=True, seed=0, num_workers=2)
    resumed.load_state_dict(state)
    next(iter(resumed))
    return time.perf_counter() - t0, built


def sources_tar(opts: Options) -> list[Row]:
    """A tar-shard epoch against webdataset's loader; resuming into the middle of 1,000 shards."""
    shards, per, payload = (4, 50, 8192) if opts.quick else (32, 500, 8192)
    bs = 64
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    rows_out = []
    try:
        urls = _write_shards(os.path.join(tmp, "shards"), shards, per, payload)
        seqloader.tar_shards(os.path.join(tmp, "shards"))   # the index, cached before timing
        n, mb = shards * per, shards * per * payload / 1e6
        runs: dict[str, Callable[[], float]] = {"seqloader": lambda: _tar_epoch(os.path.join(tmp, "shards"), bs, 2)[0]}
        try:
            import webdataset  # noqa: F401

            runs["webdataset"] = lambda: _wds_epoch(urls, bs)[0]
        except ImportError:
            pass
        best = best_of(opts.repeat, runs)
        ratio = best["webdataset"] / best["seqloader"] if "webdataset" in best else None
        size = f"{shards} shards x {per} samples of {payload // 1024} KiB"
        rows_out.append(Row("sources_tar", "seqloader.tar_shards, block_shuffle(window=2)", 2, n / best["seqloader"],
                            "samples/s", mb / best["seqloader"], ratio=ratio,
                            notes=f"{size}; ratio: over webdataset" if ratio else f"{size}; webdataset not installed"))
        if "webdataset" in best:
            rows_out.append(Row("sources_tar", "webdataset WebLoader", 2, n / best["webdataset"], "samples/s",
                                mb / best["webdataset"], notes="shards split between the 2 workers, file order"))
        many = 40 if opts.quick else 1_000
        _write_shards(os.path.join(tmp, "many"), many, 10, 256)
        first, built = _resume_first_batch(os.path.join(tmp, "many"), bs)
        rows_out.append(Row("sources_tar", "seqloader resume: first batch", 2, first, "s",
                            notes=f"{many:,} shards x 10 samples, index cached (building it took {built:.2f} s); "
                                  "middle of the epoch"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows_out


# --------------------------------------------------------------------------- index building


class _S3Server:
    """moto's S3 server on a free localhost port (``with`` starts and stops it)."""

    def __enter__(self) -> dict:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="x",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        return {"endpoint_url": url, "key": "x", "secret": "x", "skip_instance_cache": True}

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def sources_index(opts: Options) -> list[Row]:
    """Index building for 1,000 Parquet files and 1,000 tar shards, local and on a localhost S3 server."""
    count = 20 if opts.quick else 1_000
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    out = []
    try:
        pq_dir, tar_dir, cache = os.path.join(tmp, "pq"), os.path.join(tmp, "tar"), os.path.join(tmp, "cache")
        _write_parquet(pq_dir, count, 2, 100)
        _write_shards(tar_dir, count, 10, 256)

        def timed(f: Callable[[], object]) -> float:
            t0 = time.perf_counter()
            f()
            return time.perf_counter() - t0

        def tar_cold(path: str, **kw: object) -> float:
            shutil.rmtree(cache, ignore_errors=True)
            return timed(lambda: seqloader.tar_shards(path, cache_dir=cache, **kw))

        local = best_of(opts.repeat, {
            "parquet": lambda: timed(lambda: seqloader.parquet(pq_dir)),
            "tar": lambda: tar_cold(tar_dir),
            "tar_cached": lambda: timed(lambda: seqloader.tar_shards(tar_dir, cache_dir=cache))})
        remote: dict[str, float] = {}
        try:
            import s3fs

            with _S3Server() as so:
                fs = s3fs.S3FileSystem(**so)
                fs.put(pq_dir + "/", "bench/pq/", recursive=True)
                fs.put(tar_dir + "/", "bench/tar/", recursive=True)
                remote = best_of(opts.repeat, {
                    "parquet": lambda: timed(lambda: seqloader.parquet("s3://bench/pq/", storage_options=so)),
                    "tar": lambda: tar_cold("s3://bench/tar/", storage_options=so),
                    "tar_cached": lambda: timed(lambda: seqloader.tar_shards("s3://bench/tar/", storage_options=so,
                                                                             cache_dir=cache))})
        except ImportError:
            pass
        for where, best in (("local", local), ("S3 (moto, localhost)", remote)):
            for key, what in (("parquet", "Parquet footers"), ("tar", "tar shards, one pass each"),
                              ("tar_cached", "tar shards, index cached")):
                if key in best:
                    out.append(Row("sources_index", f"{what}: {where}", 0, best[key], "s",
                                   notes=f"{count:,} files, 16 threads"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- latency


def _slow_fs_class() -> type:
    from fsspec.implementations.local import LocalFileSystem

    class SlowFileSystem(LocalFileSystem):
        """Local files whose every read (``cat_file``) first waits :data:`LATENCY_S` seconds."""

        protocol = ("slowfile",)

        @classmethod
        def _strip_protocol(cls, path):  # type: ignore[no-untyped-def]
            path = str(path)
            return super()._strip_protocol(path[len("slowfile://"):] if path.startswith("slowfile://") else path)

        def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(LATENCY_S)
            return super().cat_file(path, start=start, end=end, **kwargs)

    return SlowFileSystem


class SleepyFiles:
    """A plain map-style dataset: item ``i`` waits :data:`LATENCY_S` seconds, then reads file ``i``."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        time.sleep(LATENCY_S)
        with open(self.paths[i], "rb") as f:
            return f.read()


def _steady(batches) -> tuple[float, float]:
    """``(seconds for all, items per second after the first batch)`` of an iterable of lists."""
    t0 = time.perf_counter()
    it = iter(batches)
    first = len(next(it))
    t1 = time.perf_counter()
    rest = sum(len(b) for b in it)
    t2 = time.perf_counter()
    del first
    return t2 - t0, rest / (t2 - t1)


def _grain_batches(paths: list[str], bs: int):
    import grain

    return (grain.MapDataset.source(SleepyFiles(paths)).to_iter_dataset(grain.ReadOptions(num_threads=16))
            .batch(bs, batch_fn=list).mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))


def sources_latency(opts: Options) -> list[Row]:
    """Items that wait 20 ms: image_folder over a slow filesystem vs torch and Grain, 2 processes."""
    import fsspec

    fsspec.register_implementation("slowfile", _slow_fs_class(), clobber=True)
    n, bs = (128, 32) if opts.quick else (1_920, 32)
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        paths = []
        for i in range(n):
            os.makedirs(os.path.join(tmp, "img", f"c{i % 4}"), exist_ok=True)
            paths.append(os.path.join(tmp, "img", f"c{i % 4}", f"{i:05d}.bin"))
            with open(paths[-1], "wb") as f:
                f.write(os.urandom(1024))
        paths.sort()
        runs = {
            "seqloader": lambda: _steady(seqloader.DataLoader(
                seqloader.image_folder("slowfile://" + os.path.join(tmp, "img"), extensions=[".bin"], num_threads=16),
                batch_size=bs, shuffle=True, seed=0, num_workers=2, collate_fn=list)),
            "torch": lambda: _steady(torch.utils.data.DataLoader(SleepyFiles(paths), batch_size=bs, shuffle=True,
                                                                 num_workers=2, collate_fn=list))}
        try:
            import grain  # noqa: F401

            runs["grain"] = lambda: _steady(_grain_batches(paths, bs))
        except ImportError:
            pass
        results = {k: [f() for _ in range(opts.repeat)] for k, f in runs.items()}
        total = {k: min(r[0] for r in v) for k, v in results.items()}
        steady = {k: max(r[1] for r in v) for k, v in results.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    grain_note = (f"; {steady['seqloader'] / steady['grain']:.2f}x Grain after the first batch, "
                  f"{total['grain'] / total['seqloader']:.2f}x with start-up" if "grain" in steady else "; grain not installed")
    rows = [Row("sources_latency", "seqloader.image_folder, 16 threads/worker", 2, steady["seqloader"], "samples/s",
                ratio=steady["seqloader"] / steady["torch"],
                notes=f"{n} files, 20 ms per read, batch {bs}; rate after the first batch{grain_note}; "
                      f"{n / total['seqloader']:,.0f}/s with start-up"),
            Row("sources_latency", "torch DataLoader", 2, steady["torch"], "samples/s",
                notes=f"sleep in __getitem__; {n / total['torch']:,.0f}/s with start-up")]
    if "grain" in steady:
        rows.append(Row("sources_latency", "Grain, ReadOptions(num_threads=16), mp_prefetch", 2, steady["grain"],
                        "samples/s", ratio=steady["grain"] / steady["torch"],
                        notes=f"same dataset as torch's; {n / total['grain']:,.0f}/s with start-up (spawned workers)"))
    return rows


#: Workload name -> function(Options) -> rows.
SOURCE_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "sources_parquet": sources_parquet,
    "sources_tar": sources_tar,
    "sources_index": sources_index,
    "sources_latency": sources_latency,
}
