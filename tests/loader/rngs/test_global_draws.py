"""seqloader.loader.rngs.draws: the seeding of the global RNGs is skipped only where seqloader's
own code computes the batch, with the same batches, states and global RNG states."""

from __future__ import annotations

import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import default_collate, default_convert

import seqloader
from seqloader.loader.epoch import batches as fetch
from seqloader.loader.rngs import draws as global_draws
from seqloader.loader.epoch import iterator as iterator
from seqloader.loader.rngs.draws import batch_draws_globals, declares_no_draws

EXECUTORS = [(0, None), (2, "thread"), (2, "multiprocessing")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """2 files of 3 row groups of 10 rows: tokens (10 x 4 int32) and a label."""
    path = tmp_path_factory.mktemp("draws")
    for f in range(2):
        n, start = 30, 30 * f
        values = pa.array(np.arange(start * 4, (start + n) * 4, dtype=np.int32))
        tokens = pa.ListArray.from_arrays(pa.array(np.arange(0, n * 4 + 1, 4, dtype=np.int32)), values)
        pq.write_table(pa.table({"tokens": tokens, "label": np.arange(start, start + n)}),
                       os.path.join(path, f"part-{f}.parquet"), row_group_size=10)
    return str(path)


def _globals() -> tuple:
    return random.getstate(), repr(np.random.get_state()), torch.get_rng_state().tolist()




def test_what_declares_no_draws(folder, tmp_path):
    cols = seqloader.parquet(folder, columnar=True)
    rows = seqloader.parquet(folder)
    assert declares_no_draws(cols) and declares_no_draws(rows)
    assert not declares_no_draws(seqloader.parquet(folder, transform=dict))   # a transform: user code
    path = str(tmp_path / "a.arrow")
    with pa.ipc.new_file(path, pa.schema([("x", pa.int64())])) as writer:
        writer.write_table(pa.table({"x": [1, 2, 3]}))
    assert declares_no_draws(seqloader.arrow_ipc(path, columnar=True))
    assert not declares_no_draws(seqloader.arrow_ipc(path, transform=dict))
    assert not declares_no_draws(list(range(3))) and not declares_no_draws(cols[2:])   # an op over it

    class Mine(type(cols)):   # a user's subclass may override __getitems__
        pass

    mine = Mine.__new__(Mine)
    mine.__dict__.update(cols.__dict__)
    assert not declares_no_draws(mine)
    assert not batch_draws_globals(cols, default_convert) and not batch_draws_globals(rows, default_collate)
    assert batch_draws_globals(cols, lambda b: default_convert(b))   # a collate of the user's


def _count(monkeypatch):
    """Count the per-batch seedings and the snapshots of the caller's global RNGs (this process)."""
    calls = {"seed": 0, "snapshot": 0}
    seed, snapshot = fetch.seed_globals, iterator.Snapshot

    def counting_seed(*a, **kw):
        calls["seed"] += 1
        return seed(*a, **kw)

    def counting_snapshot():
        calls["snapshot"] += 1
        return snapshot()

    monkeypatch.setattr(fetch, "seed_globals", counting_seed)
    monkeypatch.setattr(iterator, "Snapshot", counting_snapshot)
    return calls


@pytest.mark.parametrize("kind", ["columnar", "rows"])
def test_seqloaders_own_batches_are_not_seeded(folder, monkeypatch, kind):
    calls = _count(monkeypatch)
    src = seqloader.parquet(folder, columnar=kind == "columnar")
    collate = default_convert if kind == "columnar" else None
    n = sum(1 for _ in seqloader.DataLoader(src, batch_size=8, collate_fn=collate, seed=0,
                                            sampler=seqloader.BlockShuffleSampler(src, seed=1)))
    assert n == 8 and calls == {"seed": 0, "snapshot": 0}


def _draw_collate(batch):
    return default_convert(batch), random.random(), float(np.random.rand()), float(torch.rand(()))


def _drawing_transform(row):
    return {**row, "noise": random.random()}


@pytest.mark.parametrize("case", ["collate", "transform", "dataset"])
def test_user_code_keeps_the_seeding(folder, monkeypatch, case):
    """A collate_fn, a transform or a dataset of the user's: each batch is seeded and the caller's
    states kept; its draws are the same in a second run from other caller states."""
    cols = seqloader.parquet(folder, columnar=True)
    if case == "collate":
        make = dict(dataset=cols, collate_fn=_draw_collate)
    elif case == "transform":
        make = dict(dataset=seqloader.parquet(folder, transform=_drawing_transform))
    else:
        make = dict(dataset=[random] * 60, collate_fn=lambda b: [r.random() for r in b])
    calls = _count(monkeypatch)
    before = _globals()
    first = list(seqloader.DataLoader(batch_size=8, seed=0, **make))
    assert calls == {"seed": len(first), "snapshot": len(first)}
    assert _globals() == before
    random.seed(99); np.random.seed(99); torch.manual_seed(99)
    again = list(seqloader.DataLoader(batch_size=8, seed=0, **make))
    assert repr(first) == repr(again)


def _run(folder, num_workers, method, stop):
    """Batches and states of an epoch (state after each batch), the global RNG states after each
    batch at num_workers=0, and the rest of the epoch from the state saved after batch ``stop``."""
    def make():
        src = seqloader.parquet(folder, columnar=True)
        extra = {} if num_workers == 0 else {"worker_method": method}
        return seqloader.DataLoader(src, batch_size=7, num_workers=num_workers, seed=5, collate_fn=default_convert,
                                    sampler=seqloader.BlockShuffleSampler(src, window=2, seed=3), **extra)

    random.seed(11); np.random.seed(11); torch.manual_seed(11)
    loader = make()
    got, states, rngs = [], [], []
    for b in loader:
        got.append(b)
        states.append(loader.state_dict())
        rngs.append(_globals())
    resumed = make()
    resumed.load_state_dict(states[stop])
    return got, states, rngs, list(resumed)


@pytest.mark.parametrize("num_workers,method", EXECUTORS)
def test_skipping_changes_no_batch_state_or_rng(folder, monkeypatch, num_workers, method):
    skipped = _run(folder, num_workers, method, stop=3)
    monkeypatch.setattr(fetch, "batch_draws_globals", lambda dataset, collate_fn: True)   # always seed
    seeded = _run(folder, num_workers, method, stop=3)
    for a, b in zip(skipped[0] + skipped[3], seeded[0] + seeded[3]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(skipped[0]) == len(seeded[0]) and len(skipped[3]) == len(seeded[3])
    assert skipped[1] == seeded[1]
    assert skipped[2] == seeded[2]


def test_the_module_names_its_collates():
    assert default_collate in global_draws._NO_DRAW_COLLATES and default_convert in global_draws._NO_DRAW_COLLATES
