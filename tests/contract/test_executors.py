"""One contract for every executor: a batch is a function of (recipe, position), whatever computes it.

Each test is one promise, parametrized over the executors in :data:`EXECUTORS` (worker processes,
thread workers, threads inside worker processes, Ray actors on a small local cluster); a new
executor is one more entry there. Where a promise cannot apply to an executor (an ``os._exit`` in
a thread worker ends the training process, which the thread shares), the test's parameter list
says so, with the reason, instead of a skip.

The reference is the main process (``num_workers=0``) for seeded map-style pipelines, and worker
processes for iterable streams (torch's own round-robin of per-worker streams).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import seqloader
from contract_fixtures import executor, no_leaks, process_executor, ray_cluster  # noqa: F401 (fixtures)
from contract_items import (DrawingStream, GlobalDraws, InitialSeed, RaisesAt, Strided, ThreadSafeDraws,
                            WaitsAt, Warns, WorkerInfoItems, record_worker_id,
                            seed_numpy_with_worker_id, strided_iterator)
from contract_executors import EXECUTORS
from forking import wait_until
from seqloader.testing import assert_batches_equal

HERE = Path(__file__).resolve().parent

def batches(**kw) -> list:
    return list(seqloader.DataLoader(**kw))


# -- the same batches and states -------------------------------------------------------------------

PIPELINES = {
    "thread_safe_generator": lambda: dict(dataset=ThreadSafeDraws(), shuffle=True),
    "rng_map": lambda: dict(dataset=seqloader.rng_map(_noisy, range(24), seed=5), shuffle=True),
    "global_draws": lambda: dict(dataset=GlobalDraws(), shuffle=True),
    "initial_seed": lambda: dict(dataset=InitialSeed()),  # the batch's seed, as a worker process sees it
    "schedule": lambda: dict(dataset=ThreadSafeDraws(40), shuffle=True, batch_size_schedule=[(0, 2), (3, 4)]),
    "mix": lambda: dict(dataset=seqloader.mix([range(0, 100), range(1000, 1100)], [0.3, 0.7], seed=3, length=30),
                        shuffle=True),
}
#: the executors that cannot reproduce a draw from a global generator (they share it with the
#: training loop, or between threads): they must warn, with advice that works on every executor
CANNOT_REPRODUCE_GLOBAL_DRAWS = {"threads", "threads_in_processes"}


def _noisy(x, rng):
    return torch.tensor([float(x), rng.random()])


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_seeded_batches_are_the_main_process_batches(request, executor, pipeline):
    want = batches(**PIPELINES[pipeline](), batch_size=4, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(**PIPELINES[pipeline](), batch_size=4, seed=0, **executor)
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "seqloader" in str(w.message)]
    if pipeline == "global_draws" and request.node.callspec.params["executor"] in CANNOT_REPRODUCE_GLOBAL_DRAWS:
        assert warned, "a draw from a global generator that this executor cannot reproduce must warn"
        for message in warned:  # advice that works on every executor
            assert "seqloader.rng_map" in message and "torch.thread_safe_generator()" in message, message
            assert "get_worker_info().rng" not in message, message
        return
    assert_batches_equal(got, want, f"{pipeline} batches")
    assert not warned, warned


def test_an_items_warning_reaches_the_training_process(executor):
    with pytest.warns(UserWarning, match=r"item 5 says so"):
        batches(dataset=Warns(), batch_size=2, **executor)


def test_out_of_order_batches_are_each_batch_once(executor):
    want = batches(dataset=ThreadSafeDraws(), batch_size=4, shuffle=True, seed=0)
    got = batches(dataset=ThreadSafeDraws(), batch_size=4, shuffle=True, seed=0, in_order=False, **executor)
    key = lambda b: b[:, 0].tolist()  # noqa: E731
    assert_batches_equal(sorted(got, key=key), sorted(want, key=key))


@pytest.mark.parametrize("direction", ["saved_here_resumed_by_processes", "saved_by_processes_resumed_here"])
def test_a_state_resumes_across_executors(executor, direction):
    kw = dict(dataset=ThreadSafeDraws(), batch_size=4, shuffle=True, seed=0)
    want = batches(**kw)
    save_kw, load_kw = (executor, {}) if direction.startswith("saved_here") else ({}, executor)
    saving = seqloader.DataLoader(**kw, **save_kw)
    it = iter(saving)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(saving.state_dict()))
    del it
    loading = seqloader.DataLoader(**kw, **load_kw)
    loading.load_state_dict(state)
    assert_batches_equal(head + list(loading), want)


@pytest.mark.parametrize("stream", [Strided, strided_iterator, DrawingStream])
def test_iterable_streams_and_their_states_are_those_of_worker_processes(executor, stream):
    def run(**kw):
        loader = seqloader.DataLoader(stream(), batch_size=2, seed=3, **kw)
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = {k: v for k, v in loader.state_dict().items() if k != "saved_with"}
        return head + list(it), state

    want, want_state = run(num_workers=2)
    got, state = run(**executor)
    assert_batches_equal(got, want)
    assert state == want_state


# -- errors ---------------------------------------------------------------------------------------

def test_an_error_keeps_its_type_and_names_its_item_and_batch(executor):
    loader = seqloader.DataLoader(RaisesAt(13, KeyError("no 13")), batch_size=2, seed=0, **executor)
    with pytest.raises(KeyError, match="no 13") as info:
        list(loader)
    assert "seqloader: raised in DataLoader at item 13 (batch 6, epoch 0)" in info.value.__notes__


_BASE_EXCEPTION_RUN = textwrap.dedent("""
    import json, sys
    sys.path[:0] = {paths!r}
    import seqloader
    from contract_items import RaisesAt
    kw = {kw}
    if "address" in kw:
        kw["worker_method"] = seqloader.RayWorkers(address=kw.pop("address"))
    try:
        list(seqloader.DataLoader(RaisesAt(57, {error}), batch_size=4, seed=0, **kw))
        out = {{"raised": None}}
    except Exception as e:
        out = {{"raised": type(e).__name__, "text": " ".join([str(e), *getattr(e, "__notes__", [])])}}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("error", ['"sys.exit"', "KeyboardInterrupt()", "GeneratorExit()"])
def test_a_base_exception_in_an_item_is_an_error_naming_the_batch_never_an_exit(executor, error):
    """Run in a child process: today's failure mode is the end of the training process."""
    kw = {k: v for k, v in executor.items() if not isinstance(v, seqloader.RayWorkers)}
    if isinstance(executor.get("worker_method"), seqloader.RayWorkers):
        kw["address"] = executor["worker_method"].address
    code = _BASE_EXCEPTION_RUN.format(paths=[str(HERE), str(HERE.parent)], kw=repr(kw), error=error)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"the training process ended (exit code {proc.returncode}):\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["raised"] == "RuntimeError", out
    name = {'"sys.exit"': "SystemExit(3)"}.get(error, error)
    assert f"an item raised {name} in batch 14 (dataset indices [56, 57, 58, 59])" in out["text"], out


@pytest.mark.parametrize("restarts", [0, 3])
def test_a_death_blames_the_batch_that_died(process_executor, restarts):
    loader = seqloader.DataLoader(RaisesAt(57, "exit", n=200), batch_size=4, seed=0,
                                  max_worker_restarts=restarts, **process_executor)
    got = []
    with pytest.raises(RuntimeError) as info:
        for b in loader:
            got.append(b)
    blamed = ["batch 14 (dataset indices [56, 57, 58, 59])"]
    if isinstance(process_executor.get("worker_method"), seqloader.RayWorkers):
        # Ray fails every pending call of a dead actor alike: a reply computed but not yet
        # delivered looks owed, so the batch before it on that actor may be named instead
        # (docs/ray.md, "Known limits"); a known gap, not a promise
        blamed.append("batch 12 (dataset indices [48, 49, 50, 51])")
    assert any(b in str(info.value) for b in blamed), str(info.value)
    if restarts:  # the epoch ends at the poison batch: what came before it came once, in order
        assert "poison batch" in str(info.value)
        assert [b.tolist() for b in got] == [list(range(4 * k, 4 * k + 4)) for k in range(len(got))]
        assert len(got) <= 14


def test_a_timeout_names_the_batch(executor, tmp_path):
    release = tmp_path / "release"
    loader = seqloader.DataLoader(WaitsAt(13, release), batch_size=2, timeout=5, **executor)
    it = iter(loader)
    try:
        assert [next(it).tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]  # the workers run
        with pytest.raises(RuntimeError, match="DataLoader timed out after 5 seconds") as info:
            for _ in it:
                pass
        assert "batch 6 (dataset indices [12, 13])" in str(info.value), str(info.value)
    finally:
        release.touch()  # the waiting item ends; its worker is stopped with the iterator
        del it


# -- worker set-up --------------------------------------------------------------------------------

def test_worker_init_fn_and_get_worker_info(executor):
    got = batches(dataset=WorkerInfoItems(), batch_size=2, worker_init_fn=record_worker_id, **executor)
    rows = torch.cat(got)
    assert rows[:, 0].tolist() == list(range(16))
    assert set(rows[:, 1].tolist()) <= {0, 1} and set(rows[:, 2].tolist()) == {2}
    assert set(rows[:, 3].tolist()) == {1}


#: the executors whose workers share the training process's global generators: a worker_init_fn
#: that seeds them has no effect on items there, and says so once
SHARE_THE_GLOBAL_GENERATORS = {"threads"}


def test_a_worker_init_fn_seeding_numpy_leaves_the_training_process_alone(request, executor):
    np.random.seed(123)
    want = np.random.rand(3)
    np.random.seed(123)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(dataset=ThreadSafeDraws(8), batch_size=2, seed=0, worker_init_fn=seed_numpy_with_worker_id,
                      **executor)
    assert np.random.rand(3).tolist() == want.tolist()
    assert_batches_equal(got, batches(dataset=ThreadSafeDraws(8), batch_size=2, seed=0))
    said = [str(w.message) for w in caught if "worker_init_fn changed the global" in str(w.message)]
    assert len(said) == (request.node.callspec.params["executor"] in SHARE_THE_GLOBAL_GENERATORS), said


# -- arguments ------------------------------------------------------------------------------------

#: executor -> (keywords, the argument the error must name) that mean nothing for it
REFUSED = {
    "processes": [(dict(threads_per_worker=100_000), "threads_per_worker"), (dict(worker_method="threads"), "worker_method")],
    "threads_in_processes": [(dict(threads_per_worker=0), "threads_per_worker")],
    "threads": [(dict(multiprocessing_context="spawn"), "multiprocessing_context"),
                (dict(multiprocessing_context=multiprocessing.get_context("spawn")), "multiprocessing_context"),
                (dict(threads_per_worker=2), "threads_per_worker")],
    "ray": [(dict(multiprocessing_context="spawn"), "multiprocessing_context"),
            (dict(multiprocessing_context=multiprocessing.get_context("spawn")), "multiprocessing_context"),
            (dict(threads_per_worker=2), "threads_per_worker")],
}


@pytest.mark.parametrize("name", list(EXECUTORS))
def test_arguments_that_mean_nothing_for_the_executor_are_refused_naming_them(name):
    for extra, argument in REFUSED[name]:
        kw = {**EXECUTORS[name], **extra}
        with pytest.raises(ValueError, match=f"^DataLoader: {argument}"):
            seqloader.DataLoader(range(4), **kw)  # at construction: nothing starts
        # prefetch() speaks the same words (its "method" is the loader's "worker_method")
        method = kw.pop("worker_method", "process")
        with pytest.raises(ValueError, match=f"^prefetch: {argument.replace('worker_method', 'method')}"):
            seqloader.prefetch(range(4), 2, method=method, **{k: v for k, v in kw.items() if k != "num_workers"})


# -- cleanup --------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["break", "del", "end"])
def test_nothing_outlives_the_loader(executor, how):
    loader = seqloader.DataLoader(ThreadSafeDraws(), batch_size=2, **executor)
    it = iter(loader)
    next(it)
    if how == "end":
        list(it)
    del it, loader
    gc.collect()  # the no_leaks fixture checks processes, segments, actors and threads
