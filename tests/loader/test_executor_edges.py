"""The executors' edges (issue 35): a batch is a function of (recipe, position), so what worker
processes (``num_workers=2``) do is the reference, and every executor either does the same or
warns, with advice that works on every executor. Each case is parametrized over the executors it
applies to (a case that kills a process is not run on thread workers, whose process is this one).
These can move into the contract suite as they are."""

from __future__ import annotations

import io
import os
import time
import warnings

import numpy as np
import pytest
import torch

import seqloader
from seqloader.sequences import stage_times

PROCESSES = dict(num_workers=2)
THREADS = dict(num_workers=2, worker_method="thread")
INSIDE = dict(num_workers=2, threads_per_worker=2)
ZERO = dict(num_workers=0)
EXECUTORS = [pytest.param(PROCESSES, id="processes"), pytest.param(THREADS, id="threads"),
             pytest.param(INSIDE, id="threads_per_worker")]
WITH_ZERO = EXECUTORS + [pytest.param(ZERO, id="num_workers=0")]
WORKER_PROCESSES = [pytest.param(PROCESSES, id="processes"), pytest.param(INSIDE, id="threads_per_worker")]


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


class Dies(torch.utils.data.Dataset):
    def __len__(self):
        return 200

    def __getitem__(self, i):
        if i == 57:
            os._exit(9)
        return i


def batch_of(index, **kw):
    """The batch (and its dataset indices) that reads ``index`` in the reference order."""
    for b, batch in enumerate(seqloader.DataLoader(list(range(200)), **kw)):
        if index in batch.tolist():
            return b, batch.tolist()
    raise AssertionError(index)


@pytest.mark.parametrize("executor", WORKER_PROCESSES)
def test_a_death_names_the_batch_whose_item_killed_the_process(executor):
    kw = dict(batch_size=4, shuffle=True, seed=1)
    b, indices = batch_of(57, **kw)
    with pytest.raises(RuntimeError, match=rf"died while producing (one of .*)?batch {b} \(dataset indices "
                                           rf"{indices}\)".replace("[", r"\[").replace("]", r"\]")):
        batches(Dies(), **kw, **executor)


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
    assert_same(got, want[:2])  # batch 0, in flight when the process first died, was not dropped


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


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_base_exception_from_an_item_is_a_runtime_error_naming_the_batch(executor, exc):
    with pytest.raises(RuntimeError, match=rf"an item raised {type(exc).__name__}\(.*\) in batch 14 \(dataset "
                                           r"indices \[56, 57, 58, 59\]\)") as err:
        batches(Exits(exc), batch_size=4, **executor)
    assert type(err.value.__cause__) is type(exc)


def test_at_num_workers_0_a_system_exit_propagates_as_in_torch():
    with pytest.raises(SystemExit):
        batches(Exits(SystemExit(3)), batch_size=4)


# -- 3. torch.initial_seed() -----------------------------------------------------------------------------


class InitialSeed(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.tensor(torch.initial_seed() % 2**62)  # the default seed of a process may not fit an int64


@pytest.mark.parametrize("executor", WITH_ZERO)
def test_initial_seed_is_the_batch_seed_under_every_executor(executor):
    from seqloader.loader.torch_compat import thread_worker_info_holders

    original = torch.random.initial_seed.__code__
    want = batches(InitialSeed(), batch_size=4, seed=0, **PROCESSES)
    assert len({int(x) for b in want for x in b}) == 8
    assert_same(batches(InitialSeed(), batch_size=4, seed=0, **executor), want)
    if executor is THREADS:
        assert thread_worker_info_holders() == 0
    assert torch.random.initial_seed.__code__ is original  # the process-wide effect is undone


def test_the_plain_route_initial_seed_is_the_training_processs(monkeypatch):
    monkeypatch.setattr("seqloader.loader.torch_compat.worker_info.THREAD_INITIAL_SEED", False)
    got = batches(InitialSeed(), batch_size=4, seed=0, **THREADS)
    assert {int(x) for b in got for x in b} == {torch.initial_seed() % 2**62}


# -- 4 and 9. global draws warn where they cannot be reproduced; the advice works everywhere ---------------


class GlobalDraw(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.rand(())


class ThreadSafeDraw(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.rand((), generator=torch.thread_safe_generator())


@pytest.mark.parametrize("executor, warns", [(PROCESSES, False), (THREADS, True), (INSIDE, True), (ZERO, False)],
                         ids=["processes", "threads", "threads_per_worker", "num_workers=0"])
def test_a_global_draw_warns_on_every_executor_that_cannot_reproduce_it(executor, warns):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        batches(GlobalDraw(), batch_size=4, seed=0, **executor)
    ours = [str(w.message) for w in record if "drew from the global torch generator" in str(w.message)]
    assert bool(ours) == warns
    for message in ours:
        assert "seqloader.rng_map" in message and "torch.thread_safe_generator()" in message
        assert "get_worker_info().rng" not in message


@pytest.mark.parametrize("executor", WITH_ZERO)
def test_the_advice_gives_the_same_batches_under_every_executor(executor):
    want = batches(ThreadSafeDraw(), batch_size=4, seed=0, **PROCESSES)
    assert_same(batches(ThreadSafeDraw(), batch_size=4, seed=0, **executor), want)
    rng = seqloader.rng_map(lambda x, g: torch.tensor(float(g.random())), range(32), seed=5)
    assert_same(batches(rng, batch_size=4, seed=0, **executor), batches(rng, batch_size=4, seed=0, **PROCESSES))


class Warns(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            warnings.warn(f"item {i} says so", UserWarning)
        return i


@pytest.mark.parametrize("executor", WITH_ZERO)
def test_an_items_warning_reaches_the_training_process(executor):
    with pytest.warns(UserWarning, match=r"item 5 says so"):
        batches(Warns(), batch_size=2, **executor)


# -- 5. IterableDataset streams under threads_per_worker --------------------------------------------------


class CountingIterator(torch.utils.data.IterableDataset):
    """An iterator class: state in the object, read by whichever thread calls ``next``."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        self.i, self.n = (0, 1) if info is None else (info.id, info.num_workers)
        return self

    def __next__(self):
        if self.i >= 24:
            raise StopIteration
        value, self.i = self.i, self.i + self.n
        return torch.tensor([value, int(torch.randint(0, 10**6, (), generator=torch.thread_safe_generator()))])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, sd):
        self.i = sd["i"]


class Generating(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, 24, n):
            yield torch.tensor([i, int(torch.randint(0, 10**6, (), generator=torch.thread_safe_generator()))])


@pytest.mark.parametrize("dataset", [CountingIterator, Generating])
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_stream_is_read_in_its_order_with_the_same_batches_and_state(executor, dataset):
    def run(kw):
        loader = seqloader.DataLoader(dataset(), batch_size=4, seed=3, **kw)
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
        return head + list(it), state

    want, want_state = run(PROCESSES)
    assert [b[:, 0].tolist() for b in want[:2]] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    got, state = run(executor)
    assert_same(got, want)
    assert {k: v for k, v in state.items() if k != "saved_with"} == \
        {k: v for k, v in want_state.items() if k != "saved_with"}


# -- 6. worker_init_fn under threads leaves the training process's generators alone -----------------------


def seed_numpy(worker_id):
    np.random.seed(worker_id)


@pytest.mark.parametrize("executor", WITH_ZERO)
def test_a_worker_init_fn_seeding_numpy_leaves_the_training_processs_numpy_alone(executor):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    want = batches(ThreadSafeDraw(), batch_size=4, seed=0, worker_init_fn=seed_numpy, **PROCESSES)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = batches(ThreadSafeDraw(), batch_size=4, seed=0, worker_init_fn=seed_numpy, **executor)
    assert np.random.rand() == expected
    assert_same(got, want)
    ours = [str(w.message) for w in record if "worker_init_fn changed the global" in str(w.message)]
    assert len(ours) == (1 if executor is THREADS else 0)
    if ours:
        assert "torch.thread_safe_generator()" in ours[0] and "get_worker_info().seed" in ours[0]


# -- the stats hint measures before it advises ------------------------------------------------------------


def waiting_stats(executor="process", busy=18.0, cpu=2.0):
    from seqloader.loader.stats import EpochStats

    workers = [{"busy_s": busy / 2, "cpu_s": cpu / 2, "items": 10, "restarts": 0} for _ in range(2)]
    return EpochStats(epoch=0, batches=20, wait_s=8.0, work_s=2.0, workers=workers, executor=executor)


def test_the_hint_never_advises_threads_on_a_busy_machine(monkeypatch):
    monkeypatch.setattr("seqloader.loader.stats.machine_busy", lambda: (3.7, 2))
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
    monkeypatch.setattr("seqloader.loader.stats.machine_busy", lambda: None)
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
