"""Thread workers over a block shuffle of a local columnar source: the threads decode each lane's
next window ahead and the training thread cuts the batches (``seqloader.loader.epoch.read_ahead``).
Every executor: the batches are those of ``num_workers=0`` without any read-ahead (a source given
its own ``cache_blocks``), epoch after epoch and after a resume; no decoding thread outlives the
epochs. Under thread workers: each block decoded once an epoch, the batches cut in the training
thread, the decodes done on the decode threads; a ``worker_init_fn`` keeps the batches in the
worker threads."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import default_convert

import seqloader
from contract_fixtures import executor, no_leaks, ray_cluster  # noqa: F401 (fixtures)
from forking import wait_until
from seqloader.loader.epoch.read_ahead import read_ahead


def _ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("seqloader-ahead") and t.is_alive()]


@pytest.fixture
def files(tmp_path):
    """8 files x 4 row groups of 50 rows: ``id`` and a ``tokens`` list column of 16."""
    rng = np.random.default_rng(0)
    for f in range(8):
        ids = np.arange(f * 200, (f + 1) * 200, dtype=np.int64)
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 1000, 200 * 16, dtype=np.int32)), 16)
        pq.write_table(pa.table({"id": ids, "tokens": tokens}), os.path.join(tmp_path, f"part-{f}.parquet"),
                       row_group_size=50)
    return str(tmp_path)


def _loader(folder, cache_blocks=None, collate_fn=default_convert, **kw):
    src = seqloader.parquet(folder, columnar=True, cache_blocks=cache_blocks)
    return seqloader.DataLoader(src, batch_size=16, sampler=seqloader.BlockShuffleSampler(src, window=4, seed=1, lanes=2, chunk=16),
                                seed=0, collate_fn=collate_fn, **kw)


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _expected(folder):
    """Two epochs at ``num_workers=0`` with an explicit cache: nothing is read ahead (every loader
    here has the lanes of 2 workers, so that one order serves them all)."""
    plain = _loader(folder, cache_blocks=32)
    assert read_ahead(plain, plain.dataset, plain.sampler) is None
    assert plain.dataset.decode_ahead([0]) == 0
    return [b for _ in range(2) for b in plain]


def test_every_executor_gives_the_batches_of_num_workers_0(files, executor):
    loader = _loader(files, **executor)
    batches = [b for _ in range(2) for b in loader]
    expected = _expected(files)
    threads = executor.get("worker_method") == "thread"
    assert (read_ahead(loader, loader.dataset, loader.sampler) is not None) == threads
    assert len(batches) == len(expected) == 2 * 100
    assert all(_equal(a, b) for a, b in zip(batches, expected))
    assert wait_until(lambda: not _ahead_threads(), 60), _ahead_threads()


def test_a_resumed_epoch_matches_the_uninterrupted_one(files, executor):
    expected = _expected(files)[:100]
    first = _loader(files, **executor)
    it = iter(first)
    head = [next(it) for _ in range(37)]
    state = first.state_dict()
    del it
    resumed = _loader(files, **executor)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head + rest) == 100
    assert all(_equal(a, b) for a, b in zip(head + rest, expected))


def test_thread_workers_decode_on_their_threads_and_cut_the_batches_in_the_training_thread(files, no_leaks):
    cut_in = set()

    def collate(batch):
        cut_in.add(threading.current_thread().name)
        return default_convert(batch)

    loader = _loader(files, collate_fn=collate, num_workers=2, worker_method="thread")
    decoded_in = []
    src = loader.dataset
    decode = src._decode   # (the test looks inside the source: which thread decodes each block)

    def recording(state, blocks, slots):
        decoded_in.extend([threading.current_thread().name] * len(blocks))
        return decode(state, blocks, slots)

    src._decode = recording
    assert sum(1 for _ in loader) == 100
    assert src.counters()["blocks_decoded"] == 32                      # each block once
    assert sum(1 for _ in loader) == 100
    assert 32 < src.counters()["blocks_decoded"] <= 64                 # at most once more (some kept)
    assert cut_in == {threading.current_thread().name}
    assert any(name.startswith("seqloader-ahead") for name in decoded_in), decoded_in
    assert wait_until(lambda: not _ahead_threads(), 60), _ahead_threads()


def test_a_worker_init_fn_keeps_the_batches_in_the_worker_threads(files, no_leaks):
    cut_in, started = set(), []

    def collate(batch):
        cut_in.add(threading.current_thread().name)
        return default_convert(batch)

    loader = _loader(files, collate_fn=collate, num_workers=2, worker_method="thread", worker_init_fn=started.append)
    assert read_ahead(loader, loader.dataset, loader.sampler) is None
    batches = list(loader)
    assert sorted(started) == [0, 1]
    assert threading.current_thread().name not in cut_in
    assert all(_equal(a, b) for a, b in zip(batches, _expected(files)[:100]))
