"""File-list descriptions: a small fingerprint for a checkpoint and the comparison that refuses other files."""

from __future__ import annotations

import json
import os

import pytest

from seqloader.sources import check_same_files, describe_files, tar_shards

from sources_helpers import write_shards


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path / "s", [2, 3, 1])


def test_a_description_is_small_json_and_changes_with_any_file(shards, tmp_path):
    src = tar_shards(shards)
    d = describe_files(src)
    assert json.loads(json.dumps(d)) == d and len(json.dumps(d)) < 450
    assert {k: d[k] for k in ("files", "fingerprint", "chunk")} == {"files": 3, "fingerprint": src.fingerprint(),
                                                                     "chunk": 1}
    assert describe_files(tar_shards(shards)) == d
    assert [f[0] for f in src.files()] == shards and src.files()[0][1] == os.path.getsize(shards[0])
    check_same_files(d, src)
    check_same_files(src.files(), tar_shards(shards))
    os.utime(shards[1], ns=(5, 5))
    touched = tar_shards(shards)
    assert describe_files(touched)["fingerprint"] != d["fingerprint"]
    with pytest.raises(ValueError, match=r"file 1 differs: .*shard-000001\.tar \(size 10240, mtime_ns:\d+\) when saved, "
                                         r".*shard-000001\.tar \(size 10240, mtime_ns:5\) now"):
        check_same_files(src.files(), touched)
    with pytest.raises(ValueError, match=r"file 1, .*shard-000001\.tar \(size 10240, mtime_ns:5\) now, differs "
                                         r"from the file list the state was saved with"):
        check_same_files(d, touched)  # a description of up to 32 files names the file


def test_added_removed_and_renamed_files(shards, tmp_path):
    src = tar_shards(shards)
    fewer = tar_shards(shards[:2])
    with pytest.raises(ValueError, match=r"3 files when saved, 2 now; file 2 \(.*shard-000002\.tar\) is only in the list saved"):
        check_same_files(src, fewer)
    with pytest.raises(ValueError, match=r"2 files when saved, 3 now; file 2 \(.*shard-000002\.tar\) is only in the list of now"):
        check_same_files(fewer.files(), src)
    with pytest.raises(ValueError, match=r"2 files when saved, 3 now; file 2 \(.*shard-000002\.tar\) was not there"):
        check_same_files(describe_files(fewer), src)
    os.rename(shards[2], tmp_path / "s" / "shard-000009.tar")
    with pytest.raises(ValueError, match=r"file 2 differs: .*shard-000002\.tar .* when saved, .*shard-000009\.tar"):
        check_same_files(src, tar_shards(str(tmp_path / "s")))


def test_bad_arguments():
    with pytest.raises(TypeError, match="describe_files: expected a source with files"):
        describe_files("x")


def test_a_description_of_many_files_names_the_run_that_differs_and_stays_small():
    files = [[f"s/{k:06d}.tar", 100 + k, f"mtime_ns:{k}"] for k in range(1000)]
    d = describe_files(files)
    assert len(json.dumps(d)) < 450 and d["chunk"] == 32 and len(d["chunks"]) == 32
    changed = [list(f) for f in files]
    changed[500][1] += 1
    with pytest.raises(ValueError, match=r"files 480\.\.511 \(s/000480\.tar \.\. s/000511\.tar, one of them at least\) differs"):
        check_same_files(d, changed)
    check_same_files(d, files)
