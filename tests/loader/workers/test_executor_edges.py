"""What is particular to one executor at its edges (issue 35); what every executor promises is in
``tests/contract/test_executors.py``. Here: several batches in flight in a dying process with
threads inside it (all named; the innocent recomputed alone; the poison one found), a
``SystemExit`` at ``num_workers=0`` (torch's behaviour), the plain route of ``initial_seed``, the
``stats()`` hint measuring before it advises, stage timing ending with thread workers, and the
runner's "alone" jobs under a tiny switch interval."""

from __future__ import annotations

import io
import os
import time

import pytest
import torch

import seqloader
from seqloader.sequences import stage_times

PROCESSES = dict(num_workers=2)
THREADS = dict(num_workers=2, worker_method="thread")
INSIDE = dict(num_workers=2, threads_per_worker=2)


def batches(dataset, **kw):
    return list(seqloader.DataLoader(dataset, **kw))


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def wait_for(path, seconds=60.0):
    """Wait until ``path`` exists (a generous bound: a test never depends on timing)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


# -- 1. a death blames the batch that died -------------------------------------------------------------


class TwoAtOnce(torch.utils.data.Dataset):
    """Item 0 (batch 0) is still running when item 4 (batch 2, same worker process, the other
    thread) kills the process: two batches in flight in one dying process. On a replacement (the
    file ``died`` exists) item 0 returns at once, and item 4 kills again only if ``always``."""

    def __init__(self, root, always):
        self.root, self.always = str(root), always

    def __len__(self):
        return 16

    def __getitem__(self, i):
        first = not os.path.exists(os.path.join(self.root, "died"))
        if i == 0 and first:
            open(os.path.join(self.root, "b_running"), "w").close()
            wait_for(os.path.join(self.root, "never"))  # until the process dies (bounded)
        if i == 4 and (first or self.always):
            if first:
                wait_for(os.path.join(self.root, "b_running"))
            open(os.path.join(self.root, "died"), "w").close()
            os._exit(9)
        return i


def test_several_batches_in_flight_in_a_dying_process_are_all_named(tmp_path):
    with pytest.raises(RuntimeError, match=r"one of batch 0 \(dataset indices \[0, 1\]\), batch 2 \(dataset "
                                           r"indices \[4, 5\]\)"):
        batches(TwoAtOnce(tmp_path, always=False), batch_size=2, **INSIDE)


def test_innocent_batches_in_flight_are_recomputed_alone_and_returned(tmp_path):
    want = batches(list(range(16)), batch_size=2, **PROCESSES)
    assert_same(batches(TwoAtOnce(tmp_path, always=False), batch_size=2, max_worker_restarts=3, **INSIDE), want)


def test_the_poison_batch_is_the_one_that_kills_when_computed_alone(tmp_path):
    want = batches(list(range(16)), batch_size=2, **PROCESSES)
    got = []
    with pytest.raises(RuntimeError, match=r"batch 2 \(dataset indices \[4, 5\]\) killed worker 0 twice") as err:
        for batch in seqloader.DataLoader(TwoAtOnce(tmp_path, always=True), batch_size=2, max_worker_restarts=3,
                                          **INSIDE):
            got.append(batch)
    assert "batch 0 (" not in str(err.value).split("killed worker 0 twice")[0]
    # The batches that came are the first ones, in order, once each. Batch 0, in flight when the
    # process first died, is recomputed alone and usually comes before the poison error; when its
    # result and the replacement's death are seen at once, the error ends the epoch first (a
    # dead worker's results not yet returned are dropped, docs/threads.md).
    assert_same(got, want[:len(got)])


# -- 2. SystemExit, KeyboardInterrupt, GeneratorExit from an item -------------------------------------------


class Exits(torch.utils.data.Dataset):
    def __init__(self, exc):
        self.exc = exc

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 57:
            raise self.exc
        return i


def test_at_num_workers_0_a_system_exit_propagates_as_in_torch():
    with pytest.raises(SystemExit):
        batches(Exits(SystemExit(3)), batch_size=4)


# -- 3. torch.initial_seed() -----------------------------------------------------------------------------


class InitialSeed(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.tensor(torch.initial_seed() % 2**62)  # the default seed of a process may not fit an int64


def test_the_plain_route_initial_seed_is_the_training_processs(monkeypatch):
    monkeypatch.setattr("seqloader.loader.torch_compat.worker_info.THREAD_INITIAL_SEED", False)
    got = batches(InitialSeed(), batch_size=4, seed=0, **THREADS)
    assert {int(x) for b in got for x in b} == {torch.initial_seed() % 2**62}


# -- the stats hint measures before it advises ------------------------------------------------------------


def waiting_stats(executor="process", busy=18.0, cpu=2.0):
    from seqloader.loader.tuning.stats import EpochStats

    workers = [{"busy_s": busy / 2, "cpu_s": cpu / 2, "items": 10, "restarts": 0} for _ in range(2)]
    return EpochStats(epoch=0, batches=20, wait_s=8.0, work_s=2.0, workers=workers, executor=executor)


def test_the_hint_never_advises_threads_on_a_busy_machine(monkeypatch):
    monkeypatch.setattr("seqloader.loader.tuning.epoch_stats.machine_busy", lambda: (3.7, 2))
    hint = waiting_stats().hint(2, 8)
    assert "the machine is busy (load 3.7 on 2 cores)" in hint and "worker_method='thread'" not in hint


class OpensAFile(torch.utils.data.Dataset):
    def __init__(self):
        self.f = io.BytesIO(b"0123456789")

    def __len__(self):
        return 10

    def __getitem__(self, i):
        self.f.seek(i)
        return self.f.read(1)


def test_the_hint_says_threads_are_unsafe_for_a_dataset_holding_open_files(monkeypatch):
    monkeypatch.setattr("seqloader.loader.tuning.epoch_stats.machine_busy", lambda: None)
    hint = waiting_stats().hint(2, 8, dataset=OpensAFile())
    assert "holds open file objects (f) that threads would share" in hint
    advised = waiting_stats().hint(2, 8, dataset=list(range(10)))
    assert "worker_method='thread'" in advised and "no longer reproducible" in advised
    assert "torch.thread_safe_generator()" in advised


# -- stage timing under thread workers is undone ----------------------------------------------------------


def test_stage_timing_of_thread_workers_ends_with_them():
    assert stage_times.ACTIVE is None
    loader = seqloader.DataLoader(list(range(16)), batch_size=2, profile_stages=True, **THREADS)
    assert len(list(loader)) == 8
    assert stage_times.ACTIVE is None
