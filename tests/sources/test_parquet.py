"""``seqloader.parquet``: rows and columnar batches against pyarrow's own read, the cache, errors, the loader."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import default_convert

import seqloader
from seqloader.sources import parquet
from seqloader.testing import assert_resumes_exactly

from sources_helpers import pa, pq, table, write_parquet

LAYOUT = [[5, 0, 7], [3], [6, 4]]
N = 25


def py(v):
    """A value read by the source, as Python (numpy arrays and scalars to lists and numbers)."""
    return v.tolist() if hasattr(v, "tolist") else v


@pytest.fixture
def files(tmp_path):
    return write_parquet(tmp_path / "data", LAYOUT)


def direct_rows(paths, columns=None):
    return [r for p in paths for r in pq.read_table(p, columns=columns).to_pylist()]


def test_rows_equal_pyarrows_read(files):
    src = parquet(files)
    want = direct_rows(files)
    assert len(src) == N and src.columns == ["i", "x", "s", "vec", "ragged"]
    assert [{k: py(v) for k, v in src[i].items()} for i in range(-N, N)] == want + want
    assert [{k: py(v) for k, v in r.items()} for r in src.__getitems__(list(range(N))[::-1])] == want[::-1]
    assert [{k: py(v) for k, v in r.items()} for r in src] == want
    assert src.blocks().tolist() == [5, 5, 12, 15, 21, 25]


def test_a_folder_a_glob_and_a_list_give_the_same_sorted_files(files, tmp_path):
    a = parquet(str(tmp_path / "data"))
    b = parquet(str(tmp_path / "data" / "*.parquet"))
    c = parquet([files[0], str(tmp_path / "data" / "part-00[12].parquet")])
    assert a.files() == b.files() == c.files() and a.paths() == b.paths() == c.paths() == files


def test_columnar_batches_equal_take_in_the_order_asked(files):
    src = parquet(files, columnar=True)
    full = pa.concat_tables([pq.read_table(p) for p in files])
    order = np.random.default_rng(0).permutation(N)
    for pos in (order[:7], order, [24], [3, 4, 5], [-1, 0]):
        batch = src.__getitems__(list(pos))
        want = full.take([p % N for p in pos])
        assert batch["i"].dtype == np.int64 and batch["x"].dtype == np.float32
        assert batch["i"].tolist() == want["i"].to_pylist()
        assert batch["s"].tolist() == want["s"].to_pylist()
        assert batch["vec"].shape == (len(pos), 3) and batch["vec"].tolist() == want["vec"].to_pylist()
        assert [py(r) for r in batch["ragged"]] == want["ragged"].to_pylist()
    tensors = default_convert(src.__getitems__([1, 2]))
    assert torch.equal(tensors["vec"], torch.tensor([[1.0] * 3, [2.0] * 3]))


def test_columns_and_transform(files):
    src = parquet(files, columns=["s", "i"], transform=lambda row: (row["s"], int(row["i"]) * 2))
    assert src.columns == ["s", "i"] and src[7] == ("row7", 14)
    assert src.__getitems__([0, 24]) == [("row0", 0), ("row24", 48)]
    assert repr(src) == "parquet(files=3, blocks=6, transform=<lambda>, len=25)"


def test_a_user_error_in_transform_keeps_its_type_and_names_the_item(files):
    def bad(row):
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope") as info:
        parquet(files, transform=bad).__getitems__([3, 9])
    assert "at item 3" in info.value.__notes__[0]


def test_out_of_range_positions_raise_index_error_naming_the_source(files):
    src = parquet(files)
    with pytest.raises(IndexError, match=r"parquet\(files=3, blocks=6, len=25\): index 25 out of range \[-25, 25\)"):
        src.__getitems__([0, 25])
    with pytest.raises(IndexError, match="index -26 out of range"):
        src[-26]
    with pytest.raises(IndexError, match="index -26 out of range"):   # (a batch checks its range in one pass)
        src.__getitems__([3, -26])
    with pytest.raises(IndexError, match=f"index {-2**63} out of range"):
        src.__getitems__(np.array([-2**63], dtype=np.int64))
    assert repr(src.__getitems__([-1, -25, 0])) == repr([src[24], src[0], src[0]])


def test_a_batch_decodes_each_row_group_once_and_the_cache_is_bounded(files):
    src = parquet(files, columnar=True, cache_blocks=2)
    src.__getitems__([0, 5, 1, 6, 2, 7])   # row groups 0 and 2 (1 is empty)
    assert src.counters()["blocks_decoded"] == 2
    src.__getitems__([3, 8])                # both cached
    assert src.counters()["blocks_decoded"] == 2
    src.__getitems__([13])                  # a third block evicts the least recently used
    src.__getitems__([0])
    assert src.counters()["blocks_decoded"] == 4
    whole = parquet(files, columnar=True)
    for start in range(0, N, 4):            # a sequential epoch decodes every byte once
        whole.__getitems__(list(range(start, min(start + 4, N))))
    c = whole.counters()
    assert c["blocks_decoded"] == 5 and c["items_read"] == N
    assert c["bytes_decoded"] == sum(pq.ParquetFile(p).read_row_group(g).nbytes
                                     for p, groups in zip(files, LAYOUT) for g in range(len(groups)) if groups[g])


@pytest.mark.parametrize("cache_blocks", [10**12, 10**8, 2**63])
def test_a_cache_larger_than_the_source_keeps_every_row_group_and_no_more(files, cache_blocks):
    src = parquet(files, columnar=True, cache_blocks=cache_blocks)
    assert src.cache_blocks == sum(len(groups) for groups in LAYOUT)   # (an empty row group is a block too)
    assert src.__getitems__(list(range(N)))["x"].tolist() == parquet(files, columnar=True).__getitems__(
        list(range(N)))["x"].tolist()
    with pytest.raises(ValueError, match=r"parquet: cache_blocks must be a positive int \(got 0\)"):
        parquet(files, cache_blocks=0)


def test_pickles_without_open_files_or_caches(files):
    src = parquet(files, columnar=True)
    src.__getitems__([0, 20])
    clone = pickle.loads(pickle.dumps(src))
    assert clone.counters()["blocks_decoded"] == 0
    assert clone.__getitems__([20])["i"].tolist() == [20]
    assert len(pickle.dumps(src)) < 20_000


def test_a_missing_file_names_it(tmp_path, files):
    with pytest.raises(FileNotFoundError, match="no such file or directory.*nope.parquet"):
        parquet([files[0], str(tmp_path / "nope.parquet")])
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"holds no file ending in \.parquet"):
        parquet(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="pattern matched no file"):
        parquet(str(tmp_path / "*.nothing"))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"bad\.parquet is not a Parquet file or is truncated \(no PAR1 magic at its end\)"):
        parquet(str(path))


def test_different_schemas_name_both_files_and_the_column(tmp_path, files):
    other = tmp_path / "other.parquet"
    t = table(0, 3)
    pq.write_table(t.set_column(1, "x", t["x"].cast(pa.float64())), other)
    with pytest.raises(ValueError, match=r"column 'x' is float in .*part-000\.parquet but double in .*other\.parquet"):
        parquet([files[0], str(other)])
    fewer = tmp_path / "fewer.parquet"
    pq.write_table(t.drop_columns(["s"]), fewer)
    with pytest.raises(ValueError, match=r"part-000\.parquet and .*fewer\.parquet have different columns .*'s'"):
        parquet([files[0], str(fewer)])
    with pytest.raises(ValueError, match=r"column 's' is in .*part-000\.parquet but not in .*fewer\.parquet"):
        parquet([files[0], str(fewer)], columns=["i", "s"])
    assert len(parquet([files[0], str(fewer)], columns=["i", "vec"])) == 15
    with pytest.raises(ValueError, match=r"column 'zz' is not in .*part-000\.parquet \(its columns: i, x, s, vec, ragged\)"):
        parquet(files, columns=["zz"])


def test_a_file_changed_after_indexing_raises_at_read_time_naming_it(files):
    src = parquet(files)
    pq.write_table(table(100, 5), files[1])
    os.utime(files[1], ns=(1, 1))  # a different mtime, whatever the clock's resolution
    assert int(src[0]["i"]) == 0   # other files still read
    with pytest.raises(RuntimeError, match=r"part-001\.parquet changed since it was indexed"):
        src[13]
    os.remove(files[2])
    with pytest.raises(FileNotFoundError, match=r"part-002\.parquet"):
        src[20]


def test_argument_errors(files):
    with pytest.raises(TypeError, match="transform is called on rows and columnar=True returns batches"):
        parquet(files, columnar=True, transform=str)
    with pytest.raises(TypeError, match="columns must be a list of column names"):
        parquet(files, columns="i")
    with pytest.raises(ValueError, match="cache_blocks must be a positive int"):
        parquet(files, cache_blocks=0)
    with pytest.raises(TypeError, match="paths must be a path"):
        parquet([])


def test_a_missing_pyarrow_names_the_extra(files, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install seqloader\[parquet\]"):
        parquet(files)


def test_importing_seqloader_and_the_sources_imports_neither_pyarrow_nor_fsspec_nor_torch():
    code = ("import sys, seqloader, seqloader.sources\nseqloader.parquet, seqloader.tar_shards\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'fsspec', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the loader ----------------------------------------------------------------------------------

def _make_columnar(path):
    def make(num_workers):
        src = parquet(path, columns=["i", "x", "vec"], columnar=True)
        return seqloader.DataLoader(src, batch_size=4, shuffle=True, seed=5, num_workers=num_workers,
                                    collate_fn=default_convert)
    return make


@pytest.mark.mp
def test_the_columnar_loader_yields_the_rows_of_its_order_and_resumes_exactly(files, tmp_path):
    make = _make_columnar(str(tmp_path / "data"))
    loader = make(0)
    batches = list(loader)
    assert sorted(i for b in batches for i in b["i"].tolist()) == list(range(N))
    for b in batches:
        assert torch.equal(b["vec"], b["i"].float()[:, None].expand(-1, 3))
        assert b["x"].dtype == torch.float32
    assert_resumes_exactly(make, stops=[0, 3, -1])


def _make_rows(num_workers, path=None):
    src = parquet(path, columns=["i", "vec"])
    return seqloader.DataLoader(src, batch_size=5, shuffle=True, seed=1, num_workers=num_workers)


@pytest.mark.mp
def test_the_row_loader_resumes_exactly_with_another_num_workers_and_in_a_spawned_process(files, tmp_path):
    import functools

    make = functools.partial(_make_rows, path=str(tmp_path / "data"))
    assert_resumes_exactly(make, stops=[2, -2], spawn=True)


def test_to_numpy_of_chunked_columns_equals_the_combined_column():
    from seqloader.sources._table import to_numpy

    vec = pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0], pa.float32()), 2)
    for chunks in ([pa.array([1, 2]), pa.array([3])], [vec, vec[:1]], [pa.array(["a"]), pa.array(["b", None])],
                   [pa.array([1, None]), pa.array([3])], []):
        col = pa.chunked_array(chunks, type=chunks[0].type if chunks else pa.int64())
        got = to_numpy(col)
        assert len(got) == len(col) and [py(v) for v in got] == col.to_pylist()


# -- issue 26: never other rows, and errors that name the file ----------------------------------

def write_plain(path, start, groups):
    """Uncompressed, without dictionaries or statistics: files of the same layout and digit counts have
    the same size whatever their values."""
    with pq.ParquetWriter(path, table(0, 1).schema, compression="none", use_dictionary=False,
                          write_statistics=False) as w:
        for n in groups:
            w.write_table(table(start, n), row_group_size=n)
            start += n


def same_size_replacement(path, start, groups):
    """Replace ``path`` by other rows of the same layout, with the same size and mtime (``cp -p``)."""
    st = os.stat(path)
    write_plain(path + ".new", start, groups)
    assert os.path.getsize(path + ".new") == st.st_size
    os.replace(path + ".new", path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _make_plain(num_workers, folder=None):
    src = parquet(folder, columns=["i"], columnar=True)
    return seqloader.DataLoader(src, batch_size=2, num_workers=num_workers, collate_fn=default_convert)


@pytest.mark.mp
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_replaced_mid_epoch_by_one_of_the_same_size_and_mtime_raises_naming_it(tmp_path, num_workers):
    folder = tmp_path / "plain"
    os.makedirs(folder)
    write_plain(str(folder / "a.parquet"), 0, [10])
    write_plain(str(folder / "b.parquet"), 10, [5, 5])
    write_plain(str(folder / "c.parquet"), 20, [10])
    loader = _make_plain(num_workers, str(folder))
    it = iter(loader)
    assert next(it)["i"].tolist() == [0, 1]
    same_size_replacement(str(folder / "c.parquet"), 80, [10])    # rows 80..89 instead of 20..29
    with pytest.raises(RuntimeError, match=r"c\.parquet changed since it was indexed"):
        for batch in it:
            assert all(i < 80 for i in batch["i"].tolist())
    del it


def test_each_process_compares_the_footer_with_the_index_before_its_first_read(files):
    src = parquet(files)
    src._digests[1] = "0" * 16        # as if the file had been replaced without a trace in stat()
    clone = pickle.loads(pickle.dumps(src))   # a fresh process's copy: nothing open yet
    assert int(clone[0]["i"]) == 0
    with pytest.raises(RuntimeError, match=r"part-001\.parquet changed since it was indexed \(its footer's digest is "
                                           r"[0-9a-f]{16}, the index's 0000000000000000\)"):
        clone[13]


@pytest.mark.parametrize("cut", [0, 3, 11, "no footer"])
def test_empty_and_truncated_files_are_named(tmp_path, files, cut):
    path = str(tmp_path / "cut.parquet")
    with open(files[0], "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) - 1] if cut == "no footer" else data[:cut])
    want = (r"cut\.parquet is not a Parquet file or is truncated \(no PAR1 magic at its end\)" if cut == "no footer"
            else rf"cut\.parquet is not a Parquet file \({cut} bytes; the smallest is 12\): an empty or truncated file")
    with pytest.raises(ValueError, match=want):
        parquet([files[1], path])


def _chunk(path, column):
    """The offset and size of the column chunk of ``column`` in row group 0."""
    meta = pq.ParquetFile(path).metadata.row_group(0).column(column)
    start = min(meta.data_page_offset, meta.dictionary_page_offset or meta.data_page_offset)
    return start, meta.total_compressed_size


@pytest.mark.parametrize("checksums", [False, True])
def test_corrupt_pages_raise_with_a_note_naming_the_file_and_the_row_group(tmp_path, checksums):
    path = str(tmp_path / "pages.parquet")
    pq.write_table(table(0, 50), path, row_group_size=25, compression="snappy", write_page_checksum=checksums)
    offset, size = _chunk(path, 2)                 # the string column, row group 0
    with open(path, "r+b") as f:
        f.seek(offset + size - 12)                 # inside its last page's compressed data
        f.write(b"\xff\xfe\xfd\xfc")
    src = parquet(path)
    assert int(src[30]["i"]) == 30                  # row group 1 is fine
    with pytest.raises((OSError, ValueError)) as info:
        src[3]
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert f"parquet: while reading row group 0 of {path}" in text
    if checksums:
        assert "CRC" in text or "checksum" in text.lower()


def test_hive_partition_folders_are_read_as_columns(tmp_path):
    root = tmp_path / "hive"
    for year, lang, start in [(2024, "en", 0), (2024, "f%20r", 3), (2025, "en", 6), ("__HIVE_DEFAULT_PARTITION__", "x", 9)]:
        os.makedirs(root / f"year={year}" / f"lang={lang}")
        pq.write_table(table(start, 3).select(["i", "s"]), root / f"year={year}" / f"lang={lang}" / "part.parquet")
    src = parquet(str(root))
    assert src.columns == ["i", "s", "year", "lang"]
    rows = [{k: py(v) for k, v in r.items()} for r in src]
    want = pq.read_table(str(root)).to_pylist()      # pyarrow's own reading of the same folder
    assert [(r["i"], r["year"], r["lang"]) for r in rows] == [(w["i"], None if w["year"] is None else int(w["year"]),
                                                               w["lang"]) for w in want]
    assert rows[4] == {"i": 4, "s": "row4", "year": 2024, "lang": "f r"}
    col = parquet(str(root), columns=["year", "i"], columnar=True).__getitems__([11, 0, 7])
    assert col["year"].tolist() == [None, 2024, 2025] and col["i"].tolist() == [11, 0, 7]
    assert parquet(str(root), partitioning=None).columns == ["i", "s"]
    assert parquet(str(root / "year=2024" / "lang=en")).columns == ["i", "s"]   # below the partition folders
    with pytest.raises(ValueError, match="partitioning must be 'hive' or None"):
        parquet(str(root), partitioning="directory")


def test_hive_partitions_that_disagree_or_shadow_a_column_are_refused(tmp_path):
    root = tmp_path / "hive"
    os.makedirs(root / "year=2024")
    os.makedirs(root / "other")
    pq.write_table(table(0, 2).select(["i"]), root / "year=2024" / "a.parquet")
    pq.write_table(table(2, 2).select(["i"]), root / "other" / "b.parquet")
    with pytest.raises(ValueError, match=r"other/b\.parquet and .*year=2024/a\.parquet have different hive "
                                         r"partitions \(none and year\).*partitioning=None"):
        parquet(str(root))
    assert len(parquet(str(root), partitioning=None)) == 4
    shadow = tmp_path / "shadow"
    os.makedirs(shadow / "i=1")
    pq.write_table(table(0, 2).select(["i"]), shadow / "i=1" / "a.parquet")
    with pytest.raises(ValueError, match=r"'i' is both a column of .*a\.parquet and a hive partition folder"):
        parquet(str(shadow))
