"""What ``prefetch()`` promises whatever executes it: one test per promise, parametrized over the
executors in :data:`EXECUTORS` (worker processes over shared memory, threads of this process, Ray
actors on a small local cluster), as ``tests/contract/`` does for the DataLoader. A new executor is
one more entry there. Where a promise cannot apply to an executor (an ``os._exit`` in a thread
ends the test process, which the thread shares), the test's parameter list says so, with the
reason, instead of a skip. What one executor does alone (shared-memory segments, start methods,
actor replacement, thread shutdown details) stays in its own file: ``test_prefetch.py``,
``test_faults.py``, ``test_thread_executor.py``, ``test_ray.py``.

Items are in ``promise_items.py`` and report what they did through files, so the same item serves
every executor. Nothing asserts timing: blocked items wait for a file the test creates, and reads
under a short ``timeout`` are retried where the timeout is not the point.
"""

from __future__ import annotations

import gc
import pickle
import re
import time

import pytest
import torch

import leaks
import seqloader as sl
from contract_fixtures import no_leaks, ray_cluster, running_cluster, thread_workers  # noqa: F401 (fixtures)
from forking import BOUND, wait_until
from promise_items import (Gated, Logged, Where, computed, exits_at_3, fails_at_3, fails_at_5, needs_config, release,
                           ten_copies, value)
from seqloader.prefetcher.faults import ItemTimeout, WorkerDied

#: executor -> its ``method=``
EXECUTORS = {"process": "process", "thread": "thread", "ray": "ray"}
#: the executors whose workers are processes (a worker can die; a thread's death is the test's)
PROCESS_BASED = ["process", "ray"]
#: executor -> how ``repr`` names it
REPR = {"process": "prefetch(num_workers=2, ", "thread": "prefetch(method='thread', num_workers=2, ",
        "ray": "prefetch(method='ray', num_workers=2, "}


class Executor:
    """One executor of :data:`EXECUTORS`: its name, its ``method=``, and the workers it has running."""

    def __init__(self, name: str):
        self.name, self.method = name, EXECUTORS[name]
        self._before = self._running()

    def prefetch(self, seq, num_workers=2, **kwargs):
        return sl.prefetch(seq, num_workers, method=self.method, **kwargs)

    def _running(self) -> set:
        if self.name == "thread":
            return thread_workers()
        cluster = running_cluster()
        if self.name == "ray":
            return cluster.alive_actors()
        if cluster is not None:  # the cluster's own processes (its pooled workers come and go)
            from ray_cluster import _other_children

            return _other_children(cluster)
        return {p for p in leaks.children() if _alive(p)}

    def started(self) -> set:
        """The workers (threads, processes, actors) started since the test began and still running."""
        return self._running() - self._before


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(params=list(EXECUTORS))
def executor(request, no_leaks):
    return Executor(request.param)


@pytest.fixture(params=PROCESS_BASED)
def process_executor(request, no_leaks):
    return Executor(request.param)


def read_patiently(p, i):
    """``p[i]``, retried on ``ItemTimeout`` (a short ``timeout`` may expire on a loaded machine)."""
    deadline = time.monotonic() + BOUND
    while True:
        try:
            return p[i]
        except ItemTimeout:
            if time.monotonic() > deadline:
                raise


# -- reading --------------------------------------------------------------------------------------

def test_reads_match_the_sequence_including_negative_indices_and_slices(executor):
    data = list(range(0, 100, 3))
    with executor.prefetch(data) as p:
        assert isinstance(p, sl.Prefetch) and isinstance(p, sl.LazySequence)
        assert p.executor.kind == executor.name
        assert repr(p) == f"{REPR[executor.name]}prefetch_factor=2, len=34)"
        assert len(p) == len(data)
        assert list(p) == data
        assert p[-1] == data[-1] and p[0] == data[0]
        assert list(p[5:20:4]) == data[5:20:4]
        assert list(p[::-1]) == data[::-1]
        with pytest.raises(IndexError, match=re.escape(f"{p!r}: index 34 out of range [-34, 34)")):
            p[34]
    assert p.closed  # the context manager closed it


def test_seeks_backwards_and_repeated_reads_return_the_right_items(executor):
    with executor.prefetch(range(50), prefetch_factor=3) as p:
        order = [7, 7, 3, 49, 0, 1, 2, 48, 25, 26, 20]
        assert [p[i] for i in order] == order
        p.seek(30)
        assert [p[i] for i in range(30, 40)] == list(range(30, 40))
        assert p[5] == 5


def test_exhaustion_does_not_wrap_and_reading_again_restarts(executor):
    with executor.prefetch(range(5)) as p:
        assert list(p) == [0, 1, 2, 3, 4]
        assert list(p) == [0, 1, 2, 3, 4]


def test_a_seek_never_computes_the_items_it_skips(executor, tmp_path):
    with executor.prefetch(Logged(tmp_path, 200), num_workers=1, prefetch_factor=1) as p:
        assert p[0] == 0
        assert p[150] == 150
        assert p[151] == 151
        assert p[10] == 10
    seen = computed(tmp_path)
    assert not [j for j in seen if 12 <= j < 150], sorted(seen)
    assert seen.count(0) == 1 and seen.count(150) == 1 and seen.count(10) == 1


def test_at_most_num_workers_times_prefetch_factor_items_are_read_ahead(executor, tmp_path):
    with executor.prefetch(Logged(tmp_path, 100), num_workers=2, prefetch_factor=3) as p:
        assert [p[i] for i in range(5)] == [0, 1, 2, 3, 4]
        p.reset(range(3))  # a synchronisation point: the workers drain what they had queued
        assert list(p) == [0, 1, 2]
    seen = sorted(set(computed(tmp_path)))
    assert seen[:5] == [0, 1, 2, 3, 4] and max(seen) <= 4 + 2 * 3  # after reading 4: 5..10


def test_reset_retargets_the_same_workers_at_a_new_sequence(executor):
    with executor.prefetch(Where(40)) as p:
        first = [p[i] for i in range(40)]
        p[3], p[30], p[-2]  # seeks
        p.reset(Where(10))
        assert len(p) == 10
        later = list(p)
        p.reset(["a", "b"])
        assert len(p) == 2 and list(p) == ["a", "b"]
    assert [i for i, _ in first] == list(range(40)) and [i for i, _ in later] == list(range(10))
    workers = {w for _, w in first}
    assert len(workers) == 2 and {w for _, w in later} <= workers


def test_values_are_writable_and_outlive_the_prefetch(executor):
    p = executor.prefetch(sl.smap(value, range(8)))
    kept = list(p)
    p.close()
    del p
    gc.collect()
    for i, got in enumerate(kept):
        assert got["i"] == i and (got["x"] == i).all() and torch.equal(got["t"], torch.arange(5) + i)
    kept[2]["x"] += 1  # writable
    kept[2]["t"] += 1
    assert kept[2]["x"][0] == 3 and kept[2]["t"].tolist() == [3, 4, 5, 6, 7]
    assert all((k["x"] == i).all() for i, k in enumerate(kept) if i != 2)  # no other value changed


# -- errors ---------------------------------------------------------------------------------------

#: executor -> how the note names the worker that raised (item 3 of two workers: worker 1)
WHO_RAISED = {"process": r"in worker 1 \(pid \d+\)", "thread": r"in worker 1 \(thread seqloader-worker-1\)",
              "ray": r"in worker 1 \(Ray actor, pid \d+.*\)"}


def test_an_item_error_keeps_its_type_gains_a_note_and_the_reader_goes_on(executor):
    with executor.prefetch(sl.smap(fails_at_3, range(8))) as p:
        assert [p[0], p[1], p[2]] == [0, 1, 2]
        with pytest.raises(ValueError, match="^bad record 3") as info:
            p[3]
        assert [p[4], p[5], p[0]] == [4, 5, 0]
        assert list(p[5:]) == [5, 6, 7]
        with pytest.raises(ValueError, match="bad record 3"):
            p[3]
    exc = info.value
    assert type(exc) is ValueError and str(exc) == "bad record 3" and exc.seqloader_index == 3
    assert "seqloader: raised in smap(fails_at_3, len=8) at item 3" in exc.__notes__, exc.__notes__
    assert re.fullmatch(rf"seqloader: raised while computing item 3 of {re.escape(repr(p))} {WHO_RAISED[executor.name]}",
                        exc.__notes__[-1]), exc.__notes__


def test_a_note_added_inside_the_pipeline_survives(executor):
    seq = sl.batch(sl.smap(fails_at_5, range(10)), 4, collate_fn=list)
    with executor.prefetch(seq, num_workers=1) as p:
        with pytest.raises(ValueError, match="bad record 5") as info:
            p[1]
    notes = info.value.__notes__
    assert any("smap(fails_at_5" in n and "at item 5" in n for n in notes), notes
    assert any("item 1 of prefetch" in n for n in notes), notes


#: executor -> how an ``ItemTimeout`` names the worker (item 2 of two workers: worker 0)
WHO_TIMED_OUT = {"process": r"worker 0 \(pid \d+\)", "thread": r"worker 0 \(thread seqloader-worker-0\)",
                 "ray": r"worker 0 \(Ray actor, pid \d+"}


def test_a_timeout_names_the_item_and_leaves_the_reader_usable(executor, tmp_path):
    p = executor.prefetch(Gated(tmp_path, 8, at=2), timeout=0.5)
    try:
        assert [read_patiently(p, 0), read_patiently(p, 1)] == [0, 1]
        assert wait_until(lambda: (tmp_path / "reached").exists()), "item 2 never started"
        with pytest.raises(ItemTimeout, match=r"timed out after 0.5 seconds waiting for item 2 from "
                                              + WHO_TIMED_OUT[executor.name]) as info:
            p[2]
        assert isinstance(info.value, RuntimeError) and info.value.item == 2
        assert read_patiently(p, 5) == 5  # another read seeks; the other worker computes it
        release(tmp_path)
        assert [read_patiently(p, i) for i in (2, 3)] == [2, 3]
    finally:
        release(tmp_path)
        p.close()


def test_reading_a_timed_out_item_again_recomputes_nothing(executor, tmp_path):
    p = executor.prefetch(Gated(tmp_path, 4, at=0), num_workers=1, prefetch_factor=1, timeout=0.5)
    try:
        p.start()  # the workers run: item 0 cannot be done within the timeout, it waits for the test
        with pytest.raises(ItemTimeout, match=r"timed out after 0.5 seconds waiting for item 0 from worker 0"):
            p[0]
        assert (tmp_path / "reached").exists()
        release(tmp_path)
        assert [read_patiently(p, i) for i in range(4)] == [0, 1, 2, 3]  # the same item, read again
    finally:
        release(tmp_path)
        p.close()
    assert computed(tmp_path).count(0) == 1  # the read position was unchanged: the same computation


def test_a_failing_worker_init_fn_raises_its_own_error_and_closes(executor):
    p = executor.prefetch(range(4), worker_init_fn=needs_config)
    with pytest.raises(LookupError, match="no config for worker") as info:
        p[0]
    assert any("worker_init_fn failed in worker" in n for n in info.value.__notes__), info.value.__notes__
    assert p.closed


#: executor -> how ``WorkerDied`` names a worker that ``os._exit(3)`` ended while it computed item 3
WHO_DIED = {"process": r"seqloader worker 1 \(pid \d+\) exited unexpectedly with exit code 3 while producing item 3",
            "ray": r"worker 1 \(Ray actor, pid \d+ on 127.0.0.1\) was lost .* while producing item 3"}


def test_a_dead_worker_raises_naming_the_worker_and_the_item(process_executor):
    # With read-ahead, a Ray actor's reply sent just before its process died can be lost with it,
    # so a death is attributed to the first item it had not answered; prefetch_factor=1 (one job
    # in flight per worker) makes that the item it was computing.
    p = process_executor.prefetch(sl.smap(exits_at_3, range(10)), prefetch_factor=1)
    with pytest.raises(WorkerDied, match=WHO_DIED[process_executor.name]) as info:
        [p[i] for i in range(10)]
    assert info.value.item == 3 and not info.value.poison
    assert p.closed
    with pytest.raises(ValueError, match="after an earlier error"):
        p[0]


# -- lifecycle ------------------------------------------------------------------------------------

def test_close_is_idempotent_stops_the_workers_and_reads_after_it_raise(executor):
    p = executor.prefetch(range(50))
    assert list(p) == list(range(50))
    assert executor.started()
    p.close()
    p.close()
    assert p.closed and len(p) == 50
    assert wait_until(lambda: not executor.started()), executor.started()
    for call in [lambda: p[0], lambda: p.seek(0), lambda: p.reset([1])]:
        with pytest.raises(ValueError, match=re.escape(f"{p!r}: read or reset after close(); create a new prefetch")):
            call()


@pytest.mark.parametrize("how", ["break", "abandoned_iterator", "exhausted", "read_one"])
def test_a_dropped_prefetch_leaves_no_worker(executor, how):
    p = executor.prefetch(sl.smap(ten_copies, range(50)))
    if how == "break":
        for i, _ in enumerate(p):
            if i == 5:
                break
    elif how == "abandoned_iterator":
        it = iter(p)
        next(it)
        del p
        p = it  # the only reference left: the iterator's
        del it
    elif how == "exhausted":
        assert list(p) == [[i] * 10 for i in range(50)]
    else:
        assert p[4] == [4] * 10
    del p
    gc.collect()  # the finalizer stops the workers; the no_leaks fixture checks them too
    assert wait_until(lambda: not executor.started()), executor.started()


def test_a_prefetch_cannot_be_pickled(executor):
    with executor.prefetch(range(3)) as p:
        with pytest.raises(TypeError, match="owns its workers and cannot be pickled; pickle the sequence"):
            pickle.dumps(p)
        assert list(p) == [0, 1, 2]


# -- arguments ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    ({"num_workers": 0}, ValueError, r"prefetch: num_workers must be a positive int \(got 0\); to evaluate"),
    ({"num_workers": True}, TypeError, r"prefetch: num_workers must be an int \(got bool"),
    ({"prefetch_factor": 0}, ValueError, r"prefetch: prefetch_factor must be a positive int \(got 0\)"),
    ({"timeout": -1}, ValueError, r"prefetch: timeout must be >= 0 \(got -1\)"),
    ({"timeout": "5"}, TypeError, r"prefetch: timeout must be a number"),
    ({"worker_init_fn": 3}, TypeError, r"worker_init_fn must be callable"),
])
def test_argument_errors_name_the_argument(executor, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        executor.prefetch(range(3), **{"num_workers": 1, **kwargs})


def test_a_seq_without_len_is_a_type_error_and_a_bad_reset_changes_nothing(executor):
    with pytest.raises(TypeError, match=r"prefetch: seq must be a sequence with len\(\)"):
        executor.prefetch(iter(range(3)), 1)
    with executor.prefetch(range(3), 1) as p:
        with pytest.raises(TypeError, match=r"prefetch.reset: seq must be a sequence"):
            p.reset(5)
        assert list(p) == [0, 1, 2]


#: executor -> the process-only arguments it refuses (``prefetch: <name> applies to worker processes only``)
PROCESS_ONLY = {
    "thread": [("multiprocessing_context", "spawn"), ("shared", [1]), ("restarts", 1), ("threads_per_worker", 2),
               ("thread_init_fn", print)],
    "ray": [("multiprocessing_context", "spawn"), ("threads_per_worker", 2), ("thread_init_fn", print)],
}


@pytest.mark.parametrize("executor", list(PROCESS_ONLY), indirect=True)  # worker processes take them all
def test_process_only_arguments_are_refused_naming_them(executor):
    for name, value_ in PROCESS_ONLY[executor.name]:
        with pytest.raises(ValueError, match=f"^prefetch: {name} applies to worker processes only"):
            executor.prefetch(range(3), **{name: value_})
