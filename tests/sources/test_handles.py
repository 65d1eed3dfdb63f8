"""``sources/_handles.py``: the one cache of open files of every source (leases, eviction: its doctest;
reads from many threads: ``test_storage.py``)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from seqloader.sources._handles import HandleCache

pytest.importorskip("pyarrow")


def test_the_handle_cache_belongs_to_a_process_and_pickles_empty(tmp_path):
    path = str(tmp_path / "f.bin")
    with open(path, "wb") as f:
        f.write(b"x")
    cache = HandleCache(capacity=2, close=os.close)
    with cache.lease(0, lambda: os.open(path, os.O_RDONLY)) as fd:
        assert os.pread(fd, 1, 0) == b"x"
    copy = pickle.loads(pickle.dumps(cache))   # a descriptor is never sent to another process
    assert len(cache) == 1 and len(copy) == 0 and copy.capacity == 2 and cache.leased() == 0


def test_threads_read_one_parquet_source_each_through_its_own_file_object(tmp_path):
    """pyarrow's ``ParquetFile`` must not be read from two threads at once (eight threads reading one
    crashed the process or raised "ReadRangeCache did not find matching cache entry"): the source
    keeps one per file and thread. Run in a child process, so that a crash fails the test."""
    code = textwrap.dedent(f"""
        import sys, threading
        import pyarrow as pa, pyarrow.parquet as pq
        import seqloader
        path = {str(tmp_path / "t.parquet")!r}
        pq.write_table(pa.table({{"i": list(range(4000)), "s": [str(i) for i in range(4000)]}}), path,
                       row_group_size=50)
        src = seqloader.parquet(path, cache_blocks=1)
        errors = []
        def read(t):
            for k in range(200):
                p = (t * 977 + k * 53) % 4000
                if int(src[p]["i"]) != p or src[p]["s"] != str(p):
                    errors.append(p)
        sys.setswitchinterval(1e-6)
        threads = [threading.Thread(target=read, args=(t,)) for t in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors[:5]
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
