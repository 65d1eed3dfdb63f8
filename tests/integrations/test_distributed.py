"""Distributed sharding and elastic resume, checked in real gloo process groups (no mocks).

Every world is started by :func:`seqloader.testing.run_distributed`: fresh
``spawn`` processes, a ``file://`` rendezvous in ``tmp_path``, ``destroy_process_group`` in every
rank and a join with a timeout in the parent. The rank functions live at module level (they are
pickled by reference) and return what they consumed; the parent makes every assertion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DistributedSampler

import seqloader
from seqloader.testing import run_distributed
from seqloader.integrations.torch_iterable import as_iterable_dataset
from seqloader.loader.world import draw_seed


class Items:
    """A map-style dataset whose item ``i`` is ``i``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Regression:
    """Item ``i``: ``(x, y, i)`` with ``y = x @ w + noise``, a pure function of ``i``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.01 * torch.randn((), generator=g), i


def _flat(batches):
    return [i for b in batches for i in b]


def _torch_seed(rank, phase=0):
    """A different torch seed on every rank (and phase): ``seed=None`` must still agree."""
    torch.manual_seed(1000 + 100 * phase + rank)


# -- rank functions ------------------------------------------------------------------------------

def _fail_on_last_rank(rank, world_size):
    if rank == world_size - 1:
        raise ValueError(f"rank {rank} rejects its shard")
    dist.barrier()  # would wait for the failed rank until the gloo timeout
    return rank


def _tasks(rank, world_size, tasks):
    """Run ``[(name, kwargs), ...]`` of the ``_task_*`` functions in one world, in order."""
    return {name: globals()[f"_task_{name.split(':')[0]}"](rank, world_size, **kw) for name, kw in tasks}


def _task_epoch(rank, world_size, n, batch_size, seed, drop_last=False, num_workers=0):
    _torch_seed(rank)
    loader = seqloader.DataLoader(Items(n), batch_size=batch_size, shuffle=True, seed=seed,
                                  drop_last=drop_last, num_workers=num_workers)
    return {"seed": loader.seed, "len": len(loader), "batches": [b.tolist() for b in loader],
            "state": loader.state_dict()}


def _task_save(rank, world_size, n, batch_size, steps):
    _torch_seed(rank)
    loader = seqloader.DataLoader(Items(n), batch_size=batch_size, shuffle=True, seed=None)
    it = iter(loader)
    batches = [next(it).tolist() for _ in range(steps)]
    return {"batches": batches, "state": json.dumps(loader.state_dict())}


def _task_resume(rank, world_size, n, batch_size, state):
    _torch_seed(rank, phase=1)
    loader = seqloader.DataLoader(Items(n), batch_size=batch_size, shuffle=True, seed=None)
    loader.load_state_dict(json.loads(state))
    return {"batches": [b.tolist() for b in loader], "state": loader.state_dict()}


def _task_iterable(rank, world_size, n):
    ds = as_iterable_dataset(range(n))  # rank and world size from the process group
    loader = torch.utils.data.DataLoader(ds, batch_size=2)
    return {"rank": ds.rank, "world_size": ds.world_size, "len": len(ds),
            "items": [i for b in loader for i in b.tolist()]}


def _task_distributed_sampler(rank, world_size, n, batch_size, steps):
    """Two epochs through an explicit DistributedSampler, then a save/resume in epoch 1."""
    ds = Items(n)

    def make():
        sampler = DistributedSampler(ds, shuffle=True, seed=7)
        return sampler, seqloader.DataLoader(ds, batch_size=batch_size, sampler=sampler, seed=3)

    sampler, loader = make()
    epochs, expected = [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected.append([list(b) for b in BatchSampler(list(sampler), batch_size, False)])
        epochs.append([b.tolist() for b in loader])
    sampler, loader = make()
    sampler.set_epoch(0)
    list(loader)
    sampler.set_epoch(1)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(steps)]
    state = json.dumps(loader.state_dict())
    sampler, loader = make()
    loader.load_state_dict(json.loads(state))
    sampler.set_epoch(json.loads(state)["epoch"])  # the user's sampler still needs its epoch
    tail = [b.tolist() for b in loader]
    return {"epochs": epochs, "expected": expected, "head": head, "tail": tail,
            "state": json.loads(state)}


def _task_ddp(rank, world_size, n, batch_size, num_workers):
    torch.manual_seed(rank)  # DDP broadcasts rank 0's initial parameters
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    initial = [p.detach().clone().flatten().tolist() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = seqloader.DataLoader(Regression(n), batch_size=batch_size, shuffle=True, seed=0,
                                  num_workers=num_workers)
    losses, seen = [], []
    for x, y, i in loader:
        loss = ((model(x).squeeze(1) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        seen += i.tolist()
    return {"len": len(loader), "losses": losses, "seen": seen, "initial": initial,
            "weights": [p.detach().flatten().tolist() for p in model.parameters()]}


def _sleep(rank, world_size):
    time.sleep(60)


# -- run_distributed -----------------------------------------------------------------------------

def test_a_failing_rank_raises_its_error_and_stops_the_others(tmp_path):
    with pytest.raises(ValueError, match="rank 1 rejects its shard") as info:
        run_distributed(_fail_on_last_rank, 2, workdir=tmp_path, timeout=60)
    assert any("run_distributed at rank 1 of 2" in note for note in info.value.__notes__)


def _succeed_then_die_at_exit(rank, world_size):
    import atexit

    atexit.register(os._exit, 3)  # runs after the "ok" report, like a crash in teardown
    return rank


def test_a_rank_that_dies_after_reporting_success_is_an_error_not_a_result(tmp_path):
    with pytest.raises(RuntimeError, match=r"rank 0 \(pid \d+\) exited with code 3 without reporting an error"):
        run_distributed(_succeed_then_die_at_exit, 1, workdir=tmp_path, timeout=60)


def test_a_hung_world_is_terminated_after_the_timeout(tmp_path):
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[0\] did not finish within 3 s"):
        run_distributed(_sleep, 1, workdir=tmp_path, timeout=3)


# -- worlds (each started once per module) ------------------------------------------------------

EPOCHS = {  # name: (n, batch_size, seed, drop_last, num_workers)
    "epoch:seed=None": dict(n=10, batch_size=2, seed=None),
    "epoch:seed=5": dict(n=11, batch_size=3, seed=5),
    "epoch:drop_last": dict(n=11, batch_size=2, seed=5, drop_last=True),
}
N_RESUME, BS_RESUME = 25, 2


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tasks = [*EPOCHS.items(),
             ("epoch:workers", dict(n=13, batch_size=2, seed=9, num_workers=1)),
             ("save", dict(n=N_RESUME, batch_size=BS_RESUME, steps=2)),
             ("distributed_sampler", dict(n=12, batch_size=2, steps=1)),
             ("ddp", dict(n=32, batch_size=4, num_workers=1))]
    return run_distributed(_tasks, 2, (tasks,), workdir=tmp_path_factory.mktemp("two"))


def _resume_task(saved):
    return ("resume", dict(n=N_RESUME, batch_size=BS_RESUME, state=saved[0]["save"]["state"]))


@pytest.fixture(scope="module")
def three_ranks(two_ranks, tmp_path_factory):
    """Also resumes the state the two ranks saved (one world fewer to start)."""
    tasks = [*EPOCHS.items(),
             ("iterable", dict(n=11)),
             ("save", dict(n=N_RESUME, batch_size=BS_RESUME, steps=1)),
             _resume_task(two_ranks)]
    return run_distributed(_tasks, 3, (tasks,), workdir=tmp_path_factory.mktemp("three"))


@pytest.fixture(scope="module")
def two_ranks_resumed(three_ranks, tmp_path_factory):
    return run_distributed(_tasks, 2, ([_resume_task(three_ranks)],), workdir=tmp_path_factory.mktemp("two-r"))


def _global_order(n, seed):
    """The epoch-0 order in a single process: what every rank of a world shares."""
    (batch,) = seqloader.DataLoader(Items(n), batch_size=n, shuffle=True, seed=seed)
    return batch.tolist()


def _by_position(parts, world_size, start=0):
    """``{global position: item}`` from each rank's flattened items (rank r's j-th at r + j*w)."""
    out = {}
    for r, items in enumerate(parts):
        for j, item in enumerate(items):
            p = start + r + j * world_size
            assert p not in out, f"position {p} read twice"
            out[p] = item
    return out


# -- sharding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("world, name", [*((w, name) for w in ("two_ranks", "three_ranks") for name in EPOCHS),
                                         ("two_ranks", "epoch:workers")])
def test_ranks_read_disjoint_shards_of_one_global_order(world, name, request):
    results = request.getfixturevalue(world)
    w = len(results)
    runs = [res[name] for res in results]
    cfg = {**dict(drop_last=False), **(EPOCHS.get(name) or dict(n=13, batch_size=2, seed=9))}
    n, bs, drop_last = cfg["n"], cfg["batch_size"], cfg["drop_last"]
    seeds = {run["seed"] for run in runs}
    assert len(seeds) == 1, f"ranks disagree on the seed: {seeds}"
    order = _global_order(n, seeds.pop())
    # the oracle: torch's DistributedSampler layout over the shared global order, then batching
    for r, run in enumerate(runs):
        layout = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False, drop_last=drop_last)
        want = [[order[i] for i in b] for b in BatchSampler(list(layout), bs, drop_last)]
        assert run["batches"] == want
        assert run["len"] == len(want) == len(runs[0]["batches"])  # equal batch counts on every rank
        assert run["state"] == runs[0]["state"]  # the state is the same on every rank
        assert (run["state"]["epoch"], run["state"]["position"]) == (1, 0)
    items = _by_position([_flat(run["batches"]) for run in runs], w)
    real = [items[p] for p in sorted(items) if p < n]
    padding = {p: items[p] for p in items if p >= n}
    assert len(set(real)) == len(real), "shards overlap"
    if drop_last:
        assert not padding and n - w * bs < len(real) <= n
    else:
        assert sorted(real) == list(range(n)), "shards do not cover the dataset"
        assert padding == {p: order[p - n] for p in padding}  # padding wraps to the order's start
        assert len(padding) == -n % w


def test_seed_none_is_rank_zeros_draw_broadcast(two_ranks, three_ranks):
    for results in (two_ranks, three_ranks):
        seeds = [res["epoch:seed=None"]["seed"] for res in results]
        with torch.random.fork_rng():
            torch.manual_seed(1000)  # rank 0's torch seed
            rank0 = draw_seed()
            torch.manual_seed(1001)  # rank 1's: it would have drawn another seed on its own
            rank1 = draw_seed()
        assert rank0 != rank1
        assert seeds == [rank0] * len(results)


def test_as_iterable_dataset_reads_rank_and_world_size_from_the_process_group(three_ranks):
    n = 11
    parts = [res["iterable"] for res in three_ranks]
    assert [(p["rank"], p["world_size"]) for p in parts] == [(0, 3), (1, 3), (2, 3)]
    assert [p["items"] for p in parts] == [list(range(r, n, 3)) for r in range(3)]
    assert [p["len"] for p in parts] == [4, 4, 3]


# -- elastic resume ------------------------------------------------------------------------------

@pytest.mark.parametrize("saved_world, resumed_world", [("two_ranks", "three_ranks"),
                                                         ("three_ranks", "two_ranks_resumed")])
def test_a_state_saved_with_one_world_size_resumes_with_another(saved_world, resumed_world, request):
    saved, resumed = request.getfixturevalue(saved_world), request.getfixturevalue(resumed_world)
    w1, w2 = len(saved), len(resumed)
    states = [json.loads(res["save"]["state"]) for res in saved]
    assert all(s == states[0] for s in states), "ranks saved different states"
    state = states[0]
    steps = len(saved[0]["save"]["batches"])
    assert state["position"] == steps * BS_RESUME * w1  # samples of the global order, all ranks
    assert state["saved_with"]["world_size"] == w1

    order = _global_order(N_RESUME, state["seed"])
    before = _by_position([_flat(res["save"]["batches"]) for res in saved], w1)
    after = _by_position([_flat(res["resume"]["batches"]) for res in resumed], w2,
                         start=state["position"])
    assert set(before) == set(range(state["position"]))
    everything = {**before, **after}
    real = [everything[p] for p in range(N_RESUME)]
    assert real == order and sorted(real) == list(range(N_RESUME))  # exactly once, in order
    padding = {p: v for p, v in after.items() if p >= N_RESUME}
    assert padding == {p: order[p - N_RESUME] for p in padding}
    lengths = {len(res["resume"]["batches"]) for res in resumed}
    assert len(lengths) == 1, "resumed ranks ran different numbers of steps"
    ends = [res["resume"]["state"] for res in resumed]
    assert all(e == ends[0] for e in ends) and (ends[0]["epoch"], ends[0]["position"]) == (1, 0)


# -- torch's own DistributedSampler and DDP ------------------------------------------------------

def test_an_explicit_distributed_sampler_resumes_exactly(two_ranks):
    parts = [res["distributed_sampler"] for res in two_ranks]
    for p in parts:
        assert p["epochs"] == p["expected"]  # the loader reads exactly the sampler's indices
        assert p["epochs"][0] != p["epochs"][1]  # set_epoch reshuffles
        assert p["head"] + p["tail"] == p["epochs"][1]
        assert (p["state"]["epoch"], p["state"]["position"]) == (1, 2)  # position: this rank's samples
    for epoch in range(2):
        assert sorted(_flat(parts[0]["epochs"][epoch]) + _flat(parts[1]["epochs"][epoch])) == list(range(12))


def test_ddp_trains_one_epoch_through_the_loader(two_ranks):
    parts = [res["ddp"] for res in two_ranks]
    assert parts[0]["initial"] == parts[1]["initial"]  # DDP broadcast rank 0's parameters
    assert parts[0]["weights"] == parts[1]["weights"]  # and kept the replicas in sync
    assert parts[0]["weights"] != parts[0]["initial"]
    assert [len(p["losses"]) for p in parts] == [p["len"] for p in parts] == [4, 4]
    assert sorted(parts[0]["seen"] + parts[1]["seen"]) == list(range(32))


# -- the torchrun example of docs/distributed.md -------------------------------------------------

def _torchrun(nproc, *args, cwd):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", str(root / "examples" / "ddp_train.py"), *args],
                          capture_output=True, text=True, timeout=100, cwd=cwd, env=env)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def test_the_torchrun_example_stops_and_resumes_with_another_world_size(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    common = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--checkpoint", ckpt)
    out = _torchrun(2, *common, "--stop-after", "8", cwd=tmp_path)  # epoch 0 has 6 steps per rank
    assert "epoch 0: 6 steps per rank x 2 ranks" in out
    assert "stopped in epoch 1 after 8 steps" in out
    out = _torchrun(1, *common, cwd=tmp_path)
    assert "resumed epoch 1 at sample 32 of its global order (saved with world_size=2, now 1)" in out
    assert "epoch 1: 8 steps per rank x 1 ranks" in out  # the 64 samples left, 8 per step
