"""Listing and range reads (``seqloader.sources._listing``, ``_storage``): validators that ``utime``
cannot fool, relative names, and the warning for filesystems without a strong validator."""

from __future__ import annotations

import os
import warnings

import pytest

from seqloader.sources import parquet, tar_shards
from seqloader.sources._listing import common_root, local_info, remote_version, resolve
from seqloader.sources._storage import Files

from sources_helpers import write_parquet, write_shards

fsspec = pytest.importorskip("fsspec")


def replace_keeping_size_and_mtime(path, data):
    """What ``cp -p`` or ``rsync -t`` of another file of the same size does."""
    st = os.stat(path)
    assert len(data) == st.st_size
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def rewrite_in_place_keeping_mtime(path, data):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("replace", [replace_keeping_size_and_mtime, rewrite_in_place_keeping_mtime])
def test_a_file_changed_with_the_same_size_and_mtime_is_detected_at_read_time(tmp_path, replace):
    path = str(tmp_path / "f.bin")
    with open(path, "wb") as f:
        f.write(b"0123456789")
    files = Files("demo", resolve("demo", path, None))
    assert files.read(0, 0, 4) == b"0123"
    assert files.infos[0].version.startswith("mtime_ns:") and ",ctime_ns:" in files.infos[0].version
    replace(path, b"abcdefghij")
    assert os.path.getsize(path) == 10
    with pytest.raises(RuntimeError, match=r"demo: .*f\.bin changed since it was indexed \(size 10, mtime_ns:(\d+),"
                                           r"ctime_ns:\d+,ino:\d+ then; size 10, mtime_ns:\1,"):
        files.read(0, 0, 4)


def test_names_are_relative_to_the_folder_given_and_contents_are_the_sources(tmp_path):
    paths = write_shards(tmp_path / "a" / "b", [1, 2])
    files = Files("demo", resolve("demo", str(tmp_path / "a"), (".tar",)))
    assert files.root == str(tmp_path / "a") and files.names() == ["b/shard-000000.tar", "b/shard-000001.tar"]
    assert files.describe() == [["b/shard-000000.tar", os.path.getsize(paths[0]), ""],
                                ["b/shard-000001.tar", os.path.getsize(paths[1]), ""]]
    listing = resolve("demo", [paths[1], str(tmp_path / "a" / "b" / "*0.tar")], None)
    assert listing.root == str(tmp_path / "a" / "b") and [f.path for f in listing.infos] == [paths[1], paths[0]]
    assert common_root(["/x/y", "/x/y/z", "/x/yy"]) == "/x" and common_root(["/a", "/b"]) == "/"


def test_remote_validators_prefer_the_version_id_and_the_etag():
    assert remote_version({"ETag": '"e1"', "LastModified": 3}) == ("etag:e1", True)
    assert remote_version({"generation": 7, "md5Hash": "m"}) == ("version:7,etag:m", True)
    assert remote_version({"mtime": 3.5}) == ("mtime:3.5", False)
    assert remote_version({"mtime": 3.5, "created": 4.0, "ino": 9}) == ("mtime:3.5,ctime:4.0,ino:9", True)  # local
    assert remote_version({}) == ("", False)


def test_a_filesystem_without_a_strong_validator_warns_once_per_process_and_filesystem(tmp_path):
    import io
    import tarfile

    fs = fsspec.filesystem("memory")
    for k in range(2):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo(f"s{k}.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
        fs.pipe(f"/weak-{id(tmp_path)}/shard-{k}.tar", buf.getvalue())
    url = f"memory:///weak-{id(tmp_path)}"
    with pytest.warns(UserWarning, match=r"tar_shards: the memory:// filesystem gives no ETag or version id for "
                                         r"memory:///weak-\d+/shard-0\.tar: a file replaced by one of the same size "
                                         r"\(and modification time\) cannot be detected there; see 'What seqloader "
                                         r"checks, and what it cannot' in docs/data\.md") as caught:
        src = tar_shards(url, cache_dir=str(tmp_path / "cache"))
    assert len([w for w in caught if "memory://" in str(w.message)]) == 1
    assert [s["__key__"] for s in src] == ["s0", "s1"]
    assert src.files()[0][0] == "shard-0.tar"
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per process and filesystem: not again
        tar_shards(url, cache_dir=str(tmp_path / "cache"))


def test_local_info_follows_links_and_its_validator_survives_utime(tmp_path):
    target = tmp_path / "t.parquet"
    write_parquet(tmp_path / "d", [[2]])
    os.replace(tmp_path / "d" / "part-000.parquet", target)
    os.symlink(target, tmp_path / "link.parquet")
    a = local_info(str(tmp_path / "link.parquet"))
    assert a.size == os.path.getsize(target) and a.version == local_info(str(target)).version
    st = os.stat(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))   # the same times, set back: ctime moves on
    assert local_info(str(target)).version != a.version
    assert len(parquet(str(tmp_path / "link.parquet"))) == 2


def test_concurrent_reads_never_read_through_a_descriptor_another_thread_closed(tmp_path, monkeypatch):
    """More files than open descriptors, read from 8 threads: a descriptor evicted from the LRU while
    a thread reads through it stays open until that read ends (its number cannot go to another file)."""
    import sys
    import threading

    from seqloader.sources import _storage

    monkeypatch.setattr(_storage, "MAX_OPEN", 2)
    paths = []
    for k in range(24):
        paths.append(str(tmp_path / f"f{k:02d}.bin"))
        with open(paths[-1], "wb") as f:
            f.write(bytes([k]) * 4096)
    files = Files("demo", resolve("demo", paths, None))
    errors = []

    def reader(t):
        for i in range(300):
            k = (t * 7 + i * 5) % 24
            data = files.read(k, 0, 4096, check=False)
            if data != bytes([k]) * 4096:
                errors.append((k, data[:1]))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len(files.descriptors) <= 2 and files.descriptors.leased() == 0
