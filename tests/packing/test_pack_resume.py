"""The recommended composition under ``seqloader.DataLoader``: pack the stored order once, let the
loader shuffle the packed items. Resumes are exact (``torch.equal``, batch by batch) across
``num_workers`` 0/2, a change of world size, a block shuffle, and mixtures of packs."""

from __future__ import annotations

import operator
import os

import numpy as np
import pytest
import torch

import seqloader as sl
from packing_helpers import SCALE, BatchedDocs
from seqloader.loader import world as topology
from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip

pytestmark = pytest.mark.mp

LENGTHS = np.random.default_rng(0).integers(0, 40, 90).tolist()


def packed(lengths=LENGTHS):
    return sl.pack(BatchedDocs(lengths), 32, window=8, lengths=lengths)


def shuffled(num_workers):
    return sl.DataLoader(packed(), batch_size=3, shuffle=True, seed=11, num_workers=num_workers)


def block_shuffled(num_workers):
    p = packed()
    return sl.DataLoader(p, batch_size=3, sampler=sl.BlockShuffleSampler(p, window=2, seed=5, lanes=2, chunk=3),
                         num_workers=num_workers)


def mixed(num_workers):
    a, b = packed(LENGTHS[:50]), sl.pack(BatchedDocs(LENGTHS[50:]), 32, window=8, split=True)
    return sl.DataLoader(sl.mix([a, b], [2, 1], seed=4), batch_size=2, shuffle=False, num_workers=num_workers)


def second_half(doc):
    return doc + 50 * SCALE  # tokens name their document's position in LENGTHS


def reweighted(num_workers):
    a = packed(LENGTHS[:50])
    b = sl.pack(sl.smap(second_half, BatchedDocs(LENGTHS[50:])), 32, window=8, lengths=LENGTHS[50:])
    loader = sl.DataLoader(sl.mix([a, b], [1, 1]), batch_size=2, seed=0, num_workers=num_workers)
    loader.set_weights([0, 1], at_step=3)  # only b's packed items from step 3, each source from its cursor
    return loader


def test_a_weight_change_in_a_mixture_of_packs():
    batches = _run(reweighted(0))
    docs = [{int(t) // SCALE for t in b["tokens"][b["loss_mask"]].tolist()} for b in batches]
    assert min(set().union(*docs[3:])) >= 50  # documents of the second pack only
    assert min(set().union(*docs[:3])) < 50


@pytest.mark.parametrize("make", [shuffled, block_shuffled, mixed, reweighted])
def test_resumes_exactly_with_0_and_2_workers(make):
    assert_resumes_exactly(make, stops=[0, 4, -1])


def test_pack_of_a_mix_with_the_lengths_of_the_same_mix():
    a, b = LENGTHS[:60], LENGTHS[60:]
    docs = sl.mix([BatchedDocs(a), sl.smap(lambda d: d + 7 * SCALE, BatchedDocs(b))], [3, 1], seed=2)
    lengths = sl.mix([a, b], [3, 1], seed=2)  # the same mixture of the lengths
    p = sl.pack(docs, 32, window=8, lengths=lengths, cache=False)
    assert p.index_stats()["documents"] == len(docs)
    tokens = sorted(t for x in p for t in x["tokens"][x["loss_mask"]].tolist())
    assert tokens == sorted(t for i in range(len(docs)) for t in docs[i].tolist())


def _run(loader, steps=None):
    out = []
    for s, batch in enumerate(loader):
        if steps is not None and s == steps:
            break
        out.append(batch)
    return out


def test_resume_after_a_change_of_world_size(monkeypatch):
    """Saved by 2 ranks after 3 steps; resumed by 1 rank (and by 2), each with 0 and 2 workers."""
    def world(rank, size):
        monkeypatch.setattr(topology, "current_world", lambda: (rank, size))

    world(0, 1)
    one = _run(shuffled(0))  # the uninterrupted single-rank run
    ranks = {}
    for r in (0, 1):
        world(r, 2)
        ranks[r] = _run(shuffled(0))
        assert len(ranks[r]) == (len(one) + 1) // 2
    # 2 ranks read the single-rank order, one sample each in turn
    merged = torch.stack([ranks[s % 2][s // 2 // 3]["tokens"][s // 2 % 3] for s in range(6)])
    assert torch.equal(merged, torch.cat([one[0]["tokens"], one[1]["tokens"]]))
    world(0, 2)
    loader = shuffled(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json_round_trip(loader.state_dict())
    assert state["position"] == 3 * 3 * 2
    for nw in (0, 2):
        world(0, 1)
        resumed = shuffled(nw)
        resumed.load_state_dict(state)
        assert_batches_equal(_run(resumed), one[6:], f"world size 2 -> 1, num_workers={nw}")
        for r in (0, 1):
            world(r, 2)
            resumed = shuffled(nw)
            resumed.load_state_dict(state)
            assert_batches_equal(_run(resumed), ranks[r][3:], f"world size 2 -> 2, rank {r}, num_workers={nw}")


def test_documents_of_a_batch_from_indices_at():
    loader = shuffled(0)
    p = loader.dataset
    batches = _run(loader)
    for step in (0, len(batches) - 1):
        for row, j in enumerate(loader.indices_at(0, step)):
            toks = [t for d, a, b in p.documents(j) for t in range(d * SCALE + a + 1, d * SCALE + b + 1)]
            got = batches[step]["tokens"][row]
            assert got[batches[step]["loss_mask"][row]].tolist() == toks


def test_a_state_records_the_source_files_and_refuses_other_files(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = str(tmp_path / "docs.parquet")

    def write(lengths, first=1):
        toks = [list(range(first, first + n)) for n in lengths]
        pq.write_table(pa.table({"tokens": pa.array(toks, pa.list_(pa.int32()))}), path, row_group_size=10)

    def make():
        docs = sl.smap(operator.itemgetter("tokens"), sl.parquet(path, columns=["tokens"]))
        return sl.DataLoader(sl.pack(docs, 32, window=8), batch_size=2, shuffle=True, seed=0)

    write(LENGTHS[:40])
    loader = make()
    next(iter(loader))
    state = json_round_trip(loader.state_dict())
    assert [d["files"] for d in state["files"]] == [1]  # the Parquet source under the pack
    write(LENGTHS[:40], first=2)  # other tokens, the same lengths: the same packing
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    with pytest.warns(RuntimeWarning, match="stale"):
        other = make()  # its index is rebuilt for the new files...
    with pytest.raises(ValueError, match="check_same_files: file 0, docs.parquet .* differs from the file list"):
        other.load_state_dict(state)  # ...and the loader refuses the state of the old ones
