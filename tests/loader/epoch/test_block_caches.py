"""The loader sizes a columnar source's cache of decoded blocks (``seqloader/loader/epoch/block_caches.py``):
with the defaults, a block-shuffled epoch decodes each row group once per process, on every executor;
an explicit ``cache_blocks`` stays as given; batches and resumes are those of any other size."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import default_convert

import seqloader
from seqloader.loader.epoch.block_caches import blocks_in_use, size_block_caches
from seqloader.prefetcher.options import ProcessWorkers, RayWorkers, ThreadWorkers
from seqloader.sources._arena import ArenaTooSmall
from seqloader.testing.resume import assert_resumes_exactly

GROUPS, ROWS, WIDTH, WINDOW, BATCH, LANES = 12, 16, 5, 3, 4, 2

#: (num_workers, worker_method, threads_per_worker)
EXECUTORS = [(0, "multiprocessing", 1), (2, "thread", 1), (2, "multiprocessing", 1), (2, "multiprocessing", 2)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 files of 4 row groups of 16 rows: a token column (16 x 5 int32) and a label."""
    path = tmp_path_factory.mktemp("tokens")
    for f in range(3):
        start = f * 4 * ROWS
        n = 4 * ROWS
        values = pa.array(np.arange(start * WIDTH, (start + n) * WIDTH, dtype=np.int32))
        tokens = pa.ListArray.from_arrays(pa.array(np.arange(0, n * WIDTH + 1, WIDTH, dtype=np.int32)), values)
        pq.write_table(pa.table({"tokens": tokens, "label": np.arange(start, start + n)}),
                       os.path.join(path, f"part-{f}.parquet"), row_group_size=ROWS)
    return str(path)


def _loader(src, num_workers, method, threads, **kw):
    extra = {} if num_workers == 0 else {"worker_method": method}
    if threads > 1:
        extra["threads_per_worker"] = threads
    sampler = seqloader.BlockShuffleSampler(src, window=WINDOW, seed=3, lanes=LANES)   # one order for all
    return seqloader.DataLoader(src, batch_size=BATCH, sampler=sampler, num_workers=num_workers, seed=0, **extra, **kw)


def _with_counters(src):
    """A collate that also returns its process id and that process's counters."""
    def collate(batch):
        return default_convert(batch), os.getpid(), src.counters()
    return collate


@pytest.mark.parametrize("executor,expected", [
    ((0, ProcessWorkers()), WINDOW * 2),                 # one lane (lanes = max(1, num_workers)), and the next window
    ((2, ThreadWorkers()), WINDOW * 3),                  # one cache, 2 lanes, and a lane's next window
    ((2, ProcessWorkers()), WINDOW * 2),                 # a cache per process, its own lane, and its next window
    ((2, ProcessWorkers(threads=2)), WINDOW * 2),        # (a thread moving on: the same next window)
    ((2, RayWorkers()), WINDOW * 2),                     # an actor is a process
])
def test_blocks_in_use_per_executor(executor, expected):
    num_workers, options = executor
    lanes = max(1, num_workers)
    assert blocks_in_use(WINDOW, lanes, GROUPS, num_workers, options) == expected


def test_blocks_in_use_when_lanes_and_workers_differ():
    """A state saved with 4 lanes, read by 2 processes: each reads 2 lanes; by 3: every lane."""
    assert blocks_in_use(2, 4, 100, 2, ProcessWorkers()) == 6
    assert blocks_in_use(2, 4, 100, 3, ProcessWorkers()) == 10
    assert blocks_in_use(2, 2, 100, 2, ProcessWorkers(), affinity=False) == 6    # in_order=False
    assert blocks_in_use(None, 2, 10, 2, ThreadWorkers()) == 10                  # a full shuffle: all
    assert blocks_in_use(50, 2, 10, 2, ThreadWorkers()) == 10                    # never more than all


@pytest.mark.parametrize("num_workers,method,threads", EXECUTORS)
def test_the_defaults_decode_each_row_group_once_per_epoch_per_process(folder, num_workers, method, threads):
    src = seqloader.parquet(folder, columnar=True)
    loader = _loader(src, num_workers, method, threads, collate_fn=_with_counters(src), persistent_workers=False)
    seen: dict[int, dict] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArenaTooSmall)
        for _, pid, counters in loader:
            seen[pid] = counters
    assert sum(c["blocks_decoded_again"] for c in seen.values()) == 0
    # the last batch a process computed saw its counters almost at the end: each group at most once
    for counters in seen.values():
        assert counters["blocks_decoded"] <= GROUPS
    # (a collate of the user's: worker processes compute whole batches; thread workers decode ahead)
    ahead = method == "thread" and threads == 1
    if num_workers == 0 or ahead:   # the training process's own arena: the whole epoch
        assert src.counters()["blocks_decoded"] == GROUPS
        assert src.counters()["items_read"] == GROUPS * ROWS
    # thread workers decode each lane's next window ahead (seqloader.loader.epoch.read_ahead): a window more per lane
    expected = {(0, 1): 3 * WINDOW,                           # one process reads both lanes, and a next window
                (2, 1): min(GROUPS, 5 * WINDOW) if ahead else 2 * WINDOW,   # threads: one cache
                (2, 2): 2 * WINDOW}[num_workers, threads]       # its lane, and its next window
    assert src.cache_blocks == expected == blocks_in_use(WINDOW, LANES, GROUPS, num_workers, loader.executor,
                                                         ahead=ahead)


def test_the_batch_that_crosses_windows_finds_slots(folder, monkeypatch):
    """With the loader's size, every row group decoded goes into the reused buffers: the batch that
    reads the end of one window and the start of the next finds a slot for each of its groups (with
    one window, the next window's groups would be kept outside them and gathered group by group)."""
    from seqloader.sources._slots import Slots

    stored: list = []
    store = Slots.store

    def recording(self, cols, slot, *args, **kw):
        stored.append(slot)
        return store(self, cols, slot, *args, **kw)

    monkeypatch.setattr(Slots, "store", recording)
    src = seqloader.parquet(folder, columnar=True)
    sampler = seqloader.BlockShuffleSampler(src, window=WINDOW, seed=3, lanes=1)
    got = list(seqloader.DataLoader(src, batch_size=BATCH + 1, sampler=sampler, num_workers=0, seed=0,
                                    collate_fn=default_convert))
    assert src.cache_blocks == 2 * WINDOW < GROUPS
    assert len(stored) == GROUPS and None not in stored
    rows = np.concatenate([b["label"].numpy() for b in got])
    assert sorted(rows.tolist()) == list(range(GROUPS * ROWS))


def test_a_second_epoch_decodes_each_row_group_once_more(folder):
    src = seqloader.parquet(folder, columnar=True)
    loader = _loader(src, 2, "thread", 1, collate_fn=default_convert)
    for _ in range(2):
        for _ in loader:
            pass
    assert src.counters()["blocks_decoded"] <= 2 * GROUPS   # (an epoch's end and the next one's start may
    # count as "again": a block evicted late in one epoch is among the first of the next)


def test_an_explicit_cache_blocks_is_kept_as_given(folder):
    src = seqloader.parquet(folder, columnar=True, cache_blocks=1)
    loader = _loader(src, 2, "thread", 1, collate_fn=default_convert)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArenaTooSmall)
        batches = list(loader)
    assert src.cache_blocks == 1
    assert src.counters()["blocks_decoded"] > GROUPS    # too small: decoded again, as asked
    reference = list(_loader(seqloader.parquet(folder, columnar=True), 0, "", 1, collate_fn=default_convert))
    assert len(batches) == len(reference)
    for a, b in zip(batches, reference):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["label"], b["label"])


def test_other_orders_leave_the_default(folder):
    src = seqloader.parquet(folder, columnar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArenaTooSmall)   # (a full shuffle over 8 of 12 row groups)
        for _ in seqloader.DataLoader(src, batch_size=BATCH, shuffle=True, num_workers=0, seed=0,
                                      collate_fn=default_convert):
            pass
    assert src.cache_blocks == 8
    size_block_caches(src, None, 2, ThreadWorkers())
    assert src.cache_blocks == 8


def test_growing_keeps_the_counters_and_only_grows(folder):
    src = seqloader.parquet(folder, columnar=True)
    src.__getitems__([0, 1, ROWS])
    before = src.counters()
    assert src.size_cache(20) == 20 and src.size_cache(10) == 20 and src.size_cache(30) == 30
    assert src.counters() == before
    src.__getitems__([0, 2 * ROWS])
    assert src.counters()["blocks_decoded"] == before["blocks_decoded"] + 2   # a new arena: decoded again


def test_batches_are_the_same_on_every_executor_and_with_any_cache(folder):
    def epoch(src, *args):
        return [(b["tokens"], b["label"]) for b in _loader(src, *args, collate_fn=default_convert)]

    reference = epoch(seqloader.parquet(folder, columnar=True, cache_blocks=GROUPS), 0, "", 1)
    # every row once, in 2-D rows of the file's tokens
    labels = torch.cat([b for _, b in reference])
    assert sorted(labels.tolist()) == list(range(GROUPS * ROWS))
    tokens = torch.cat([t for t, _ in reference])
    assert torch.equal(tokens[:, 0], labels.to(torch.int32) * WIDTH)
    for num_workers, method, threads in EXECUTORS:
        got = epoch(seqloader.parquet(folder, columnar=True), num_workers, method, threads)
        assert len(got) == len(reference)
        for (t, lab), (rt, rl) in zip(got, reference):
            assert torch.equal(t, rt) and torch.equal(lab, rl)


def test_a_kept_batch_is_never_written_over(folder):
    """Batches gathered into reused arrays: one the loop keeps stays as it was."""
    src = seqloader.parquet(folder, columnar=True)
    kept = list(_loader(src, 2, "thread", 1, collate_fn=default_convert))
    again = list(_loader(seqloader.parquet(folder, columnar=True), 0, "", 1, collate_fn=default_convert))
    for a, b in zip(kept, again):
        assert torch.equal(a["tokens"], b["tokens"])
    views = [b["tokens"][0] for b in _loader(src, 0, "", 1, collate_fn=default_convert)]   # rows kept only
    assert [v.tolist() for v in views] == [b["tokens"][0].tolist() for b in again]


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_the_defaults_resume_exactly(folder, method):
    def make(num_workers):
        return _loader(seqloader.parquet(folder, columnar=True), num_workers, method, 1, collate_fn=default_convert)

    assert_resumes_exactly(make, stops=[0, 5, -1])


def test_two_loaders_over_one_source_read_it_at_once(folder):
    """Each loader sizes the shared source when its epoch opens (the second grows the arena while
    the first one's threads read it): both read their batches exactly."""
    src = seqloader.parquet(folder, columnar=True)
    reference = list(_loader(seqloader.parquet(folder, columnar=True, cache_blocks=GROUPS), 0, "", 1,
                             collate_fn=default_convert))
    threads = iter(_loader(src, 2, "thread", 1, collate_fn=default_convert))
    first = next(threads)
    assert src.cache_blocks == min(GROUPS, 5 * WINDOW)   # (thread workers decode ahead: a window more per lane)
    more = seqloader.DataLoader(src, batch_size=BATCH, num_workers=2, worker_method="thread", seed=0,
                                sampler=seqloader.BlockShuffleSampler(src, window=2 * GROUPS, seed=3, lanes=LANES),
                                collate_fn=default_convert)
    got, others = [first], []
    for b in more:   # (the second loader's epoch opens after the first's first batch, and grows the arena)
        assert src.cache_blocks == GROUPS
        others.append(b)
        got += [a for a in [next(threads, None)] if a is not None]
    assert len(got) == len(reference) == len(others)
    assert sorted(torch.cat([b["label"] for b in others]).tolist()) == list(range(GROUPS * ROWS))
    for a, b in zip(got, reference):
        assert torch.equal(a["tokens"], b["tokens"])


@pytest.mark.parametrize("num_workers,method,threads,given,expected", [
    (2, "multiprocessing", 2, None, WINDOW * ROWS // (2 * BATCH)),   # derived: half a lane's window
    (2, "multiprocessing", 2, 3, 3),                                 # given: kept
    # thread workers and plain worker processes decode ahead, the batches cut in this thread: no prefetcher
    (2, "multiprocessing", 1, None, None),
    (2, "multiprocessing", 1, 3, None),
    (2, "thread", 1, None, None),
])
def test_worker_processes_read_a_block_shuffle_half_a_window_ahead(folder, monkeypatch, num_workers, method,
                                                                   threads, given, expected):
    """Left out, ``prefetch_factor`` becomes half a lane's window of batches for worker processes
    (``prefetch_depth``): one worker's window decode no longer stalls the in-order read. The
    batches are those of ``prefetch_factor=2``."""
    from seqloader.loader.workers import pool

    asked = []
    made = pool.prefetch
    monkeypatch.setattr(pool, "prefetch", lambda *a, **kw: asked.append(kw["prefetch_factor"]) or made(*a, **kw))
    src = seqloader.parquet(folder, columnar=True)
    kw = {} if given is None else {"prefetch_factor": given}
    got = list(_loader(src, num_workers, method, threads, collate_fn=default_convert, **kw))
    assert asked == ([] if expected is None else [expected])
    reference = list(_loader(seqloader.parquet(folder, columnar=True), num_workers, method, threads,
                             collate_fn=default_convert, prefetch_factor=2))
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["label"], b["label"])
