"""Two gloo ranks read a Parquet source and tar shards, save mid-epoch, and resume in a fresh world.

Worlds come from :func:`seqloader.testing.run_distributed` (spawned processes, a ``file://``
rendezvous). Each rank returns its batches; the parent compares them with ``torch.equal``:
the resumed rank's rest of the epoch must equal the same rank's uninterrupted run, and the two
ranks together must read every item exactly once.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import default_convert

import seqloader
from seqloader.testing import run_distributed

from sources_helpers import write_parquet, write_shards

pytestmark = pytest.mark.mp

STEPS = 2


def _tar_item(sample):
    return int(sample["cls"]), int(sample["__key__"][len("sample"):])


def _loaders(parquet_dir, tar_dir):
    pq_loader = seqloader.DataLoader(seqloader.parquet(parquet_dir, columns=["i", "vec"], columnar=True),
                                     batch_size=3, shuffle=True, seed=4, collate_fn=default_convert)
    tar_loader = seqloader.DataLoader(seqloader.tar_shards(tar_dir, transform=_tar_item), batch_size=2,
                                      shuffle=True, seed=9, num_workers=1)
    return {"parquet": pq_loader, "tar": tar_loader}


def _rank_run(rank, world_size, parquet_dir, tar_dir):
    """Phase 1: the whole epoch, and the state after STEPS batches."""
    out = {}
    for name, loader in _loaders(parquet_dir, tar_dir).items():
        batches, state = [], None
        for k, b in enumerate(loader):
            batches.append(b)
            if k == STEPS - 1:
                state = json.dumps(loader.state_dict())
        out[name] = (batches, state)
    return out


def _rank_resume(rank, world_size, parquet_dir, tar_dir, states):
    """Phase 2, a fresh world: load rank 0's saved state (any rank's would do) and read the rest."""
    out = {}
    for name, loader in _loaders(parquet_dir, tar_dir).items():
        loader.load_state_dict(json.loads(states[name]))
        out[name] = list(loader)
    return out


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.timeout(300)
def test_two_ranks_resume_parquet_and_tar_exactly_in_a_fresh_world(tmp_path):
    pq_dir, tar_dir = str(tmp_path / "pq"), str(tmp_path / "tars")
    write_parquet(pq_dir, [[5, 4], [6]])   # 15 rows
    write_shards(tar_dir, [3, 4, 3])       # 10 samples
    first = run_distributed(_rank_run, 2, (pq_dir, tar_dir), workdir=tmp_path, timeout=240)
    for name, n, key in (("parquet", 15, "i"), (("tar"), 10, 1)):
        seen = [i for rank in first for b in rank[name][0] for i in b[key].tolist()]
        assert set(seen) == set(range(n)) and len(seen) < n + 2   # every item, one padded (wrapped) at most
    states = {name: first[0][name][1] for name in ("parquet", "tar")}
    resumed = run_distributed(_rank_resume, 2, (pq_dir, tar_dir, states), workdir=tmp_path, timeout=240)
    for rank in range(2):
        for name in ("parquet", "tar"):
            want = first[rank][name][0][STEPS:]
            got = resumed[rank][name]
            assert len(got) == len(want) > 0
            assert all(_equal(g, w) for g, w in zip(got, want)), (rank, name)
