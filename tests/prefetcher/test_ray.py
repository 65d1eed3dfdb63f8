"""The Ray executor (``prefetch(method="ray")``) on a real cluster of this machine: a head and two
"data" nodes, each its own raylet on loopback (``seqloader.testing.LocalRayCluster`` through
``tests/ray_cluster.py``), one cluster per module.

What Ray actors do alone: the counters, ``take`` with the actors reused by ``reset``, resources no
node has; a node SIGKILLed while it computes an item (the item writes a marker; the test waits on
it) and a node added: every item once, in order, equal to the oracle; bounded resubmissions ending
in an error naming the item. What every executor promises (order, seeks, reset, writable values,
errors with the user's type and a note, timeouts, a lost worker named, close) is
``test_promises.py``, on its own cluster. Nothing asserts timing.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import seqloader as sl
from forking import BOUND
from ray_cluster import DATA, cluster_fixture, leak_check
from ray_items import ExitsAt, Marked, reached, same, value
from seqloader.prefetcher.faults import WorkerDied
from seqloader.prefetcher.ray_options import RayWorkers

ON_DATA_NODES = RayWorkers(resources={DATA: 1})


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_fixture()


@pytest.fixture
def no_leaks(cluster):  # replaces the conftest's check for this module: see tests/ray_cluster.py
    yield from leak_check(cluster)


# -- reading -------------------------------------------------------------------------------------------

def test_counters_name_the_executor_and_count_the_bytes_that_came_back(cluster):
    with sl.prefetch(sl.smap(value, range(40)), 2, method="ray") as p:
        first = [p[i] for i in range(10)]
        p.seek(30)
        tail = [p[i] for i in range(30, 40)]
        back = p[5]
        c = p.counters()
    assert all(same(a, value(i)) for i, a in enumerate(first))
    assert all(same(a, value(30 + k)) for k, a in enumerate(tail)) and same(back, value(5))
    assert c["executor"] == "ray" and c["shm_bytes"] > 21 * 4000 and c["restarts"] == 0


def test_take_reads_in_completion_order_and_reset_reuses_the_actors(cluster):
    data = list(range(100, 120))
    with sl.prefetch(sl.gather(data, np.arange(20)), 2, method="ray", affinity=False) as p:
        taken = sorted(p.take()[1] for _ in range(20))
        p.reset(sl.gather(data, np.arange(19, -1, -1)))  # the same actors read a new sequence
        again = list(p)
        started = p.executor.counters()["actors_started"]
    assert taken == data and again == data[::-1] and started == 2


def test_resources_no_node_has_are_refused_before_waiting(cluster):
    with pytest.raises(ValueError, match=r"no node of the Ray cluster can hold one worker actor .*'gpu_box': 1"):
        sl.prefetch(range(3), 1, method=RayWorkers(resources={"gpu_box": 1})).start()


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


