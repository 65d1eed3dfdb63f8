"""Every source through ``s3://`` against a real S3-compatible server (moto's) on localhost.

The ``s3_server`` fixture (``conftest.py``) starts the server on a free port, creates a bucket
and yields the ``storage_options`` (``endpoint_url``) for s3fs; nothing leaves this machine and
no code of ours is mocked.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from seqloader.sources import arrow_ipc, check_same_files, image_folder, parquet, tar_shards

from sources_helpers import pq, read_tar_directly, write_parquet, write_shards

s3fs = pytest.importorskip("s3fs")
feather = pytest.importorskip("pyarrow.feather")


@pytest.fixture(scope="module")
def fs(s3_server):
    return s3fs.S3FileSystem(**s3_server)


def upload(fs, local_folder, prefix):
    fs.put(str(local_folder) + "/", f"data/{prefix}/", recursive=True)
    fs.invalidate_cache()


def test_parquet_over_s3_reads_what_pyarrow_reads(fs, s3_server, tmp_path):
    paths = write_parquet(tmp_path / "pq", [[4, 3], [0, 5]])
    upload(fs, tmp_path / "pq", "pq")
    src = parquet("s3://data/pq/", storage_options=s3_server, columns=["i", "s", "vec"])
    assert src.paths() == ["s3://data/pq/part-000.parquet", "s3://data/pq/part-001.parquet"]
    assert [f[0] for f in src.files()] == ["part-000.parquet", "part-001.parquet"]
    assert all(f.version.startswith("etag:") for f in src._files.infos)   # the validator: the ETag
    assert src.fingerprint() == parquet(str(tmp_path / "pq")).fingerprint()   # a download fingerprints the same
    want = [r for p in paths for r in pq.read_table(p, columns=["i", "s", "vec"]).to_pylist()]
    got = src.__getitems__(list(range(12))[::-1])
    assert [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()} for r in got] == want[::-1]
    assert src.blocks().tolist() == [4, 7, 7, 12]
    col = parquet("s3://data/pq/*.parquet", storage_options=s3_server, columnar=True, num_threads=4)
    assert col.__getitems__([11, 0, 4])["i"].tolist() == [11, 0, 4]
    assert col.draws_globals and not parquet(str(tmp_path / "pq"), columnar=True).draws_globals   # a client may retry at random
    import pickle
    clone = pickle.loads(pickle.dumps(col))   # what a spawned worker gets: metadata, no connection
    assert clone.__getitems__([5])["s"].tolist() == ["row5"]


def test_a_batch_reads_each_row_group_with_one_range_request(fs, s3_server, tmp_path):
    write_parquet(tmp_path / "many", [[2]] * 12)
    upload(fs, tmp_path / "many", "many")
    src = parquet("s3://data/many/", storage_options=s3_server, num_threads=4)
    assert len(src) == 24 and len(src.files()) == 12
    reads = []  # a spy on the source's reads (it still reads from the server)
    files = src._files
    original = files.read
    files.read = lambda k, s, e: reads.append((k, s, e)) or original(k, s, e)
    src.__getitems__([0, 1, 23])
    assert sorted(k for k, _, _ in reads) == [0, 11]


def test_tar_shards_over_s3_index_once_cache_locally_and_read_by_range(fs, s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SEQLOADER_CACHE", str(tmp_path / "cache"))
    paths = write_shards(tmp_path / "tars", [3, 5, 2])
    upload(fs, tmp_path / "tars", "tars")
    src = tar_shards("s3://data/tars/", storage_options=s3_server, num_threads=3)
    assert src.index_stats == {"cached": 0, "scanned": 3}
    assert len(os.listdir(tmp_path / "cache" / "tar-index")) == 3
    want = [s for p in paths for s in read_tar_directly(p)]
    order = np.random.default_rng(0).permutation(10).tolist()
    assert src.__getitems__(order) == [want[i] for i in order]
    again = tar_shards("s3://data/tars/", storage_options=s3_server)
    assert again.index_stats == {"cached": 3, "scanned": 0} and again[9] == want[9]
    # an object replaced on the server has a new ETag: its index is rebuilt
    fs.put(paths[0], "data/tars/shard-000001.tar")
    fs.invalidate_cache()
    changed = tar_shards("s3://data/tars/", storage_options=s3_server)
    assert changed.index_stats == {"cached": 2, "scanned": 1} and len(changed) == 8
    # ... and a source built before the change refuses to read it
    with pytest.raises(RuntimeError, match=r"s3://data/tars/shard-000001\.tar changed since it was indexed"):
        again[4]
    with pytest.raises(ValueError, match=r"check_same_files: file 1 differs: shard-000001\.tar \(size 20480"):
        check_same_files(again, changed)


def test_image_folder_and_arrow_over_s3(fs, s3_server, tmp_path):
    for cls, name in [("b", "x.png"), ("a", "y.jpg"), ("a", "z.jpg")]:
        (tmp_path / "img" / cls).mkdir(parents=True, exist_ok=True)
        (tmp_path / "img" / cls / name).write_bytes(name.encode())
    upload(fs, tmp_path / "img", "img")
    src = image_folder("s3://data/img", storage_options=s3_server)
    assert src.classes == ["a", "b"] and src.__getitems__([2, 0]) == [(b"x.png", 1), (b"y.jpg", 0)]
    from sources_helpers import table
    os.makedirs(tmp_path / "arrow")
    feather.write_feather(table(0, 9), str(tmp_path / "arrow" / "t.arrow"), chunksize=4)
    upload(fs, tmp_path / "arrow", "arrow")
    rows = arrow_ipc("s3://data/arrow/t.arrow", storage_options=s3_server, columnar=True)
    assert rows.blocks().tolist() == [4, 8, 9] and rows.__getitems__([8, 1])["i"].tolist() == [8, 1]


def test_missing_remote_objects_are_named(s3_server):
    with pytest.raises(FileNotFoundError, match=r"no such file or directory: 's3://data/nothing/here.parquet'"):
        parquet("s3://data/nothing/here.parquet", storage_options=s3_server)
    with pytest.raises(FileNotFoundError, match="the pattern matched no file"):
        tar_shards("s3://data/nothing/*.tar", storage_options=s3_server)
