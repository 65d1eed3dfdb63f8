"""Small Parquet files for tests: ``files`` files of ``rows`` rows each, numbered ``id`` (int64)
and a ``tokens`` column of ``width`` random int32 below ``high`` per row, optionally ``name``
strings (a column that fits no fixed-width buffer)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_token_files(folder, files, rows, row_group, width, high=1000, seed=0, names=False) -> str:
    """Write ``part-<f>.parquet`` for ``f < files`` into ``folder`` (row groups of ``row_group``
    rows); returns ``folder`` as a string."""
    rng = np.random.default_rng(seed)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, high, rows * width, dtype=np.int32)), width)
        cols = {"id": ids, "tokens": tokens}
        if names:
            cols["name"] = [f"r{i}" for i in ids]
        pq.write_table(pa.table(cols), os.path.join(folder, f"part-{f}.parquet"), row_group_size=row_group)
    return str(folder)
