"""``sources/_handles.py``: the one cache of open files of every source (leases, eviction: its doctest;
reads from many threads: ``test_storage.py``)."""

from __future__ import annotations

import os
import pickle

from seqloader.sources._handles import HandleCache


def test_the_handle_cache_belongs_to_a_process_and_pickles_empty(tmp_path):
    path = str(tmp_path / "f.bin")
    with open(path, "wb") as f:
        f.write(b"x")
    cache = HandleCache(capacity=2, close=os.close)
    with cache.lease(0, lambda: os.open(path, os.O_RDONLY)) as fd:
        assert os.pread(fd, 1, 0) == b"x"
    copy = pickle.loads(pickle.dumps(cache))   # a descriptor is never sent to another process
    assert len(cache) == 1 and len(copy) == 0 and copy.capacity == 2 and cache.leased() == 0
