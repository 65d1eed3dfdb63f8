"""Columnar sources' conversion to numpy (``seqloader/sources/_table.py``): token columns whose
rows all have one length come back as one 2-D array (a 2-D tensor after ``default_convert``),
ragged ones as object arrays; the arena is shared by the threads of a process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate, default_convert

import seqloader
from seqloader.sources._table import to_numpy

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def tokens(rows: int, width: int, start: int = 0, typ=None):
    values = np.arange(start, start + rows * width, dtype=np.int32)
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return arr if typ is None else arr.cast(typ)


def write(path, groups):
    """A Parquet file with one row group per table of ``groups``."""
    with pq.ParquetWriter(path, groups[0].schema) as w:
        for t in groups:
            w.write_table(t)


@pytest.mark.parametrize("typ", [None, pa.list_(pa.int64()), pa.large_list(pa.int32()), pa.list_(pa.float32()),
                                 pa.list_(pa.int32(), 4)])
def test_lists_of_one_length_are_a_2d_view_of_arrows_values(typ):
    arr = tokens(5, 4, typ=typ)
    out = to_numpy(arr)
    assert out.shape == (5, 4) and out.dtype == arr.type.value_type.to_pandas_dtype()
    assert out.tolist() == np.arange(20).reshape(5, 4).tolist()
    assert np.shares_memory(out, arr.flatten().to_numpy())  # zero-copy: a view of Arrow's buffer


def test_a_sliced_list_array_and_a_chunked_one_give_their_own_rows():
    arr = tokens(6, 3)
    assert to_numpy(arr.slice(2, 3)).tolist() == np.arange(6, 15).reshape(3, 3).tolist()
    chunked = pa.chunked_array([tokens(2, 3), tokens(3, 3, start=6)])
    assert to_numpy(chunked).tolist() == np.arange(15).reshape(5, 3).tolist()
    mixed = to_numpy(pa.chunked_array([tokens(2, 3), tokens(1, 2, start=6)]))   # chunks of other lengths
    assert mixed.dtype == object and [r.tolist() for r in mixed] == [[0, 1, 2], [3, 4, 5], [6, 7]]


@pytest.mark.parametrize("arr", [
    pa.array([[1, 2, 3], [4]]),                         # ragged
    pa.array([[1, 2], None]),                           # a null row
    pa.array([[1, None], [3, 4]]),                      # a null value
    pa.array([["a", "b"], ["c", "d"]]),                 # not numbers
    pa.array([[[1], [2]], [[3], [4]]]),                 # nested
], ids=["ragged", "null-row", "null-value", "strings", "nested"])
def test_other_lists_stay_object_arrays_of_rows(arr):
    out = to_numpy(arr)
    assert out.dtype == object and out.shape == (len(arr),)
    assert plain(out) == arr.to_pylist()


def plain(x):
    """Nested numpy arrays as nested lists."""
    if isinstance(x, np.ndarray):
        return [plain(v) for v in x]
    return x.item() if isinstance(x, np.generic) else x


@pytest.fixture
def token_file(tmp_path):
    """Two row groups of 512-token rows (8 and 6 rows), and a label column."""
    path = tmp_path / "tokens.parquet"
    groups = [pa.table({"tokens": tokens(8, 512), "label": np.arange(8, dtype=np.int64)}),
              pa.table({"tokens": tokens(6, 512, start=8 * 512), "label": np.arange(8, 14, dtype=np.int64)})]
    write(path, groups)
    return path


def test_a_token_column_batch_is_one_2d_tensor_without_a_collate(token_file):
    src = seqloader.parquet(token_file, columnar=True)
    batch = src.__getitems__([13, 0, 9, 3])               # rows of both row groups
    assert batch["tokens"].shape == (4, 512) and batch["tokens"].dtype == np.int32
    want = np.arange(14 * 512).reshape(14, 512)[[13, 0, 9, 3]]
    assert (batch["tokens"] == want).all()
    t = default_convert(batch)
    assert isinstance(t["tokens"], torch.Tensor) and t["tokens"].shape == (4, 512) and t["tokens"].dtype == torch.int32
    rows = seqloader.parquet(token_file)                  # rows: default_collate stacks them
    assert torch.equal(default_collate(rows.__getitems__([13, 0, 9, 3]))["tokens"], t["tokens"])
    assert rows[5]["tokens"].flags.writeable and rows[5]["tokens"].tolist() == list(range(5 * 512, 6 * 512))


def test_row_groups_of_different_lengths_give_object_rows_only_where_a_batch_mixes_them(tmp_path):
    path = tmp_path / "mixed.parquet"
    write(path, [pa.table({"tokens": tokens(4, 3)}), pa.table({"tokens": tokens(4, 2, start=100)})])
    src = seqloader.parquet(path, columnar=True)
    assert src.__getitems__([1, 0])["tokens"].shape == (2, 3)          # one row group: 2-D
    assert src.__getitems__([5, 4])["tokens"].shape == (2, 2)
    mixed = src.__getitems__([5, 0])["tokens"]                          # both: a row per object
    assert mixed.dtype == object and [r.tolist() for r in mixed] == [[102, 103], [0, 1, 2]]


def test_a_loader_gives_the_same_2d_batches_on_every_executor(token_file):
    def batches(**kw):
        src = seqloader.parquet(token_file, columnar=True)
        sampler = seqloader.BlockShuffleSampler(src, window=2, seed=3, lanes=2)  # (lanes: the same for all)
        return list(seqloader.DataLoader(src, batch_size=4, sampler=sampler, collate_fn=default_convert, seed=3, **kw))

    ref = batches()
    assert all(b["tokens"].ndim == 2 for b in ref)
    for kw in ({"num_workers": 2, "worker_method": "thread"}, {"num_workers": 2}):
        got = batches(**kw)
        assert len(got) == len(ref)
        assert all(torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["label"], b["label"])
                   for a, b in zip(ref, got))
