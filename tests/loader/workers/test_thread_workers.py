"""Thread workers (``worker_method="thread"``) and threads inside worker processes
(``threads_per_worker``): the same batches and the same state as worker processes.

Every seeded pipeline is run on every executor and compared batch by batch (``torch.equal``) with
the main process's run; a state saved under one executor resumes under another. (What every
executor promises, Ray included, is stated once in ``tests/contract/test_executors.py``; this file
keeps what is particular to threads.) Then what a user
relies on besides the batches: errors, timeouts, ``worker_init_fn`` and ``get_worker_info()``,
stats, the global-RNG guard, clean exits, and a stress run with a tiny switch interval.
"""

from __future__ import annotations

import gc
import json
import random
import re
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info

import seqloader
from forking import BOUND
from resumable_stream import Stream
from seqloader.testing import assert_batches_equal

N = 60

#: name -> DataLoader keyword arguments of an executor
EXECUTORS = {
    "main": dict(num_workers=0),
    "process-1": dict(num_workers=1),
    "process-2": dict(num_workers=2),
    "thread-1": dict(num_workers=1, worker_method="thread"),
    "thread-2": dict(num_workers=2, worker_method="thread"),
    "thread-4": dict(num_workers=4, worker_method="thread"),
    "process-threads": dict(num_workers=2, threads_per_worker=3),
}


def noisy(x, rng):
    return torch.tensor([float(x), rng.random()])


class ThreadSafeDraws(torch.utils.data.Dataset):
    """Draws through ``torch.thread_safe_generator()``: the global generator in a process, the
    thread's own in a thread worker; seeded per batch either way."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        g = torch.thread_safe_generator()
        return torch.tensor([float(i), float(torch.rand(1, generator=g))])


def recipe(name, executor):
    """A loader for pipeline ``name`` on ``executor`` (keyword arguments of ``EXECUTORS``)."""
    kw = dict(seed=11, **executor)
    if name == "shuffle + rng_map":
        return seqloader.DataLoader(seqloader.rng_map(noisy, range(N), seed=3), batch_size=4, shuffle=True, **kw)
    if name == "mix, weights changed at a step":
        m = seqloader.mix([list(range(100)), list(range(1000, 1100))], weights=[3, 1], seed=5)
        loader = seqloader.DataLoader(m, batch_size=4, **kw)
        loader.set_weights([1, 3], at_step=4)
        return loader
    if name == "batch-size schedule + skips":
        loader = seqloader.DataLoader(list(range(N)), batch_size=2, shuffle=True,
                                      batch_size_schedule=[(3, 5), (6, 3)], **kw)
        loader.skip(indices=[7, 8, 30])
        return loader
    if name == "block shuffle":
        data = list(range(N))
        sampler = seqloader.BlockShuffleSampler(data, blocks=[10, 25, 40, N], window=2, seed=9, lanes=2)
        return seqloader.DataLoader(data, batch_size=5, sampler=sampler, **kw)
    if name == "thread_safe_generator":
        return seqloader.DataLoader(ThreadSafeDraws(), batch_size=3, shuffle=True, **kw)
    if name == "iterable stream":
        kw.pop("seed")  # an IterableDataset keeps max(1, num_workers) streams: compare like with like
        return seqloader.DataLoader(Stream(N), batch_size=4, seed=11, **kw)
    raise KeyError(name)


PIPELINES = ["shuffle + rng_map", "mix, weights changed at a step", "batch-size schedule + skips", "block shuffle",
             "thread_safe_generator"]


def epochs(loader, n=2):
    return [list(loader) for _ in range(n)]


@pytest.mark.parametrize("name", PIPELINES)
def test_every_executor_gives_the_main_process_batches(name):
    want = epochs(recipe(name, EXECUTORS["main"]))
    for executor, kw in EXECUTORS.items():
        for persistent in ([False, True] if kw["num_workers"] else [False]):
            got = epochs(recipe(name, dict(kw, persistent_workers=persistent)))
            for e in range(2):
                assert_batches_equal(got[e], want[e], f"{name}, {executor}, persistent={persistent}, epoch {e}")


def as_keys(batches):
    return sorted(json.dumps(b.tolist()) for b in batches)


def saved_after(loader, k):
    it = iter(loader)
    head = [next(it) for _ in range(k)]
    return head, json.loads(json.dumps(loader.state_dict()))


@pytest.mark.parametrize("name", PIPELINES)
@pytest.mark.parametrize("save, load", [("thread-2", "process-2"), ("process-2", "thread-4"),
                                        ("process-threads", "thread-1"), ("thread-4", "main")])
def test_a_state_saved_under_one_executor_resumes_under_another(name, save, load):
    want = epochs(recipe(name, EXECUTORS["main"]))
    head, state = saved_after(recipe(name, EXECUTORS[save]), 5)
    resumed = recipe(name, EXECUTORS[load])
    resumed.load_state_dict(state)
    assert_batches_equal(head + list(resumed), want[0], f"{name}: saved under {save}, resumed under {load}")
    assert_batches_equal(list(resumed), want[1], f"{name}: the next epoch")


@pytest.mark.parametrize("save, load", [("thread-2", "process-2"), ("process-2", "thread-2")])
def test_an_iterable_dataset_resumes_across_executors(save, load):
    want = list(recipe("iterable stream", EXECUTORS["process-2"]))
    head, state = saved_after(recipe("iterable stream", EXECUTORS[save]), 4)
    resumed = recipe("iterable stream", EXECUTORS[load])
    resumed.load_state_dict(state)
    assert_batches_equal(head + list(resumed), want)


def test_an_unordered_thread_run_resumes_its_remaining_batches_once():
    want = list(recipe("shuffle + rng_map", EXECUTORS["main"]))
    loader = recipe("shuffle + rng_map", dict(EXECUTORS["thread-4"], in_order=False))
    head, state = saved_after(loader, 6)
    resumed = recipe("shuffle + rng_map", dict(EXECUTORS["process-2"], in_order=False))
    resumed.load_state_dict(state)
    assert as_keys(head + list(resumed)) == as_keys(want)


def test_a_source_reads_the_same_under_threads(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    paths = []
    for k, groups in enumerate([[7, 9], [11]]):
        paths.append(str(tmp_path / f"part-{k}.parquet"))
        with pq.ParquetWriter(paths[-1], pa.schema([("i", pa.int64()), ("x", pa.float32())])) as w:
            for g in groups:
                i = np.arange(100 * k + g, 100 * k + 2 * g)
                w.write_table(pa.table({"i": i, "x": (i * 0.5).astype(np.float32)}), row_group_size=g)

    def load(executor):
        src = seqloader.smap(lambda row: torch.tensor([row["i"], row["x"]]), seqloader.parquet(paths, columns=["i", "x"]))
        return list(seqloader.DataLoader(src, batch_size=4, shuffle=True, seed=2, **executor))

    want = load(EXECUTORS["main"])
    for executor in ("thread-2", "process-threads"):
        assert_batches_equal(load(EXECUTORS[executor]), want, executor)


# -- the global RNGs ---------------------------------------------------------------------------------------


class GlobalDraws(torch.utils.data.Dataset):
    """Draws from a global generator: reproducible in worker processes only."""

    def __init__(self, which):
        self.which = which

    def __len__(self):
        return 16

    def __getitem__(self, i):
        draw = {"torch": lambda: float(torch.rand(1)), "numpy": lambda: float(np.random.rand()),
                "random": random.random}[self.which]
        return torch.tensor([float(i), draw()])


@pytest.mark.parametrize("which, name", [("torch", "torch"), ("numpy", "numpy.random"), ("random", "random")])
def test_a_global_draw_in_a_thread_worker_warns_once_naming_the_generator_and_the_fix(which, name):
    loader = seqloader.DataLoader(GlobalDraws(which), batch_size=2, num_workers=2, worker_method="thread", seed=0)
    with pytest.warns(RuntimeWarning, match=rf"batch [01] of epoch 0 drew from the global {re.escape(name)} generator"
                                            r"\(s\) in a thread worker.*seqloader.rng_map.*torch.thread_safe_generator"
                                            r"\(\)") as record:
        _ = list(loader)
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1


def test_a_global_draw_elsewhere_while_thread_workers_run_is_not_blamed_on_them():
    """The training loop draws from random's global (watched per thread: exact) and another loader
    reseeds all three globals (torch's and numpy's are watched by their state: seqloader's own
    settings are told apart), while the workers compute their first batches. (A draw from torch's
    or numpy's global by another thread at that moment *can* be blamed: docs/threads.md says so.)"""
    loader = recipe("thread_safe_generator", EXECUTORS["thread-2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for epoch in range(3):
            loader.set_epoch(epoch)   # (each thread's first batch of each epoch is watched)
            for batch in loader:
                random.random()
                _ = next(iter(seqloader.DataLoader(GlobalDraws("random"), batch_size=2, seed=epoch)))


def test_the_global_generators_stay_exact_in_worker_processes_and_untouched_by_thread_workers():
    want = list(seqloader.DataLoader(GlobalDraws("torch"), batch_size=2, seed=0))
    assert_batches_equal(list(seqloader.DataLoader(GlobalDraws("torch"), batch_size=2, num_workers=2, seed=0)), want)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _ = list(seqloader.DataLoader(ThreadSafeDraws(), batch_size=3, num_workers=2, worker_method="thread", seed=0))
    assert torch.equal(torch.get_rng_state(), before)  # the thread workers drew from their own generators


def seed_all_globals_slowly(worker_id):
    """torch's idiom for worker processes, then a pause (opening files, say): the pause keeps the
    globals changed while the other threads start, so that a snapshot taken by one thread while
    another's change is in force would show (the race of issue 42; the pause decides no result)."""
    torch.manual_seed(worker_id)
    np.random.seed(worker_id)
    random.seed(worker_id)
    time.sleep(0.02 if worker_id == 0 else 0.03)


def global_states():
    return random.getstate(), np.random.get_state()[1].tolist(), np.random.get_state()[2:], torch.get_rng_state()


def test_a_worker_init_fn_seeding_the_globals_in_thread_workers_leaves_the_training_loops_states_exactly():
    """Each thread worker's ``worker_init_fn`` runs between a snapshot of the three global states
    and its restore; they run one at a time, so no thread snapshots another's change and puts it
    back as the "before" (with 4 threads the old per-thread snapshots got this wrong in 25 runs
    out of 25)."""
    loader = seqloader.DataLoader(ThreadSafeDraws(), batch_size=6, num_workers=4, worker_method="thread", seed=0,
                                  worker_init_fn=seed_all_globals_slowly)
    want = epochs(seqloader.DataLoader(ThreadSafeDraws(), batch_size=6, seed=0), 5)
    with pytest.warns(RuntimeWarning, match="worker_init_fn changed the global"):   # once per loader
        for epoch in range(5):
            random.seed(100 + epoch); np.random.seed(100 + epoch); torch.manual_seed(100 + epoch)
            random.gauss(0, 1); np.random.randn(1)   # cached Gaussians too
            before = global_states()
            got = list(loader)
            after = global_states()
            assert after[:3] == before[:3] and torch.equal(after[3], before[3]), f"epoch {epoch}"
            assert_batches_equal(got, want[epoch], f"epoch {epoch}")


def test_draws_through_the_thread_generators_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _ = list(recipe("thread_safe_generator", EXECUTORS["thread-4"]))
        _ = list(recipe("shuffle + rng_map", EXECUTORS["thread-4"]))


# -- what else a user relies on ------------------------------------------------------------------------------


class FailsAt:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 9:
            raise KeyError("sample 9 is missing")
        return i


@pytest.mark.parametrize("executor", ["thread-2", "process-threads"])
def test_a_user_error_keeps_its_type_and_names_the_batch_and_the_worker(executor):
    loader = seqloader.DataLoader(FailsAt(), batch_size=4, **EXECUTORS[executor])
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    next(it)
    with pytest.raises(KeyError, match="sample 9 is missing") as info:
        next(it)
    notes = "\n".join(info.value.__notes__)
    assert "DataLoader" in notes and "batch 2" in notes
    assert re.search(r"in worker 0 \((thread seqloader-worker-0|pid \d+)\)", notes), notes
    assert list(it) == []  # the batch was consumed, as in torch


class Gate(torch.utils.data.Dataset):
    def __init__(self, event):
        self.event = event

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 4:
            assert self.event.wait(BOUND)
        return i


def test_a_timeout_names_the_batch_and_its_thread_worker():
    event = threading.Event()
    loader = seqloader.DataLoader(Gate(event), batch_size=2, num_workers=2, worker_method="thread", timeout=0.05)
    it = iter(loader)
    assert [next(it).tolist(), next(it).tolist()] == [[0, 1], [2, 3]]
    try:
        with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.05 seconds; seqloader: waiting for "
                                               r"batch 2 \(dataset indices \[4, 5\]\) from worker 0"):
            next(it)
    finally:
        event.set()


def record_info(worker_id):
    info = get_worker_info()
    seen.append((threading.current_thread().name, info.id, info.num_workers, info.worker_method))


seen: list = []


def test_worker_init_fn_and_get_worker_info_run_in_each_thread():
    seen.clear()

    class Who(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            info = get_worker_info()
            return torch.tensor([info.id, info.num_workers, info.worker_method == "thread", info.dataset is self])

    loader = seqloader.DataLoader(Who(), batch_size=2, num_workers=2, worker_method="thread", worker_init_fn=record_info)
    batches = list(loader)
    assert sorted(seen) == [("seqloader-worker-0", 0, 2, "thread"), ("seqloader-worker-1", 1, 2, "thread")]
    assert [b[:, 0].tolist() for b in batches] == [[0, 0], [1, 1], [0, 0], [1, 1]]  # batch b on worker b % 2
    assert all(b[:, 1:].tolist() == [[2, 1, 1]] * 2 for b in batches)  # one dataset object, shared
    assert get_worker_info() is None  # nothing in the main thread


def test_stats_and_stage_times_are_per_thread():
    loader = seqloader.DataLoader(seqloader.smap(abs, list(range(-40, 0))), batch_size=4, num_workers=2,
                                  worker_method="thread", profile_stages=True)
    _ = list(loader)
    s = loader.stats()["current"]
    assert len(s["workers"]) == 2 and sum(w["items"] for w in s["workers"]) == 10
    assert "smap(abs)" in s["stages"] and "fetch" in s["stages"]


def threads_named(prefix, before=frozenset()):
    """The live threads whose name starts with ``prefix``, less those in ``before`` (threads an
    earlier test may have left to the garbage collector)."""
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t not in before]


def test_persistent_thread_workers_stay_across_epochs_and_stop_with_the_loader():
    from forking import wait_until

    before = frozenset(threading.enumerate())
    loader = seqloader.DataLoader(list(range(12)), batch_size=4, num_workers=2, worker_method="thread",
                                  persistent_workers=True)
    first = list(loader)
    names = {t.ident for t in threads_named("seqloader-worker-", before)}
    assert [b.tolist() for b in list(loader)] == [b.tolist() for b in first] and len(names) == 2
    assert {t.ident for t in threads_named("seqloader-worker-", before)} == names
    del loader
    gc.collect()  # the loader (a cycle with its default sampler) is freed by the collector
    assert wait_until(lambda: not threads_named("seqloader-worker-", before))


def test_arguments_are_checked_naming_the_option():
    with pytest.raises(ValueError, match="worker_method must be 'process' \\(or 'multiprocessing'\\), 'thread', 'ray'.* \\(got 'threads'\\)"):
        seqloader.DataLoader(range(4), num_workers=2, worker_method="threads")
    with pytest.raises(ValueError, match="threads_per_worker applies to worker processes only \\(got 2 with worker_method='thread'\\)"):
        seqloader.DataLoader(range(4), num_workers=2, worker_method="thread", threads_per_worker=2)
    with pytest.raises(ValueError, match="threads_per_worker=3 needs num_workers > 0"):
        seqloader.DataLoader(range(4), threads_per_worker=3)


# -- no reliance on the GIL ----------------------------------------------------------------------------------


def test_many_threads_with_a_tiny_switch_interval_give_the_batches_bit_for_bit():
    want = epochs(recipe("shuffle + rng_map", EXECUTORS["main"]), 1)[0]
    want_ts = epochs(recipe("thread_safe_generator", EXECUTORS["main"]), 1)[0]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(3):
            got = list(recipe("shuffle + rng_map", dict(num_workers=8, worker_method="thread", prefetch_factor=3)))
            assert_batches_equal(got, want, "rng_map under 8 threads")
            got = list(recipe("thread_safe_generator", dict(num_workers=8, worker_method="thread", in_order=False)))
            assert as_keys(got) == as_keys(want_ts)
    finally:
        sys.setswitchinterval(old)


# -- which executor fits -------------------------------------------------------------------------------------


def epoch_stats(executor, busy, cpu, wait_s=8.0, work_s=2.0, n=2):
    from seqloader.loader.tuning.stats import EpochStats

    workers = [{"busy_s": busy / n, "cpu_s": cpu / n, "items": 10, "restarts": 0} for _ in range(n)]
    return EpochStats(epoch=0, batches=20, wait_s=wait_s, work_s=work_s, workers=workers, executor=executor)


def test_the_hint_says_which_executor_fits(monkeypatch):
    monkeypatch.setattr("seqloader.loader.tuning.epoch_stats.machine_busy", lambda: None)  # a machine with cores to spare
    waiting = epoch_stats("process", busy=18.0, cpu=2.0).hint(2, 8)
    assert "on the CPU 11% of their busy time (they wait on I/O, with cores to spare): worker_method='thread'" in waiting
    turns = epoch_stats("thread", busy=19.0, cpu=9.5, n=4).hint(4, 8)
    assert "4 threads busy but 0.9 core(s) of CPU between them" in turns and "'multiprocessing'" in turns
    for quiet in (epoch_stats("thread", busy=19.0, cpu=1.0, n=4),  # threads waiting on I/O: threads fit
                  epoch_stats("process", busy=18.0, cpu=17.0),  # processes computing: processes fit
                  epoch_stats("process", busy=18.0, cpu=2.0, wait_s=0.5, work_s=9.5)):  # not input-bound
        assert "workers:" not in (quiet.hint(4, 8) or "")


def test_stats_report_the_executor_and_the_cpu_time_of_each_worker():
    loader = seqloader.DataLoader(list(range(40)), batch_size=4, num_workers=2, worker_method="thread")
    _ = list(loader)
    cur = loader.stats()["current"]
    assert cur["executor"] == "thread" and all(w["cpu_s"] >= 0 for w in cur["workers"])


class _Uncopyable(torch.utils.data.IterableDataset):
    def __init__(self):
        self.lock = threading.Lock()   # deepcopy cannot copy it

    def __iter__(self):
        return iter(range(4))


def test_an_iterable_dataset_that_cannot_be_copied_names_the_copy_not_a_worker_init_fn():
    """Each thread worker reads its own copy of an IterableDataset; when the copy fails the note
    names that step, not a ``worker_init_fn`` the user never passed (issue 44)."""
    with pytest.raises(TypeError, match=r"copy\.deepcopy of _Uncopyable failed") as info:
        list(seqloader.DataLoader(_Uncopyable(), batch_size=2, num_workers=2, worker_method="thread"))
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "copying the IterableDataset for the thread worker failed in worker" in notes, notes
    assert "worker_init_fn" not in notes, notes
