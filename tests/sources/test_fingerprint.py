"""File-list descriptions: a small fingerprint by content, the same for copies, that refuses other files."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest

from seqloader.sources import arrow_ipc, check_same_files, describe_files, image_folder, parquet, tar_shards

from sources_helpers import pa, pq, table, write_parquet, write_shards


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path / "s", [2, 3, 1])


def copy_tree(src, dst):
    """``cp -a``: another folder, new inodes and ctimes, the same bytes and mtimes."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


def test_a_description_is_small_json_of_relative_names_sizes_and_contents(shards, tmp_path):
    src = tar_shards(shards)
    d = describe_files(src)
    assert json.loads(json.dumps(d)) == d and len(json.dumps(d)) < 450
    assert {k: d[k] for k in ("files", "fingerprint", "chunk")} == {"files": 3, "fingerprint": src.fingerprint(),
                                                                     "chunk": 1}
    assert describe_files(tar_shards(shards)) == d
    assert [f[0] for f in src.files()] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert src.paths() == shards and src.files()[0][1] == os.path.getsize(shards[0])
    assert all(re.fullmatch(r"members:[0-9a-f]{16}\+data:[0-9a-f]{16}", f[2]) for f in src.files())
    check_same_files(d, src)
    check_same_files(src.files(), tar_shards(shards))


def test_copies_elsewhere_and_touched_files_fingerprint_the_same(shards, tmp_path):
    src = tar_shards(str(tmp_path / "s"))
    copy_tree(tmp_path / "s", tmp_path / "copy")
    os.utime(tmp_path / "copy" / "shard-000001.tar", ns=(5, 5))     # another mtime: the same content
    copy = tar_shards(str(tmp_path / "copy"))
    assert copy.index_stats == {"cached": 0, "scanned": 3}           # (the copied caches are for other paths)
    assert copy.fingerprint() == src.fingerprint()
    check_same_files(describe_files(src), copy)
    check_same_files(src.files(), copy)
    # a list of files and a glob name the files relative to their folder too
    assert tar_shards([str(tmp_path / "copy" / "shard-000000.tar")]).files()[0][0] == "shard-000000.tar"
    assert tar_shards(str(tmp_path / "copy" / "*.tar")).fingerprint() == src.fingerprint()


def test_a_shard_with_other_members_but_the_same_name_and_size_is_named(shards, tmp_path):
    src = tar_shards(shards)
    with tarfile.open(shards[1]) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(shards[1], "w") as tf:   # the same members, the first two samples' keys swapped
        for m, data in members:
            m.name = m.name.replace("0000002", "XXX").replace("0000003", "0000002").replace("XXX", "0000003")
            tf.addfile(m, io.BytesIO(data))
    other = tar_shards(shards)
    assert other.files()[1][:2] == src.files()[1][:2] and other.files()[1][2] != src.files()[1][2]
    with pytest.raises(ValueError, match=r"file 1 differs: shard-000001\.tar \(size 10240, members:\w{16}\+data:\w{16}\) "
                                         r"when saved, shard-000001\.tar \(size 10240, members:\w{16}\+data:\w{16}\) "
                                         r"now"):
        check_same_files(src.files(), other)
    with pytest.raises(ValueError, match=r"file 1, shard-000001\.tar \(size 10240, members:\w{16}\+data:\w{16}\) now, "
                                         r"differs from the file list the state was saved with \(name, size or content\)"):
        check_same_files(describe_files(src), other)  # a description of up to 32 files names the file


def test_parquet_arrow_and_image_folders_fingerprint_by_content(tmp_path):
    write_parquet(tmp_path / "pq", [[3, 2], [4]])
    src = parquet(str(tmp_path / "pq"))
    assert [f[0] for f in src.files()] == ["part-000.parquet", "part-001.parquet"]
    assert all(f[2].startswith("footer:") for f in src.files())
    copy_tree(tmp_path / "pq", tmp_path / "pq2")
    assert parquet(str(tmp_path / "pq2")).fingerprint() == src.fingerprint()
    pq.write_table(table(0, 4), tmp_path / "pq2" / "part-001.parquet", row_group_size=2)   # other row groups
    with pytest.raises(ValueError, match=r"file 1 differs: part-001\.parquet"):
        check_same_files(src, parquet(str(tmp_path / "pq2")))

    os.makedirs(tmp_path / "ar")
    pa.feather.write_feather(table(0, 5), str(tmp_path / "ar" / "t.arrow"), chunksize=2)
    arrow = arrow_ipc(str(tmp_path / "ar"))
    copy_tree(tmp_path / "ar", tmp_path / "ar2")
    assert arrow_ipc(str(tmp_path / "ar2" / "t.arrow")).files() == arrow.files()
    assert arrow.files()[0][0] == "t.arrow" and arrow.files()[0][2].startswith("footer:")

    for cls, name in [("a", "x.png"), ("b", "y.png")]:
        os.makedirs(tmp_path / "img" / cls)
        (tmp_path / "img" / cls / name).write_bytes(b"12")
    images = image_folder(tmp_path / "img")
    assert images.files() == [["a/x.png", 2, "class:a"], ["b/y.png", 2, "class:b"]]
    shutil.copytree(tmp_path / "img", tmp_path / "img2")
    assert image_folder(tmp_path / "img2").fingerprint() == images.fingerprint()


def test_added_removed_and_renamed_files(shards, tmp_path):
    src = tar_shards(shards)
    fewer = tar_shards(shards[:2])
    with pytest.raises(ValueError, match=r"3 files when saved, 2 now; file 2 \(shard-000002\.tar\) is only in the list saved"):
        check_same_files(src, fewer)
    with pytest.raises(ValueError, match=r"2 files when saved, 3 now; file 2 \(shard-000002\.tar\) is only in the list of now"):
        check_same_files(fewer.files(), src)
    with pytest.raises(ValueError, match=r"2 files when saved, 3 now; file 2 \(shard-000002\.tar\) was not there"):
        check_same_files(describe_files(fewer), src)
    os.rename(shards[2], tmp_path / "s" / "shard-000009.tar")
    with pytest.raises(ValueError, match=r"file 2 differs: shard-000002\.tar .* when saved, shard-000009\.tar"):
        check_same_files(src, tar_shards(str(tmp_path / "s")))


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"describe_files: expected a source with files\(\) or a list of \[name, size, content\]"):
        describe_files("x")


def test_a_description_of_many_files_names_the_run_that_differs_and_stays_small():
    files = [[f"s/{k:06d}.tar", 100 + k, f"members:{k:016x}"] for k in range(1000)]
    d = describe_files(files)
    assert len(json.dumps(d)) < 450 and d["chunk"] == 32 and len(d["chunks"]) == 32
    changed = [list(f) for f in files]
    changed[500][1] += 1
    with pytest.raises(ValueError, match=r"files 480\.\.511 \(s/000480\.tar \.\. s/000511\.tar, one of them at least\) differs"):
        check_same_files(d, changed)
    check_same_files(d, files)
