"""Workers over a block shuffle of a local columnar source: thread workers (or worker processes)
decode each lane's next window ahead and the training thread cuts the batches
(``seqloader.loader.epoch.read_ahead``). Every executor: the batches are those of
``num_workers=0`` without any read-ahead (a source given its own ``cache_blocks``), epoch after
epoch and after a resume; no decoding thread outlives the epochs. Under thread workers: each block
decoded once an epoch, the batches cut in the training thread, the decodes done on the decode
threads; a ``worker_init_fn`` keeps the batches in the worker threads. Under worker processes: the
blocks decoded in the worker processes, written into the training process's shared buffers; the
processes an iterator's (or the loader's, with ``persistent_workers``); a process that dies raises,
naming it."""

from __future__ import annotations

import gc
import os
import signal
import threading

import pytest
import torch
from torch.utils.data import default_convert

import seqloader
from contract_fixtures import executor, no_leaks, ray_cluster  # noqa: F401 (fixtures)
from forking import wait_until
from leaks import children
from parquet_files import write_token_files
from seqloader.loader.epoch.read_ahead import read_ahead


def _ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("seqloader-ahead") and t.is_alive()]


@pytest.fixture
def files(tmp_path):
    """8 files x 4 row groups of 50 rows: ``id`` and a ``tokens`` list column of 16."""
    return write_token_files(tmp_path, files=8, rows=200, row_group=50, width=16)


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
    ahead = executor.get("worker_method") in ("thread", None) and "threads_per_worker" not in executor
    assert (read_ahead(loader, loader.dataset, loader.sampler) is not None) == ahead
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


def _decoding_in_processes(src):
    """Count the blocks the training process hands to decode processes (the test looks inside the
    source), and which columns came back written into the shared buffers."""
    handed, written = [], set()
    decode_by = src._decode_by

    def recording(decoders, state, blocks, slots):
        handed.extend(blocks)
        out = decode_by(decoders, state, blocks, slots)
        written.update(name for block, _ in out for name in block.slotted)
        return out

    src._decode_by = recording
    return handed, written


def test_worker_processes_decode_blocks_and_the_training_thread_cuts_the_batches(files, no_leaks):
    loader = _loader(files, num_workers=2)
    ahead = read_ahead(loader, loader.dataset, loader.sampler)
    assert ahead is not None and ahead.processes
    src, cut_in = loader.dataset, []
    handed, written = _decoding_in_processes(src)
    items = src._items   # (the test looks inside the source: where each batch is cut)

    def recording(positions):
        cut_in.append((os.getpid(), threading.current_thread().name))
        return items(positions)

    src._items = recording
    before = children()   # (a Ray cluster of the module's other cases may be running: not ours)
    it = iter(loader)
    batches = [next(it)]
    assert len(children() - before) == 2                          # the decode processes, while the epoch runs
    batches += list(it)
    assert all(_equal(a, b) for a, b in zip(batches, _expected(files)[:100]))
    assert cut_in == [(os.getpid(), threading.current_thread().name)] * 100
    assert handed and written == {"id", "tokens"}
    assert src.counters()["blocks_decoded"] == 32                # each block once
    assert wait_until(lambda: not children() - before, 60)       # the iterator's processes end with it


def _pid_collate(batch):
    return {**default_convert(batch), "pid": os.getpid()}


def test_a_collate_of_the_users_keeps_the_batches_in_the_worker_processes(files, no_leaks):
    loader = _loader(files, collate_fn=_pid_collate, num_workers=2)
    assert read_ahead(loader, loader.dataset, loader.sampler) is None
    batches = list(loader)
    assert os.getpid() not in {b.pop("pid") for b in batches}
    assert all(_equal(a, b) for a, b in zip(batches, _expected(files)[:100]))


def test_persistent_decode_processes_serve_every_epoch_and_end_with_the_loader(files, no_leaks):
    before = children()
    loader = _loader(files, num_workers=2, persistent_workers=True)
    first = list(loader)
    pids = children() - before
    second = list(loader)
    assert children() - before == pids and len(pids) == 2
    assert all(_equal(a, b) for a, b in zip(first + second, _expected(files)))
    del loader
    gc.collect()
    assert wait_until(lambda: not children() - before, 60)


def test_a_decode_process_that_dies_raises_naming_it(files, no_leaks):
    before = children()
    loader = _loader(files, num_workers=2, persistent_workers=True)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    victim = sorted(children() - before)[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: victim not in children(), 60)
    with pytest.raises(RuntimeError, match=rf"decode worker \d \(pid {victim}\) was killed by SIGKILL"):
        for _ in it:
            pass
    assert all(_equal(a, b) for a, b in zip(head, _expected(files)))
    del it, loader
    gc.collect()
