"""Helpers for the source tests: small Parquet files and tar shards written into a folder, and
direct reads to compare with (imported by the test modules; ``conftest.py`` holds the fixtures)."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def table(start: int, n: int):
    """Rows ``start .. start + n - 1``: an int, a float32, a string, a fixed-size list and a list column."""
    i = np.arange(start, start + n)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(i, 3).astype(np.float32)), 3)
    ragged = pa.array([list(range(k % 4)) for k in i], type=pa.list_(pa.int32()))
    return pa.table({"i": i, "x": (i * 0.5).astype(np.float32), "s": pa.array([f"row{k}" for k in i], pa.string()),
                     "vec": vec, "ragged": ragged})


def write_parquet(folder, layout, name="part"):
    """One file per entry of ``layout`` (a list of row-group sizes); rows numbered across files.

    Returns the paths, in order.
    """
    os.makedirs(folder, exist_ok=True)
    paths, start = [], 0
    for k, groups in enumerate(layout):
        path = os.path.join(folder, f"{name}-{k:03d}.parquet")
        with pq.ParquetWriter(path, table(0, 1).schema) as w:
            for g in groups:
                w.write_table(table(start, g), row_group_size=max(g, 1))
                start += g
        paths.append(path)
    return paths


def sample_members(key: str, k: int) -> list[tuple[str, bytes]]:
    return [(f"{key}.txt", f"text {k}".encode() * (1 + k % 3)), (f"{key}.cls", str(k % 10).encode())]


def write_shards(folder, counts, name="shard", start=0):
    """Tar shards in the webdataset layout: shard ``k`` holds ``counts[k]`` samples ``{txt, cls}``
    with keys ``sample<global index>``. Returns the paths."""
    os.makedirs(folder, exist_ok=True)
    paths, j = [], start
    for k, n in enumerate(counts):
        path = os.path.join(folder, f"{name}-{k:06d}.tar")
        with tarfile.open(path, "w") as tf:
            for _ in range(n):
                for member, data in sample_members(f"sample{j:07d}", j):
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                j += 1
        paths.append(path)
    return paths


def read_tar_directly(path):
    """The samples of a shard read with tarfile alone: ``[{"__key__": ..., ext: bytes}, ...]``."""
    out = []
    with tarfile.open(path) as tf:
        for m in tf:
            key, ext = m.name.split(".", 1)
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key})
            out[-1][ext] = tf.extractfile(m).read()
    return out
