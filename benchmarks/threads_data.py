"""What the ``threads_*`` workloads (:mod:`benchmarks.threads`) read: their files, the hand-written
baselines (a map-style index over Parquet rows, an offset index over tar members), the decode
functions they share, and a sampler of the memory (PSS) of a process tree.

This module imports neither seqloader nor any workload module.
"""

from __future__ import annotations

import collections
import io
import os
import resource
import tarfile
import threading
from typing import Callable

import numpy as np
import torch

__all__ = ["DecodeSample", "PathLabels", "PssSampler", "PythonItems", "RowIndex", "TarIndex", "decode_jpeg",
           "pss_of_tree", "read_tokens", "with_cpu", "write_jpeg_shards", "write_token_files"]


# --------------------------------------------------------------------------- Parquet tokens


def write_token_files(folder: str, files: int, rows: int, tokens: int, groups: int = 1) -> None:
    """``files`` Parquet files of ``rows`` rows each in ``groups`` row groups: a ``list<int32>``
    column ``tokens`` of ``tokens`` random ids (vocabulary 50,000) per row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    offsets = pa.array(np.arange(0, rows * tokens + 1, tokens, dtype=np.int32))
    for f in range(files):
        values = pa.array(rng.integers(0, 50_000, rows * tokens, dtype=np.int32))
        table = pa.table({"tokens": pa.ListArray.from_arrays(offsets, values)})
        pq.write_table(table, os.path.join(folder, f"part-{f:05d}.parquet"), row_group_size=-(-rows // groups))


def read_tokens(path: str, group: int) -> np.ndarray:
    """Row group ``group`` of ``path``'s ``tokens`` column as a 2-D int32 array (one decode)."""
    import pyarrow.parquet as pq

    column = pq.ParquetFile(path).read_row_group(group, use_threads=False).column("tokens").combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)


class RowIndex(torch.utils.data.Dataset):
    """A map-style dataset over the rows of Parquet files, as one writes it by hand for torch's
    ``DataLoader``: an index of ``(file, row group)`` ends, ``__getitem__`` decodes the row group
    (kept in a per-process LRU of ``cache_blocks``) and returns one row as a tensor."""

    def __init__(self, paths: list[str], cache_blocks: int):
        import pyarrow.parquet as pq

        self.where = [(p, g) for p in paths for g in range(pq.ParquetFile(p).num_row_groups)]
        counts = [pq.ParquetFile(p).metadata.row_group(g).num_rows for p, g in self.where]
        self.ends = np.cumsum(counts)
        self.cache_blocks = cache_blocks
        self._cache: dict[int, collections.OrderedDict] = {}
        self._lock = threading.Lock()
        self.bytes_decoded: dict[int, int] = collections.Counter()

    def blocks(self) -> np.ndarray:
        return self.ends

    def __len__(self) -> int:
        return int(self.ends[-1])

    def _block(self, b: int) -> np.ndarray:
        pid = os.getpid()
        with self._lock:
            cache = self._cache.setdefault(pid, collections.OrderedDict())
            if b in cache:
                cache.move_to_end(b)
                return cache[b]
        rows = read_tokens(*self.where[b])
        with self._lock:
            cache[b] = rows
            self.bytes_decoded[pid] += rows.nbytes
            while len(cache) > self.cache_blocks:
                cache.popitem(last=False)
        return rows

    def __getitem__(self, i: int) -> torch.Tensor:
        b = int(np.searchsorted(self.ends, i, side="right"))
        start = int(self.ends[b - 1]) if b else 0
        return torch.from_numpy(self._block(b)[i - start].copy())


# --------------------------------------------------------------------------- tar shards of JPEGs


def write_jpeg_shards(folder: str, shards: int, per_shard: int, side: int) -> list[str]:
    """Tar shards in the webdataset layout: samples ``{jpg, cls}``, ``side`` x ``side`` RGB JPEGs
    (quality 90: gradients plus noise, so they do not compress to nothing)."""
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side]
    paths, j = [], 0
    for s in range(shards):
        path = os.path.join(folder, f"shard-{s:05d}.tar")
        with tarfile.open(path, "w") as tf:
            for _ in range(per_shard):
                img = np.stack([(x * 255 // side + j) % 256, (y * 255 // side) % 256,
                                rng.integers(0, 256, (side, side))], -1).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, format="JPEG", quality=90)
                for ext, data in (("jpg", buf.getvalue()), ("cls", str(j % 1000).encode())):
                    info = tarfile.TarInfo(f"{j:08d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                j += 1
        paths.append(path)
    return paths


def decode_jpeg(sample: dict) -> tuple[torch.Tensor, int]:
    """``{"jpg": bytes, "cls": bytes}`` -> ``(uint8 tensor HxWx3, label)``, decoded with PIL."""
    from PIL import Image

    with Image.open(io.BytesIO(sample["jpg"])) as img:
        pixels = np.array(img.convert("RGB"))   # (a writable copy: a tensor of it may be written)
    return torch.from_numpy(pixels), int(sample["cls"])


class DecodeSample:
    """:func:`decode_jpeg` with another bytes -> ``HxWx3`` uint8 array function ``decode`` (such as
    ``seqloader.ImageDecoder("simplejpeg")``); picklable when ``decode`` is."""

    def __init__(self, decode: Callable[[bytes], np.ndarray]):
        self.decode = decode

    def __call__(self, sample: dict) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.decode(sample["jpg"])), int(sample["cls"])


class TarIndex(torch.utils.data.Dataset):
    """A hand-written offset index over tar shards: ``(path, offset, size)`` of each sample's
    ``jpg`` and ``cls`` (from ``tarfile``, once), read with ``os.pread`` on a descriptor kept per
    process and path, decoded by ``decode`` (default :func:`decode_jpeg`)."""

    def __init__(self, paths: list[str], decode: Callable[[dict], tuple[torch.Tensor, int]] = decode_jpeg):
        self.items = []
        for path in paths:
            members: dict[str, dict[str, tuple[int, int]]] = {}
            with tarfile.open(path) as tf:
                for m in tf.getmembers():
                    key, ext = m.name.split(".", 1)
                    members.setdefault(key, {})[ext] = (m.offset_data, m.size)
            self.items += [(path, *members[k]["jpg"], *members[k]["cls"]) for k in sorted(members)]
        self.decode = decode
        self._fds: dict[tuple[int, str], int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, offset, size, cls_offset, cls_size = self.items[i]
        key = (os.getpid(), path)
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds.setdefault(key, os.open(path, os.O_RDONLY))
        return self.decode({"jpg": os.pread(fd, size, offset), "cls": os.pread(fd, cls_size, cls_offset)})


# --------------------------------------------------------------------------- memory and the GIL


class PathLabels(torch.utils.data.Dataset):
    """``n`` ``(path, label)`` pairs held as Python objects (an image list's index)."""

    def __init__(self, n: int):
        self.items = [(f"/data/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:08d}.JPEG", i % 1000) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[str, int]:
        return self.items[i]


class PythonItems:
    """``n`` items that each cost about 0.3 ms of pure Python (the GIL held throughout)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return sum((i * j) % 7 for j in range(3000))



def pss_of_tree(pid: int) -> int:
    """Bytes: the proportional set size of process ``pid`` and all its descendants (psutil's
    ``memory_full_info().pss``; a process that ends while it is read counts 0)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


class PssSampler:
    """``with PssSampler() as s: ...``: samples this process tree's PSS every ``interval``
    seconds in a thread; ``s.peak`` is the largest sample (one taken at the start and one at the
    end too)."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, pss_of_tree(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> "PssSampler":
        self.peak = pss_of_tree(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = max(self.peak, pss_of_tree(os.getpid()))
        self._stop.set()
        self._thread.join(10.0)



def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def with_cpu(runs: dict[str, Callable[[], float]], cpu: dict[str, float]) -> dict[str, Callable[[], float]]:
    """``runs`` (label -> a run returning its seconds), each also recording in ``cpu[label]`` the
    least CPU seconds it used (this process's threads, and its worker processes once they have
    ended): a measure the machine's load disturbs less than the wall clock."""
    def wrap(label: str, run: Callable[[], float]) -> Callable[[], float]:
        def timed() -> float:
            c0 = _cpu_seconds()
            seconds = run()
            cpu[label] = min(cpu.get(label, float("inf")), _cpu_seconds() - c0)
            return seconds
        return timed
    return {label: wrap(label, run) for label, run in runs.items()}
