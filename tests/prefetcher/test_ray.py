"""The Ray executor (``prefetch(method="ray")``) on a real cluster of this machine: a head and two
"data" nodes, each its own raylet on loopback (``seqloader.testing.LocalRayCluster`` through
``tests/ray_cluster.py``), one cluster per module.

The generic semantics (order, seeks, ``take``, ``reset``, errors with the user's type and a note,
timeouts, healing) against oracles; a node SIGKILLed while it computes an item (the item writes a
marker; the test waits on it) and a node added: every item once, in order, equal to the oracle;
bounded resubmissions ending in an error naming the item. Nothing asserts timing.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
import torch

import seqloader as sl
from forking import BOUND, wait_until
from ray_cluster import DATA, cluster_fixture, leak_check
from ray_items import ExitsAt, Marked, fails_at_7, needs_config, reached, same, value, with_tensor
from seqloader.prefetcher.faults import ItemTimeout, WorkerDied
from seqloader.prefetcher.ray_options import RayWorkers

ON_DATA_NODES = RayWorkers(resources={DATA: 1})


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_fixture()


@pytest.fixture
def no_leaks(cluster):  # replaces the conftest's check for this module: see tests/ray_cluster.py
    yield from leak_check(cluster)


# -- reading -------------------------------------------------------------------------------------------

def test_items_come_in_order_as_writable_copies_with_seeks(cluster):
    with sl.prefetch(sl.smap(value, range(40)), 2, method="ray") as p:
        assert p.executor.kind == "ray" and repr(p).startswith("prefetch(method='ray', num_workers=2")
        first = [p[i] for i in range(10)]
        p.seek(30)
        tail = [p[i] for i in range(30, 40)]
        back = p[5]
        c = p.counters()
    assert all(same(a, value(i)) for i, a in enumerate(first))
    assert all(same(a, value(30 + k)) for k, a in enumerate(tail)) and same(back, value(5))
    x = first[3]["x"]
    x += 1  # writable, and valid after close
    assert x[0] == 4
    assert c["executor"] == "ray" and c["shm_bytes"] > 21 * 4000 and c["restarts"] == 0


def test_take_reads_in_completion_order_and_reset_reuses_the_actors(cluster):
    data = list(range(100, 120))
    with sl.prefetch(sl.gather(data, np.arange(20)), 2, method="ray", affinity=False) as p:
        taken = sorted(p.take()[1] for _ in range(20))
        p.reset(sl.gather(data, np.arange(19, -1, -1)))  # the same actors read a new sequence
        again = list(p)
        started = p.executor.counters()["actors_started"]
    assert taken == data and again == data[::-1] and started == 2


def test_an_item_error_keeps_its_type_and_gains_a_note_and_the_reader_goes_on(cluster):
    with sl.prefetch(sl.smap(fails_at_7, range(12)), 2, method="ray") as p:
        assert [p[i] for i in range(7)] == list(range(7))
        with pytest.raises(KeyError, match="no item 7") as info:
            p[7]
        assert [p[i] for i in range(8, 12)] == list(range(8, 12))
    notes = "\n".join(info.value.__notes__)
    assert "smap(fails_at_7" in notes and "item 7 of prefetch(method='ray'" in notes and "(Ray actor, pid" in notes
    assert "RayTaskError" not in type(info.value).__name__ and info.value.seqloader_index == 7


def test_tensors_come_back_writable_and_equal(cluster):
    with sl.prefetch(sl.smap(with_tensor, range(6)), 1, method="ray") as p:
        got = list(p)
    assert all(torch.equal(t, with_tensor(i)) for i, t in enumerate(got))
    got[2] += 1  # a writable copy, not a view of Ray's read-only object store
    assert got[2].tolist() == [3, 4, 5, 6, 7]


def test_a_failing_worker_init_fn_raises_its_own_error_and_closes(cluster):
    p = sl.prefetch(range(4), 2, method="ray", worker_init_fn=needs_config)
    with pytest.raises(LookupError, match="no config for worker") as info:
        p.start()
    assert p.closed and "worker_init_fn failed in worker" in info.value.__notes__[0]


def test_a_timeout_names_the_item_and_leaves_the_reader_usable(cluster, tmp_path):
    open(tmp_path / "arm", "w").close()
    with sl.prefetch(sl.smap(Marked(tmp_path, at=2), range(6)), 2, method="ray", timeout=0.5) as p:
        assert same(p[0], value(0)) and same(p[1], value(1))
        reached(tmp_path)
        with pytest.raises(ItemTimeout, match="timed out after 0.5 seconds waiting for item 2") as info:
            p[2]
        open(tmp_path / "release", "w").close()
        assert "Ray actor" in str(info.value)
        assert wait_until(lambda: _read_or_timeout(p, 2))


def _read_or_timeout(p, i):
    try:
        return same(p[i], value(i))
    except ItemTimeout:
        return False


def test_resources_no_node_has_are_refused_before_waiting(cluster):
    with pytest.raises(ValueError, match=r"no node of the Ray cluster can hold one worker actor .*'gpu_box': 1"):
        sl.prefetch(range(3), 1, method=RayWorkers(resources={"gpu_box": 1})).start()


def test_process_only_arguments_are_refused(cluster):
    with pytest.raises(ValueError, match="multiprocessing_context applies to worker processes only"):
        sl.prefetch(range(3), 1, method="ray", multiprocessing_context="spawn")


def test_a_dropped_prefetch_kills_its_actors(cluster):
    p = sl.prefetch(range(5), 2, method=ON_DATA_NODES)
    assert p[4] == 4
    del p
    gc.collect()  # the finalizer sends the kills; the leak check waits for the actors to be dead


# -- hosts that come and go ------------------------------------------------------------------------------

def test_a_node_lost_mid_item_loses_and_repeats_nothing_and_a_new_node_takes_over(cluster, tmp_path, caplog):
    n = 40
    open(tmp_path / "arm", "w").close()
    out: dict = {}

    def read():  # the reader runs here; the cluster is changed from the main thread (Ray needs it)
        try:
            with sl.prefetch(sl.smap(Marked(tmp_path, at=13), range(n)), 4, method=ON_DATA_NODES, restarts=4) as p:
                out["items"] = [p[i] for i in range(n)]
                out["counters"], out["executor"] = p.counters(), p.executor.counters()
        except BaseException as exc:  # reported to the test
            out["error"] = exc

    reader = threading.Thread(target=read)
    reader.start()
    where = reached(tmp_path)
    os.unlink(tmp_path / "arm")  # the replacement computes item 13 without waiting
    cluster.remove_node(where["node"])
    cluster.add_node()
    reader.join(BOUND)
    assert not reader.is_alive() and "error" not in out, out.get("error")
    assert len(out["items"]) == n and all(same(a, value(i)) for i, a in enumerate(out["items"]))
    assert out["counters"]["restarts"] == 2  # the two actors of the lost node
    assert out["executor"]["actors_started"] == 6 and out["executor"]["nodes"] == 3  # the new node ran two
    lost = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 2 and any("while producing item 13" in m for m in lost)


# With read-ahead, a reply an actor sent just before its process died can be lost with it, so a
# death is attributed to the first item it had not answered; prefetch_factor=1 (one job in flight
# per actor) makes that the item it was computing.

def test_an_item_that_kills_two_actors_is_named_and_not_computed_again(cluster):
    with sl.prefetch(sl.smap(ExitsAt(5), range(10)), 2, method=ON_DATA_NODES, restarts=3, prefetch_factor=1) as p:
        assert [p[i] for i in range(5)] == list(range(5))
        with pytest.raises(WorkerDied, match="item 5 killed two workers .* poison item") as info:
            p[5]
    assert info.value.poison and info.value.item == 5 and p.closed


def test_without_restarts_a_lost_actor_raises_naming_the_item(cluster):
    with sl.prefetch(sl.smap(ExitsAt(3), range(10)), 2, method=ON_DATA_NODES, prefetch_factor=1) as p:
        with pytest.raises(WorkerDied, match=r"worker 1 \(Ray actor, pid \d+ on 127.0.0.1\) was lost .* while "
                                             r"producing item 3") as info:
            [p[i] for i in range(10)]
    assert info.value.item == 3 and not info.value.poison
