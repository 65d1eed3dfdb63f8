"""``Prefetch.start``: workers start, run their set-up, and report it (``Ready``) or its failure.

Initialisers are module-level functions so that they pickle for ``spawn``.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pathlib

import pytest

import seqloader.prefetcher.prefetch as prefetch_module
from seqloader import prefetch
from seqloader.prefetcher.prefetch import WorkerDied

FORK = multiprocessing.get_context("fork")


def failing_init(worker_id):
    if worker_id == 1:
        raise ValueError(f"worker {worker_id} has no config")


def exits_in_init(worker_id):
    os._exit(3)


def mark_started(directory, worker_id):
    pathlib.Path(directory, f"worker-{worker_id}").touch()


def blocks_in_init(event, worker_id):
    event.wait(60)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_start_raises_a_failing_worker_init_fn_error_before_any_read(method):
    p = prefetch(range(10), num_workers=2, multiprocessing_context=method, worker_init_fn=failing_init)
    with pytest.raises(ValueError, match=r"^worker 1 has no config") as info:
        p.start()
    assert str(info.value) == "worker 1 has no config"
    assert any(n.startswith("seqloader: worker_init_fn failed in worker 1 (pid ") for n in info.value.__notes__)
    assert "in failing_init" in str(info.value.__cause__)
    assert p.closed
    with pytest.raises(ValueError, match=r"after an earlier error \(worker_init_fn failed in worker 1\)"):
        p.start()


def test_start_returns_once_every_worker_has_run_its_set_up(tmp_path):
    init = functools.partial(mark_started, str(tmp_path))
    with prefetch(range(10), num_workers=3, worker_init_fn=init) as p:
        p.start()
        assert sorted(os.listdir(tmp_path)) == ["worker-0", "worker-1", "worker-2"]
        pids = [h.pid for h in p._executor.handles]
        p.start()  # idempotent: the same workers
        assert [h.pid for h in p._executor.handles] == pids
        assert list(p) == list(range(10)) and p.remaining == 0


def test_the_first_take_starts_the_workers_and_raises_their_set_up_error():
    p = prefetch(range(10), num_workers=2, worker_init_fn=failing_init)
    with pytest.raises(ValueError, match="worker 1 has no config"):
        p.take()
    assert p.closed


def test_a_worker_that_dies_during_its_set_up_is_a_worker_died_error():
    p = prefetch(range(10), num_workers=2, worker_init_fn=exits_in_init)
    with pytest.raises(WorkerDied, match=r"seqloader worker \d \(pid \d+\) exited unexpectedly with exit code 3 "
                                         r"while starting \(before its set-up and worker_init_fn finished\)"):
        p.start()
    assert p.closed


def test_a_set_up_longer_than_the_bound_is_a_runtime_error(monkeypatch):
    event = FORK.Event()
    monkeypatch.setattr(prefetch_module, "START_TIMEOUT", 0.5)
    p = prefetch(range(10), num_workers=2, multiprocessing_context="fork",
                 worker_init_fn=functools.partial(blocks_in_init, event))
    # The workers wait for an event nobody sets; close() terminates them (do not set it then:
    # Event.set() waits for its waiters to wake, and they are dead).
    with pytest.raises(RuntimeError, match=r"worker 0 \(pid \d+\), worker 1 \(pid \d+\) did not finish their "
                                           r"set-up .* within 0.5 seconds"):
        p.start()
    assert p.closed


def test_start_on_a_closed_prefetch_is_a_value_error():
    p = prefetch(range(3), num_workers=1)
    p.close()
    with pytest.raises(ValueError, match=r"read or reset after close\(\)"):
        p.start()


def test_start_with_an_empty_sequence_starts_the_workers():
    with prefetch([], num_workers=2) as p:
        p.start()
        assert len(p._executor.handles) == 2 and list(p) == []
