"""Ray workers (``DataLoader(worker_method="ray" | RayWorkers(...))``) on a real cluster of this
machine (``tests/ray_cluster.py``, one cluster for the module): the same batches and states as
worker processes and threads (in order, out of order, and an ``IterableDataset``'s streams; what
every executor promises is in ``tests/contract/test_executors.py``), a node lost
mid-epoch (SIGKILLed while one of its actors computes a marked batch; the test waits on the
marker) with a node added, and two gloo ranks sharing the cluster. Batches are compared with
``torch.equal`` against uninterrupted runs; nothing asserts timing.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch

import seqloader
from forking import BOUND
from ray_cluster import DATA, cluster_fixture, leak_check
from ray_items import Noisy, SafeDraws, offset_init, reached
from resumable_stream import Stream
from seqloader import RayWorkers
from seqloader.testing import assert_batches_equal, run_distributed

N = 48
ON_DATA_NODES = RayWorkers(resources={DATA: 1})


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_fixture()


@pytest.fixture
def no_leaks(cluster):  # replaces the conftest's check for this module: see tests/ray_cluster.py
    yield from leak_check(cluster)


def epochs(loader, n=2):
    out = []
    for e in range(n):
        loader.set_epoch(e)
        out.append(list(loader))
    return out


def test_batches_seeds_worker_info_and_worker_init_fn_are_those_of_worker_processes(cluster):
    def make(method):
        return seqloader.DataLoader(Noisy(N), batch_size=4, shuffle=True, seed=11, num_workers=2, persistent_workers=True,
                                    worker_method=method, worker_init_fn=offset_init)

    ray_loader = make("ray")
    on_ray = epochs(ray_loader)
    on_processes = epochs(make("multiprocessing"))
    for e in range(2):
        assert_batches_equal(on_ray[e], on_processes[e], f"epoch {e}")
    assert {int(b[0, 2]) for b in on_ray[0]} == {100, 201}  # worker w: w + offset_init's 100 * (w + 1)
    s = ray_loader.stats()["current"]
    assert s["batches"] == N // 4 and s["shm_bytes"] > 0 and len(s["workers"]) == 2


def test_out_of_order_batches_and_their_state_are_those_of_worker_processes(cluster):
    def make(method):
        return seqloader.DataLoader(SafeDraws(N), batch_size=4, shuffle=True, seed=5, num_workers=2, in_order=False,
                                    worker_method=method)

    loader = make(ON_DATA_NODES)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    state = loader.state_dict()
    del it
    resumed = make("multiprocessing")
    resumed.load_state_dict(state)
    got = head + list(resumed)
    first = lambda b: int(b[0, 0])  # noqa: E731
    want = {first(b): b for b in seqloader.DataLoader(SafeDraws(N), batch_size=4, shuffle=True, seed=5)}
    assert sorted(map(first, got)) == sorted(want)  # each batch once
    assert all(torch.equal(b, want[first(b)]) for b in got)


def test_an_iterable_dataset_reads_one_stream_per_actor_and_resumes_with_processes(cluster):
    def make(**kw):
        return seqloader.DataLoader(Stream(N), batch_size=4, seed=2, num_workers=2, **kw)

    want = list(make())
    loader = make(worker_method="ray")
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert_batches_equal(head + list(resumed), want)


def test_a_node_lost_mid_epoch_costs_no_sample_and_repeats_none(cluster, tmp_path, caplog):
    open(tmp_path / "arm", "w").close()
    marked_batch = 5  # batch_size 4, no shuffle: sample 21 is in batch 5

    def make(dataset, **kw):
        return seqloader.DataLoader(dataset, batch_size=4, seed=7, **kw)

    want = list(make(Noisy(N)))
    out: dict = {}

    def read():  # the loader runs here; the cluster is changed from the main thread (Ray needs it)
        try:
            loader = make(Noisy(N, tmp_path, at=4 * marked_batch + 1), num_workers=4, worker_method=ON_DATA_NODES,
                          max_worker_restarts=4)
            out["batches"] = list(loader)
            out["stats"] = loader.stats()["current"]
        except BaseException as exc:  # reported to the test
            out["error"] = exc

    reader = threading.Thread(target=read)
    reader.start()
    where = reached(tmp_path)
    os.unlink(tmp_path / "arm")  # the replacement computes the batch without waiting
    cluster.remove_node(where["node"])
    cluster.add_node()
    reader.join(BOUND)
    assert not reader.is_alive() and "error" not in out, out.get("error")
    got = out["batches"]
    samples = [int(i) for b in got for i in b[:, 0]]
    assert sorted(samples) == list(range(N)) and len(samples) == N  # 0 lost, 0 duplicated
    assert_batches_equal([b[:, :2] for b in got], [b[:, :2] for b in want])  # ids and seeded draws
    assert sum(w["restarts"] for w in out["stats"]["workers"]) == 2  # the two actors of the lost node
    assert any(f"while producing batch {marked_batch} (dataset indices" in r.getMessage() for r in caplog.records)


def _rank(rank, world_size, address):
    """Each rank's loader: Ray actors on the shared cluster, and the same loader without workers."""
    def make(**kw):
        return seqloader.DataLoader(SafeDraws(N), batch_size=4, shuffle=True, seed=21, **kw)

    on_ray = list(make(num_workers=1, worker_method=RayWorkers(address=address, resources={DATA: 1})))
    return {"ray": on_ray, "local": list(make())}


def test_two_gloo_ranks_share_the_cluster_and_keep_their_shards(cluster, tmp_path):
    ranks = run_distributed(_rank, 2, (cluster.address,), workdir=tmp_path, timeout=240)
    for r in ranks:
        assert_batches_equal(r["ray"], r["local"])
    shards = [{int(i) for b in r["ray"] for i in b[:, 0]} for r in ranks]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(N))


def test_ray_arguments_are_checked(cluster):
    # (arguments for worker processes only: tests/contract/test_executors.py, for every executor)
    with pytest.raises(ValueError, match="worker_method='ray' needs num_workers > 0"):
        seqloader.DataLoader(range(4), worker_method=RayWorkers())
    with pytest.raises(TypeError, match="RayWorkers: resources must be a dict"):
        RayWorkers(resources=[("data", 1)])
