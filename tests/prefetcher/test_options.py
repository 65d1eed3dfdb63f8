"""Executor options with behaviour (``seqloader.prefetcher.options``, ``ray_options``): each options
object builds its executor and refuses what means nothing for it, so neither ``prefetch`` nor the
loader's ``Workers`` branches on its type; torch's spellings of the process options still work."""

from __future__ import annotations

import threading

import pytest

import seqloader as sl
from seqloader import ProcessWorkers, RayWorkers, ThreadWorkers
from seqloader.loader.workers.pool import executor_options, method_word
from seqloader.prefetcher.options import choose_executor

OPTIONS = [ProcessWorkers(), ProcessWorkers(threads=2), ThreadWorkers(), RayWorkers()]

_local = threading.local()


def mark_thread(worker_id, thread):
    """A ``thread_init_fn``: what the items of this thread report."""
    _local.mark = (worker_id, thread)


def thread_mark(i):
    return getattr(_local, "mark", None)


@pytest.mark.parametrize("options", OPTIONS, ids=repr)
def test_each_options_object_builds_its_own_executor_without_starting_it(options):
    executor = options.build(2, None, [1, 2], 2)
    try:
        assert executor.kind == {ProcessWorkers: "process", ThreadWorkers: "thread", RayWorkers: "ray"}[type(options)]
        assert executor.num_workers == 2 and not executor.closed
        assert executor.concurrency == options.threads
    finally:
        executor.close()


@pytest.mark.parametrize("options", OPTIONS, ids=repr)
def test_the_behaviour_the_loader_reads_is_on_the_options(options):
    assert options.in_this_process is isinstance(options, ThreadWorkers)
    assert method_word(options) == options.word
    assert options.word == ("thread" if isinstance(options, ThreadWorkers) else
                            options if isinstance(options, RayWorkers) else "multiprocessing")


def test_the_restarts_are_checked_by_the_executors_that_take_them_and_refused_by_threads():
    assert ProcessWorkers().check(restarts=2, respawn=None) == 2
    assert RayWorkers().check(shared=[1], restarts=1) == 1
    assert ThreadWorkers().check() == 0
    for name, value in (("shared", [1]), ("restarts", 2), ("respawn", print)):
        with pytest.raises(ValueError, match=f"^prefetch: {name} applies to worker processes only .* method='thread'"):
            ThreadWorkers().check(**{name: value})
    with pytest.raises(ValueError, match="^prefetch: restarts must be >= 0"):
        ProcessWorkers().check(restarts=-1)


def test_no_workers_is_refused_where_the_options_need_workers():
    ProcessWorkers().check_num_workers(0)
    ThreadWorkers().check_num_workers(0)
    with pytest.raises(ValueError, match=r"^DataLoader: threads_per_worker=2 needs num_workers > 0"):
        ProcessWorkers(threads=2).check_num_workers(0)
    with pytest.raises(ValueError, match=r"^DataLoader: worker_method='ray' needs num_workers > 0"):
        RayWorkers().check_num_workers(0)
    assert executor_options("ray", None, 1, 2) == RayWorkers()
    with pytest.raises(ValueError, match=r"^DataLoader: worker_method='ray' needs num_workers > 0"):
        executor_options("ray", None, 1, 0)


def test_thread_init_fn_is_a_field_of_the_process_options_and_torch_spelling_folds_into_it():
    options = choose_executor("process", threads_per_worker=2, thread_init_fn=mark_thread)
    assert options == ProcessWorkers(threads=2, thread_init_fn=mark_thread)
    assert choose_executor(ProcessWorkers(threads=2), thread_init_fn=mark_thread) == options  # added where none
    assert repr(ProcessWorkers(threads=2)) == "ProcessWorkers(context=None, threads=2)"
    assert repr(options).startswith("ProcessWorkers(context=None, threads=2, thread_init_fn=<function mark_thread")
    with pytest.raises(ValueError, match=r"^prefetch: thread_init_fn=.* given beside ProcessWorkers\(.*\); set it in"):
        choose_executor(options, thread_init_fn=print)
    with pytest.raises(ValueError, match=r"^prefetch: thread_init_fn runs in the threads of a worker process; pass "
                                         r"threads_per_worker > 1 too \(got threads_per_worker=1\)$"):
        choose_executor("process", thread_init_fn=mark_thread)
    with pytest.raises(TypeError, match="^prefetch: thread_init_fn must be callable or None"):
        choose_executor("process", threads_per_worker=2, thread_init_fn=3)
    with pytest.raises(ValueError, match="^ProcessWorkers: thread_init_fn runs in the threads of a worker process"):
        ProcessWorkers(thread_init_fn=mark_thread)


@pytest.mark.parametrize("method, why", [
    ("thread", r"\(got <function mark_thread at 0x[0-9a-f]+> with method='thread'\); worker_init_fn runs in each thread already"),
    ("ray", r"\(got it with method='ray'\); each actor computes one item at a time: use worker_init_fn"),
])
def test_thread_init_fn_is_refused_by_the_other_executors_before_anything_starts(method, why):
    with pytest.raises(ValueError, match=f"^prefetch: thread_init_fn applies to worker processes only {why}$"):
        sl.prefetch(range(3), 2, method=method, thread_init_fn=mark_thread)   # (not print: Ray replaces it)


@pytest.mark.mp
@pytest.mark.parametrize("spelling", ["torch's keywords", "options"])
def test_threads_inside_worker_processes_run_the_thread_init_fn_however_it_is_spelled(spelling):
    kwargs = (dict(threads_per_worker=2, thread_init_fn=mark_thread, multiprocessing_context="fork")
              if spelling == "torch's keywords" else
              dict(method=ProcessWorkers(context="fork", threads=2, thread_init_fn=mark_thread)))
    with sl.prefetch(sl.smap(thread_mark, range(8)), 2, **kwargs) as p:
        marks = list(p)
    assert all(m is not None for m in marks), marks
    assert {w for w, _ in marks} <= {0, 1} and {t for _, t in marks} <= {0, 1}
    assert [w for w, _ in marks] == [i % 2 for i in range(8)]  # affinity: item i on worker i % 2
