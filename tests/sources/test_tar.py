"""``seqloader.tar_shards``: samples against tarfile's own read, the index cache, bad shards, the loader."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

import seqloader
from forking import wait_until
from seqloader.sources import tar_shards
from seqloader.sources._tar_cache import FORMAT
from seqloader.testing import assert_resumes_exactly

from sources_helpers import read_tar_directly, write_shards

COUNTS = [4, 0, 7, 3]
N = sum(COUNTS)


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path / "shards", COUNTS)


def beside(path):
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.seqloader-index.json")


def test_samples_equal_tarfiles_read(shards):
    src = tar_shards(shards)
    want = [s for p in shards for s in read_tar_directly(p)]
    assert len(src) == N == len(want)
    assert [src[i] for i in range(-N, N)] == want + want
    order = np.random.default_rng(1).permutation(N).tolist()
    assert src.__getitems__(order) == [want[i] for i in order]
    assert list(src) == want
    assert src.blocks().tolist() == [4, 4, 11, 14]
    assert repr(src) == f"tar_shards(shards=4, len={N})"


def test_local_shards_start_no_thread_once_indexed(shards):
    """The shards are indexed on a pool of threads, stopped once the index is built: reading local
    shards needs none, so an epoch over them leaves no seqloader thread running."""
    import threading

    def pool():
        return {t for t in threading.enumerate() if t.name.startswith("seqloader-thread")}

    before = pool()
    src = tar_shards(shards, num_threads=4)
    assert len(list(seqloader.DataLoader(src, batch_size=None, num_workers=0, seed=0))) == N
    # the pool was told to stop and joined against a deadline: on a busy machine a thread may take
    # longer to end, so wait for it (generously) rather than look once
    assert wait_until(lambda: not pool() - before, 60), pool() - before


def test_extensions_and_transform(shards):
    src = tar_shards(shards, extensions=["cls"], transform=lambda s: (s["__key__"], int(s["cls"])))
    assert src[12] == ("sample0000012", 2) and src.__getitems__([0, 13]) == [("sample0000000", 0), ("sample0000013", 3)]
    assert tar_shards(shards, extensions=[".TXT"])[1] == {"__key__": "sample0000001", "txt": b"text 1" * 2}
    with pytest.raises(ValueError, match=r"shard-000000\.tar has no 'jpg' members \(its fields: txt, cls\)"):
        tar_shards(shards, extensions=["jpg"])


def test_the_index_is_cached_beside_the_shards_as_json_and_reused(shards):
    first = tar_shards(shards)
    assert first.index_stats == {"cached": 0, "scanned": 4}
    with open(beside(shards[2])) as f:
        cached = json.load(f)
    assert cached["format"] == FORMAT and cached["size"] == os.path.getsize(shards[2]) and len(cached["keys"]) == 7
    again = tar_shards(shards)
    assert again.index_stats == {"cached": 4, "scanned": 0}
    assert list(again) == list(first)
    assert tar_shards(shards, use_cache=False).index_stats == {"cached": 0, "scanned": 4}


def test_a_changed_shard_is_indexed_again(shards, tmp_path):
    tar_shards(shards)
    write_shards(tmp_path / "new", [5], start=100)
    os.replace(tmp_path / "new" / "shard-000000.tar", shards[2])
    os.utime(shards[2], ns=(1, 1))
    src = tar_shards(shards)
    assert src.index_stats == {"cached": 3, "scanned": 1}
    assert len(src) == N - 2 and src[4]["__key__"] == "sample0000100"
    os.utime(shards[2], ns=(2, 2))  # the same bytes, another mtime: indexed again too
    assert tar_shards(shards).index_stats == {"cached": 3, "scanned": 1}


def test_a_cache_folder_instead_of_beside_and_the_fallback_when_beside_is_not_writable(shards, tmp_path):
    src = tar_shards(shards, cache_dir=str(tmp_path / "cache"))
    assert not os.path.exists(beside(shards[0])) and len(os.listdir(tmp_path / "cache")) == 4
    assert tar_shards(shards, cache_dir=str(tmp_path / "cache")).index_stats["cached"] == 4
    os.makedirs(beside(shards[0]))  # a folder where the cache file would go: it cannot be written there
    os.environ["SEQLOADER_CACHE"] = str(tmp_path / "user-cache")
    try:
        fallback = tar_shards(shards)
        assert fallback.index_stats == {"cached": 0, "scanned": 4}
        assert len(os.listdir(tmp_path / "user-cache" / "tar-index")) == 1
        assert tar_shards(shards).index_stats == {"cached": 4, "scanned": 0}
    finally:
        del os.environ["SEQLOADER_CACHE"]
    assert list(fallback) == list(src)


def test_a_half_written_or_foreign_cache_file_is_ignored_and_replaced(shards):
    tar_shards(shards)
    with open(beside(shards[0]), "w") as f:
        f.write('{"format": "seqloader.tar_index", "keys": [')   # what a crashed non-atomic writer leaves
    with pytest.warns(UserWarning, match=r"ignoring the cached index .*\.shard-000000\.tar\.seqloader-index\.json of "
                                         r".*shard-000000\.tar \(not JSON"):
        src = tar_shards(shards)
    assert src.index_stats == {"cached": 3, "scanned": 1} and src[0]["__key__"] == "sample0000000"
    with open(beside(shards[0])) as f:
        assert json.load(f)["format"] == FORMAT


_BUILDER = """
import os, sys
from seqloader.sources import tar_shards
shards = sys.argv[1:]
for _ in range(25):
    for s in shards:
        try:
            os.unlink(os.path.join(os.path.dirname(s), "." + os.path.basename(s) + ".seqloader-index.json"))
        except FileNotFoundError:
            pass
    src = tar_shards(shards, num_threads=2)
    assert len(src) == {n} and src[-1]["__key__"] == "sample{last:07d}", (len(src), src[-1])
"""


@pytest.mark.mp
@pytest.mark.timeout(300)
def test_concurrent_builders_never_read_a_half_written_index(shards):
    """Two processes delete and rebuild the caches 25 times each while this one reads them: every
    cache file read is whole JSON (written under a temporary name, then renamed)."""
    code = _BUILDER.format(n=N, last=N - 1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", code, *shards], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    reads = 0
    try:
        while any(p.poll() is None for p in procs):
            for s in shards:
                try:
                    with open(beside(s)) as f:
                        text = f.read()
                except FileNotFoundError:
                    continue
                assert json.loads(text)["format"] == FORMAT
                reads += 1
    finally:
        errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert reads > 0
    assert not [n for n in os.listdir(os.path.dirname(shards[0])) if ".tmp-" in n]


def _corrupt(path, offset, data=b"\xff" * 8):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_corrupt_shard_names_the_shard_and_the_offset(shards):
    with tarfile.open(shards[2]) as tf:
        third = tf.getmembers()[2]
    _corrupt(shards[2], third.offset + 148)   # the header's checksum field
    with pytest.raises(ValueError, match=rf"shard-000002\.tar is corrupt at offset {third.offset} "):
        tar_shards(shards)


def test_a_truncated_shard_is_named(shards, tmp_path):
    with tarfile.open(shards[0]) as tf:
        txt = tf.getmembers()[-2]
    with open(shards[0], "r+b") as f:
        f.truncate(txt.offset_data + 2)
    with pytest.raises(ValueError, match=rf"shard-000000\.tar is truncated: member 'sample0000003.txt' at offset "
                                         rf"{txt.offset} needs {txt.offset_data + txt.size} bytes, the file has "
                                         rf"{txt.offset_data + 2}"):
        tar_shards(shards[0])
    with tarfile.open(shards[2]) as tf:
        last = tf.getmembers()[-1]
    with open(shards[2], "r+b") as f:   # cut inside the padding after the last member's data
        f.truncate(last.offset_data + 100)
    with pytest.raises(ValueError, match=rf"shard-000002\.tar is corrupt at offset {last.offset_data + 512} "
                                         r"\(unexpected end of data\)"):
        tar_shards(shards[2])


def test_not_a_tar_and_duplicate_fields(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(2048))
    with pytest.raises(ValueError, match=r"junk\.tar is not a tar file or is corrupt at offset 0"):
        tar_shards(str(junk))
    dup = tmp_path / "dup.tar"
    with tarfile.open(dup, "w") as tf:
        for name in ("a.txt", "a.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match=r"dup\.tar: sample 'a' has two 'txt' members \(the second at offset 1024\)"):
        tar_shards(str(dup))


def test_compressed_shards_say_why_they_cannot_be_read_and_what_to_do(shards, tmp_path):
    gz = tmp_path / "shard.tar.gz"
    with open(shards[0], "rb") as f:
        gz.write_bytes(gzip.compress(f.read()))
    with pytest.raises(ValueError, match=r"shard\.tar\.gz is a gzip-compressed tar, which cannot be read at random "
                                         r"positions .*decompress the shards"):
        tar_shards(str(gz))
    disguised = tmp_path / "disguised.tar"
    disguised.write_bytes(gz.read_bytes())
    with pytest.raises(ValueError, match="disguised.tar is a gzip-compressed tar"):
        tar_shards(str(disguised))


def test_a_missing_shard_and_a_shard_changed_after_indexing(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file or directory.*shard-000009\.tar"):
        tar_shards([shards[0], str(tmp_path / "shards" / "shard-000009.tar")])
    src = tar_shards(shards)
    with open(shards[3], "ab") as f:
        f.write(b"\0" * 1024)
    assert src[0]["__key__"] == "sample0000000"
    with pytest.raises(RuntimeError, match=r"shard-000003\.tar changed since it was indexed \(size 10240, "):
        src[N - 1]
    os.remove(shards[2])
    with pytest.raises(FileNotFoundError, match=r"shard-000002\.tar"):
        src.__getitems__([0, 5])


def test_pickles_small_and_reads_the_same(shards):
    src = tar_shards(shards)
    src[3]
    clone = pickle.loads(pickle.dumps(src))
    assert list(clone) == list(src)


def test_resolve_skips_hidden_files_and_other_suffixes(shards, tmp_path):
    tar_shards(shards)  # writes .shard-*.tar.seqloader-index.json beside them
    (tmp_path / "shards" / "README.md").write_text("not a shard")
    assert tar_shards(str(tmp_path / "shards")).paths() == shards


# -- the loader ----------------------------------------------------------------------------------

def decode(sample):
    """A picklable transform: the class and the text length, as ints."""
    return int(sample["cls"]), len(sample["txt"]), sample["__key__"]


def _make(num_workers, folder=None):
    src = tar_shards(folder, transform=decode)
    return seqloader.DataLoader(src, batch_size=3, shuffle=True, seed=2, num_workers=num_workers)


@pytest.mark.mp
def test_the_loader_resumes_exactly_with_another_num_workers(shards, tmp_path):
    import functools

    make = functools.partial(_make, folder=str(tmp_path / "shards"))
    epoch = list(make(0))
    keys = sorted(k for b in epoch for k in b[2])
    assert keys == [f"sample{i:07d}" for i in range(N)]
    assert_resumes_exactly(make, stops=[1, -2], spawn=True)


def test_samples_without_a_selected_field_and_a_transform_error_naming_the_item(tmp_path):
    path = tmp_path / "mixed.tar"
    with tarfile.open(path, "w") as tf:
        for name in ("a.txt", "a.cls", "b.cls", "c.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    src = tar_shards(str(path), extensions=["txt"])
    assert src.__getitems__([1, 2, 0]) == [{"__key__": "b"}, {"__key__": "c", "txt": b"1"}, {"__key__": "a", "txt": b"1"}]

    def bad(sample):
        raise KeyError(sample["__key__"])

    with pytest.raises(KeyError, match="c") as info:
        tar_shards(str(path), transform=bad).__getitems__([2, 0])
    assert "at item 2" in info.value.__notes__[0]


# -- issue 26: never other bytes ---------------------------------------------------------------

def write_issue_shard(path, order=range(20)):
    """The issue's shard: 20 samples x 2 members (``000.jpg``, ``000.cls``, ...): 51,200 bytes."""
    with tarfile.open(path, "w") as tf:
        for j in order:
            for ext, data in (("jpg", f"image {j:03d}".encode()), ("cls", str(j).encode())):
                info = tarfile.TarInfo(f"{j:03d}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tf.addfile(info, io.BytesIO(data))


def test_a_shard_cut_at_a_member_boundary_is_refused_at_index_time_and_when_indexed_again(tmp_path):
    path = str(tmp_path / "cut.tar")
    write_issue_shard(path)
    assert os.path.getsize(path) == 51200 and len(tar_shards(path)) == 20   # indexed and cached whole
    os.truncate(path, 25600)   # what an interrupted copy leaves: 12.5 samples, the cut between two members
    want = (r"cut\.tar is truncated: the archive stops at offset 25600 without its end-of-archive marker \(two zero "
            r"blocks; 0 of 1024 bytes there\): the shard was cut short")
    with pytest.raises(ValueError, match=want):
        tar_shards(path)                       # the cached index is stale (another size): indexed again
    with pytest.raises(ValueError, match=want):
        tar_shards(path, use_cache=False)
    with open(path, "r+b") as f:               # zeros where the members were (a crash's zero-filled tail)
        f.truncate(51200)
    with pytest.raises(ValueError, match=r"cut\.tar stops at offset 25600, 25600 bytes before the end of the file .*"
                                         r"its end was zeroed \(a crash\?\)"):
        tar_shards(path)
    write_issue_shard(path)
    with open(path, "r+b") as f:               # all 40 members, then one zero block of the two
        f.truncate(40 * 1024 + 512)
    with pytest.raises(ValueError, match=r"stops at offset 40960 .*\(two zero blocks; 512 of 1024 bytes there\)"):
        tar_shards(path)


def test_data_after_the_end_of_archive_marker_is_refused(tmp_path):
    a, b = str(tmp_path / "a.tar"), str(tmp_path / "b.tar")
    write_issue_shard(a, range(3))
    write_issue_shard(b, range(3, 5))
    with open(a, "ab") as f, open(b, "rb") as g:
        f.write(g.read())    # `cat a.tar b.tar`: tarfile (and GNU tar without -i) stop at the first marker
    with pytest.raises(ValueError, match=r"a\.tar holds data at offset 10240, after its end-of-archive marker "
                                         r"\(at offset 6144\)"):
        tar_shards(a)
    with open(a, "r+b") as f:
        f.truncate(6144)
        f.truncate(6144 + 1024 + 10240)   # the largest tail of zeros a writer leaves: accepted
    assert len(tar_shards(a)) == 3
    with open(a, "r+b") as f:
        f.truncate(6144 + 1024 + 10240 + 512)
    with pytest.raises(ValueError, match=r"a\.tar stops at offset 6144, 11776 bytes before the end of the file"):
        tar_shards(a)


def test_keys_whose_members_are_not_consecutive_are_refused_naming_shard_and_key(tmp_path):
    path = tmp_path / "split.tar"
    with tarfile.open(path, "w") as tf:
        for name in ("000.jpg", "001.jpg", "000.cls", "001.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match=r"split\.tar: the members of sample '000' are not consecutive \('000\.cls' "
                                         r"at offset 2048 comes after other samples\)"):
        tar_shards(str(path))


def test_a_folder_of_only_compressed_shards_says_they_are_compressed_and_what_to_do(shards, tmp_path):
    os.makedirs(tmp_path / "gz")
    for k, p in enumerate(shards[:2]):
        with open(p, "rb") as f:
            (tmp_path / "gz" / f"shard-{k}.tar.gz").write_bytes(gzip.compress(f.read()))
    with pytest.raises(ValueError, match=r"tar_shards: .*gz holds no \.tar file, only 2 compressed tar\(s\) "
                                         r"\(.*shard-0\.tar\.gz: gzip\), which cannot be read at random positions.*"
                                         r"decompress them"):
        tar_shards(str(tmp_path / "gz"))
    (tmp_path / "gz" / "notes.txt").write_text("x")
    os.makedirs(tmp_path / "other")
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"the folder holds no file ending in \.tar"):
        tar_shards(str(tmp_path / "other"))


def test_a_shard_replaced_by_one_of_the_same_size_and_mtime_is_detected(tmp_path):
    """The issue's case: ``cp -p`` of another shard of the same size. The old cached index must not be
    applied to it ("000" with sample 009's bytes), and a source built before must refuse to read it."""
    path, other = str(tmp_path / "s.tar"), str(tmp_path / "other.tar")
    write_issue_shard(path)
    before = tar_shards(path)
    assert before[0] == {"__key__": "000", "jpg": b"image 000", "cls": b"0"}
    write_issue_shard(other, range(19, -1, -1))           # the same members in another order: the same size
    st = os.stat(path)
    os.replace(other, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))   # and the same mtime
    assert os.path.getsize(path) == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    after = tar_shards(path)
    assert after.index_stats == {"cached": 0, "scanned": 1}      # another inode and ctime: indexed again
    assert after[0] == {"__key__": "019", "jpg": b"image 019", "cls": b"19"}
    assert all(s["jpg"] == f"image {s['__key__']}".encode() for s in after)
    with pytest.raises(RuntimeError, match=r"s\.tar changed since it was indexed \(size 51200, mtime_ns:\d+,"
                                           r"ctime_ns:\d+,ino:\d+ then"):
        before[0]


def test_a_cached_index_whose_validator_still_matches_is_checked_against_the_member_headers(tmp_path):
    """Where inode and ctime cannot tell (reused inode numbers, coarse clocks), the probed member
    headers do: the cache is ignored with a warning and the shard indexed again."""
    from seqloader.sources._listing import local_info

    path, other = str(tmp_path / "s.tar"), str(tmp_path / "other.tar")
    write_issue_shard(path)
    tar_shards(path)
    write_issue_shard(other, range(19, -1, -1))
    os.replace(other, path)
    with open(beside(path)) as f:
        cached = json.load(f)
    cached["file_version"] = local_info(path).version   # as if the validator could not tell them apart
    with open(beside(path), "w") as f:
        json.dump(cached, f)
    with pytest.warns(UserWarning, match=r"ignoring the cached index .*\.s\.tar\.seqloader-index\.json of .*s\.tar "
                                         r"\(the member header at offset 0 differs from the one indexed, although the "
                                         r"shard's size and validator are the same\)"):
        src = tar_shards(path)
    assert src.index_stats == {"cached": 0, "scanned": 1}
    assert src[0] == {"__key__": "019", "jpg": b"image 019", "cls": b"19"}


def test_a_transform_error_names_the_shard_and_the_key(shards):
    def bad(sample):
        raise ValueError("cannot decode")

    with pytest.raises(ValueError, match="cannot decode") as info:
        tar_shards(shards, transform=bad)[5]
    assert info.value.__notes__[-1] == f"tar_shards: sample 'sample0000005' of {shards[2]}"
