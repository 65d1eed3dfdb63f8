"""Distributed sharding and elastic resume, checked in real gloo process groups (no mocks).

Every world is started by :func:`seqloader.integrations.distributed.run_distributed`: fresh
``spawn`` processes, a ``file://`` rendezvous in ``tmp_path``, ``destroy_process_group`` in every
rank and a join with a timeout in the parent. The rank functions live at module level (they are
pickled by reference) and return what they consumed; the parent makes every assertion.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from seqloader.integrations.distributed import run_distributed
from seqloader.integrations.torch_iterable import as_iterable_dataset


# -- rank functions ------------------------------------------------------------------------------

def _fail_on_last_rank(rank, world_size):
    if rank == world_size - 1:
        raise ValueError(f"rank {rank} rejects its shard")
    dist.barrier()  # would wait for the failed rank until the gloo timeout
    return rank


def _sleep(rank, world_size):
    time.sleep(60)


def _iterable_parts(rank, world_size, n):
    ds = as_iterable_dataset(range(n))  # rank and world size from the process group
    loader = torch.utils.data.DataLoader(ds, batch_size=2)
    return {"rank": ds.rank, "world_size": ds.world_size, "len": len(ds),
            "items": [i for b in loader for i in b.tolist()]}


# -- run_distributed -----------------------------------------------------------------------------

def test_a_failing_rank_raises_its_error_and_stops_the_others(tmp_path):
    with pytest.raises(ValueError, match="rank 1 rejects its shard") as info:
        run_distributed(_fail_on_last_rank, 2, workdir=tmp_path, timeout=60)
    assert any("run_distributed at rank 1 of 2" in note for note in info.value.__notes__)


def test_a_hung_world_is_terminated_after_the_timeout(tmp_path):
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[0\] did not finish within 3 s"):
        run_distributed(_sleep, 1, workdir=tmp_path, timeout=3)


# -- as_iterable_dataset under a real process group ---------------------------------------------

def test_as_iterable_dataset_reads_rank_and_world_size_from_the_process_group(tmp_path):
    n = 11
    parts = run_distributed(_iterable_parts, 3, (n,), workdir=tmp_path)
    assert [(p["rank"], p["world_size"]) for p in parts] == [(0, 3), (1, 3), (2, 3)]
    assert [p["items"] for p in parts] == [list(range(r, n, 3)) for r in range(3)]
    assert [p["len"] for p in parts] == [4, 4, 3]
