"""Columnar sources' conversion to numpy (``seqloader/sources/_table.py``): token columns whose
rows all have one length come back as one 2-D array (a 2-D tensor after ``default_convert``),
ragged ones as object arrays; the arena is shared by the threads of a process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate, default_convert

import seqloader
from forking import wait_until
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


def test_a_batch_across_row_groups_is_one_take_from_the_slot_buffers(tmp_path):
    write(tmp_path / "a.parquet", [pa.table({"x": np.arange(k * 10, k * 10 + 10),
                                             "tokens": tokens(10, 3, start=30 * k)}) for k in range(4)])
    src = seqloader.parquet(tmp_path, columnar=True, cache_blocks=4)
    batch = src.__getitems__([35, 2, 17, 38, 2])
    assert batch["x"].tolist() == [35, 2, 17, 38, 2]
    assert batch["tokens"].tolist() == np.arange(120).reshape(40, 3)[[35, 2, 17, 38, 2]].tolist()
    slots = src._slots.get()
    assert sorted(slots._buffers) == ["tokens", "x"] and slots._buffers["tokens"].shape == (40, 3)
    with src._pinned([0, 1, 3]) as decoded:
        assert all(decoded[b].slotted == {"x", "tokens"} for b in (0, 1, 3))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a deliberately small arena (it warns it thrashes)
def test_threads_reading_a_small_arena_at_once_get_exact_batches(tmp_path):
    """Slots are reused as blocks leave the arena, never under a batch that reads them: 8 threads,
    a switch interval of 1 µs, 3 slots for 12 row groups, and every batch is checked."""
    import sys
    import threading

    folder = str(tmp_path)
    write(f"{folder}/a.parquet", [pa.table({"x": np.arange(k * 20, k * 20 + 20), "tokens": tokens(20, 2, start=40 * k)})
                                  for k in range(12)])
    src = seqloader.parquet(folder, columnar=True, cache_blocks=3)
    want = np.arange(480).reshape(240, 2)
    errors: list[str] = []
    start = threading.Barrier(8, timeout=30)

    def reader(seed: int):
        start.wait()
        rng = np.random.default_rng(seed)
        for _ in range(60):
            pos = rng.integers(0, 240, rng.integers(1, 12)).tolist()
            got = src.__getitems__(pos)
            if got["x"].tolist() != pos or got["tokens"].tolist() != want[pos].tolist():
                errors.append(f"{pos}: {got}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len(src._slots.get().arena.kept()) <= 3


# -- issue 43: one coarse step per block, no threads that do nothing ----------------------------

def token_table(rows: int, width: int, seed: int):
    """The issue's layout: ``id`` int64, ``tokens`` list<int32> of ``width``, ``label`` int32."""
    rng = np.random.default_rng(seed)
    values = pa.array(rng.integers(0, 50_000, rows * width, dtype=np.int32))
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.table({"id": np.arange(seed * rows, (seed + 1) * rows, dtype=np.int64),
                     "tokens": pa.ListArray.from_arrays(offsets, values),
                     "label": rng.integers(0, 10, rows).astype(np.int32)})


def test_a_token_column_is_pyarrows_flat_values_reshaped_from_the_file_to_the_batch(tmp_path):
    """A list<int32> column of equal lengths decodes to one 2-D array equal to pyarrow's
    ``to_numpy`` of the flattened values reshaped, and a columnar batch holds exactly its rows."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.concat_tables([token_table(25, 16, k) for k in range(4)]), path, row_group_size=25,
                   compression="snappy", use_dictionary=True)
    whole = pq.read_table(path)
    want = whole.column("tokens").combine_chunks()
    want = want.flatten().to_numpy().reshape(len(want), -1)
    for g in range(pq.ParquetFile(path).num_row_groups):
        col = pq.ParquetFile(path).read_row_group(g).column("tokens")
        got = to_numpy(col)
        assert got.dtype == np.int32 and got.shape == (25, 16)
        assert np.array_equal(got, col.combine_chunks().flatten().to_numpy().reshape(25, 16))
    src = seqloader.parquet(str(path), columnar=True)
    pos = np.random.default_rng(0).permutation(len(whole))[:40].tolist()
    batch = src.__getitems__(pos)
    assert batch["tokens"].dtype == np.int32 and batch["tokens"].shape == (40, 16)
    assert np.array_equal(batch["tokens"], want[pos])
    assert batch["id"].tolist() == whole.column("id").to_numpy()[pos].tolist()
    assert batch["label"].tolist() == whole.column("label").to_numpy()[pos].tolist()


@pytest.mark.parametrize("typ", [pa.int8(), pa.uint16(), pa.int64(), pa.float16(), pa.float64()])
def test_numbers_are_a_view_of_arrows_buffer_and_honour_a_slice(typ):
    arr = pa.array(np.arange(10)).cast(typ)
    out = to_numpy(arr.slice(3, 4))
    assert out.dtype == typ.to_pandas_dtype() and out.tolist() == [3, 4, 5, 6]
    assert np.shares_memory(out, np.frombuffer(arr.buffers()[1], out.dtype))   # zero-copy
    assert to_numpy(pa.array([], typ)).shape == (0,)
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 4, 6], pa.int32()), arr.slice(2, 6))   # values sliced too
    assert to_numpy(lists).tolist() == [[2, 3], [4, 5], [6, 7]]
    assert to_numpy(lists.slice(1)).tolist() == [[4, 5], [6, 7]]


def test_converting_a_block_imports_no_pandas(tmp_path):
    """pyarrow's ``Array.to_numpy`` imports pandas on its first call in a process (half a second in
    every worker); numbers and token columns go by Arrow's buffers instead."""
    import subprocess
    import sys

    path = tmp_path / "t.parquet"
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(40, dtype=np.float32)), 2)
    pq.write_table(token_table(20, 8, 0).append_column("vec", vec), path, row_group_size=10)
    code = ("import sys, seqloader\n"
            f"batch = seqloader.parquet({str(path)!r}, columnar=True).__getitems__([3, 12, 0])\n"
            "print([c.shape for c in batch.values()], 'pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[(3,), (3, 8), (3,), (3, 2)] False"


def seqloader_threads() -> set:
    """The pool threads alive now (objects, not names: another test's pool may end meanwhile)."""
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("seqloader-thread")}


@pytest.mark.parametrize("fmt", ["parquet", "arrow_ipc"])
def test_an_epoch_of_local_files_starts_no_thread(tmp_path, fmt):
    """The index of several files is read on a pool of threads, stopped once it is built; reading
    local files needs none, so an epoch over them leaves no seqloader thread running."""
    from torch.utils.data import default_convert

    feather = pytest.importorskip("pyarrow.feather")
    for k in range(4):
        t = token_table(20, 8, k)
        if fmt == "parquet":
            pq.write_table(t, tmp_path / f"p{k}.parquet", row_group_size=5)
        else:
            feather.write_feather(t, str(tmp_path / f"p{k}.arrow"), chunksize=5)
    before = seqloader_threads()
    src = getattr(seqloader, fmt)(str(tmp_path), columnar=True, num_threads=16)
    assert wait_until(lambda: not seqloader_threads() - before, 60), seqloader_threads() - before
    loader = seqloader.DataLoader(src, batch_size=8, sampler=seqloader.BlockShuffleSampler(src, seed=0),
                                  num_workers=0, seed=0, collate_fn=default_convert)
    assert sum(len(b["id"]) for b in loader) == 80
    # the pool was told to stop and joined against a deadline: on a busy machine a thread may take
    # longer to end, so wait for it (generously) rather than look once
    assert wait_until(lambda: not seqloader_threads() - before, 60), seqloader_threads() - before
