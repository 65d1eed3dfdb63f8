"""The recipe during a run: another batch size or world size at a resume, a batch-size schedule,
skipped samples, indices of any step, and a state rebuilt from ``(seed, epoch, step, world size)``.

Every comparison is with an uninterrupted run, batch by batch (``torch.equal``) or sample by sample.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqloader import DataLoader
from seqloader.loader import world as topology
from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip

N = 50


def flat(batches):
    return [int(x) for b in batches for x in b]


def loader(bs=4, workers=0, shuffle=True, seed=7, **kw):
    return DataLoader(list(range(N)), batch_size=bs, shuffle=shuffle, seed=seed, num_workers=workers, **kw)


# -- another batch size, another world size ----------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop, new_bs", [(0, 6), (3, 6), (5, 3), (12, 1)])
def test_another_batch_size_resumes_from_the_first_unread_sample(workers, stop, new_bs):
    ref = flat(loader(workers=workers))
    run = loader(workers=workers)
    it = iter(run)
    head = [next(it) for _ in range(stop)]
    resumed = loader(bs=new_bs, workers=0 if workers else 2)
    resumed.load_state_dict(json_round_trip(run.state_dict()))
    rest = list(resumed)
    assert all(len(b) == new_bs for b in rest[:-1])
    assert flat(head) + flat(rest) == ref  # none twice, none skipped
    assert sorted(flat(list(resumed))) == list(range(N))  # the next epoch too


def run_ranks(monkeypatch, world_size, bs, state=None, steps=None):
    """Each rank's batches (simulated ranks: current_world is the one topology function)."""
    out, states = [], []
    for rank in range(world_size):
        monkeypatch.setattr(topology, "current_world", lambda r=rank: (r, world_size))
        run = loader(bs=bs)
        if state is not None:
            run.load_state_dict(state)
        it = iter(run)
        got = []
        for b in it:
            got.append(b)
            if steps is not None and len(got) == steps:
                states.append(json_round_trip(run.state_dict()))
                break
        out.append(got)
    return out, states


def test_another_world_size_and_batch_size_read_the_next_samples_of_the_global_order(monkeypatch):
    (full,), _ = run_ranks(monkeypatch, 1, bs=1)
    order = flat(full)
    heads, states = run_ranks(monkeypatch, 2, bs=4, steps=3)  # 2 ranks x 3 steps x 4 samples
    assert all(s["position"] == 24 for s in states) and states[0]["position"] == states[1]["position"]
    assert sorted(flat(heads[0]) + flat(heads[1])) == sorted(order[:24])
    rests, _ = run_ranks(monkeypatch, 3, bs=5, state=states[0])  # 3 ranks of 5 from sample 24
    counts = {len(r) for r in rests}
    assert len(counts) == 1  # every rank has as many batches
    read = flat(b for r in rests for b in r)
    assert set(order[24:]) <= set(read)  # every remaining sample once ...
    assert len(read) - (N - 24) < 3  # ... plus DistributedSampler's padding: fewer than world_size
    step0 = [rests[r][0] for r in range(3)]  # global step 0 after the resume: positions 24 + r + 3j
    assert [flat([b]) for b in step0] == [[order[24 + r + 3 * j] for j in range(5)] for r in range(3)]


def test_a_custom_batch_sampler_with_another_batch_size_is_refused():
    def make(bs):
        sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(N)), bs, False)
        return DataLoader(list(range(N)), batch_sampler=sampler, seed=0)

    sd = make(4).state_dict()
    with pytest.raises(ValueError, match="'sampler_len' is 13 in the state_dict but this loader's sampler has len 9"):
        make(6).load_state_dict(sd)


def test_batches_yielded_out_of_order_need_the_saved_batch_size():
    run = loader(workers=2, in_order=False)
    sd = None
    for _ in iter(run):
        state = run.state_dict()
        if state["ahead"]:
            sd = state
            break
    if sd is None:  # every batch came in order this time: make one come out of order
        sd = {**run.state_dict(), "ahead": [run.state_dict()["position"] + 8]}
    with pytest.raises(ValueError, match="'ahead' lists batches of 4 yielded out of order"):
        loader(bs=6, workers=2).load_state_dict(sd)


# -- a batch-size schedule -----------------------------------------------------------------------------


def ramp(num_workers):
    return DataLoader(list(range(N)), batch_size=2, shuffle=True, seed=3, num_workers=num_workers,
                      batch_size_schedule=[(4, 3), (9, 8), (20, 5)])


def test_a_schedule_sets_each_steps_batch_size_across_epochs():
    run = ramp(0)
    sizes = [[len(b) for b in run] for _ in range(3)]
    steps = [s for epoch in sizes for s in epoch]

    def expected(step):
        return 2 if step < 4 else 3 if step < 9 else 8 if step < 20 else 5

    for k, size in enumerate(steps):
        if size != expected(k):  # the last batch of an epoch may be short
            assert size < expected(k) and k + 1 in {sum(map(len, sizes[:e + 1])) for e in range(3)}
    assert [sum(e) for e in sizes] == [N] * 3 and len(run) == len(sizes[-1]) - 0


def test_a_schedule_resumes_exactly_at_every_step():
    assert_resumes_exactly(ramp, stops=range(0, 14))


def test_a_schedule_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="batch_size_schedule needs an int batch_size"):
        DataLoader(list(range(N)), batch_size=None, batch_size_schedule=[(2, 3)])
    with pytest.raises(ValueError, match="steps must increase"):
        DataLoader(list(range(N)), batch_size=2, batch_size_schedule=[(4, 3), (2, 5)])


# -- indices of any step, and a state rebuilt from (seed, epoch, step, world size) ---------------------


def test_indices_at_are_the_batches_any_rank_reads(monkeypatch):
    for world_size in (1, 3):
        for rank in range(world_size):
            monkeypatch.setattr(topology, "current_world", lambda r=rank, w=world_size: (r, w))
            run = loader()
            for epoch in range(2):
                batches = list(run)
                assert [run.indices_at(epoch, s) for s in range(len(batches))] == [b.tolist() for b in batches]
        monkeypatch.setattr(topology, "current_world", lambda: (0, 1))
        assert loader().indices_at(0, 0, rank=1, world_size=2) == flat(loader(bs=1))[1:8:2]


def test_indices_at_a_billion_samples_need_no_iteration():
    big = DataLoader(range(10**9), batch_size=256, shuffle=True, seed=1)
    idx = big.indices_at(5, 3_000_000)
    assert len(idx) == 256 and len(set(idx)) == 256 and all(0 <= i < 10**9 for i in idx)
    resumed = DataLoader(range(10**9), batch_size=256, shuffle=True, seed=1)
    resumed.load_state_dict(big.state_at(5, 3_000_000))
    assert next(iter(resumed)).tolist() == idx


@pytest.mark.parametrize("workers", [0, 2])
def test_a_lost_state_is_rebuilt_from_seed_epoch_step_and_world_size(workers):
    run = loader(workers=workers)
    list(run)  # epoch 0
    it = iter(run)
    for _ in range(4):
        next(it)
    saved = run.state_dict()
    rebuilt = loader(workers=workers).state_at(epoch=1, step=4, world_size=1)
    assert {k: rebuilt[k] for k in ("epoch", "position", "step")} == {"epoch": 1, "position": 16, "step": 4}
    fresh = loader(workers=0)
    fresh.load_state_dict(rebuilt)
    assert_batches_equal(list(fresh), list(it), "resumed from the rebuilt state")
    assert saved["position"] == rebuilt["position"]


# -- skipped samples -----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_skipped_indices_are_backfilled_from_the_tail_and_every_other_batch_is_unchanged(workers):
    ref = [b.tolist() for b in loader(workers=workers)]
    run = loader(workers=workers)
    it = iter(run)
    head = [next(it).tolist() for _ in range(2)]
    bad = {ref[3][1], ref[5][0], ref[0][0]}  # ref[0][0] was already read: it stays read
    run.skip(indices=sorted(bad))
    rest = [b.tolist() for b in it]
    got = head + rest
    assert len(set(flat(got))) == len(flat(got))  # none twice
    assert set(flat(got)) == set(range(N)) - (bad - {ref[0][0]})
    assert all(len(b) == 4 for b in got[:-1])
    changed = [k for k in range(len(got)) if got[k] != ref[k]]
    assert changed[:2] == [3, 5] and all(k >= len(got) - 2 for k in changed[2:])  # the holes, then the tail
    later = [b.tolist() for b in run]  # the next epoch skips them too
    assert set(flat(later)) == set(range(N)) - bad


def test_skips_resume_exactly_with_other_num_workers_and_stay_small():
    def make(num_workers):
        run = loader(workers=num_workers)
        run.skip(indices=[3, 4, 5, 40], steps=range(2, 4))
        return run

    assert_resumes_exactly(make, stops=[0, 1, 2, 5, -1])
    sd = make(0).state_dict()
    assert sd["recipe"]["skips"][0][2:] == ["indices", [[3, 6], [40, 41]]]
    assert len(json.dumps(sd)) < 1024


def test_skipping_a_step_range_replaces_those_batches_and_keeps_ranks_even(monkeypatch):
    rest_by_rank = []
    for rank in range(2):
        monkeypatch.setattr(topology, "current_world", lambda r=rank: (r, 2))
        run = loader()
        it = iter(run)
        next(it)
        run.skip(steps=range(2, 4))  # the batches of global steps 2 and 3 (both ranks)
        rest_by_rank.append([b.tolist() for b in it])
    assert len(rest_by_rank[0]) == len(rest_by_rank[1])
    monkeypatch.setattr(topology, "current_world", lambda: (0, 1))
    order = flat(loader(bs=1))
    skipped = set(order[16:32])  # steps 2, 3: positions 2*4*2 .. 4*4*2
    read = set(flat(b for r in rest_by_rank for b in r))
    assert not read & skipped


def test_skip_arguments_are_checked():
    run = loader()
    it = iter(run)
    next(it), next(it)
    with pytest.raises(TypeError, match="give indices=, steps=, or both"):
        run.skip()
    with pytest.raises(ValueError, match="steps' start=1 was already read"):
        run.skip(steps=range(1, 3))
    with pytest.raises(TypeError, match="DataLoader.skip: skipping needs the loader's own order"):
        DataLoader(list(range(N)), sampler=list(range(N))).skip(indices=[1])


# -- what indices_at, state_at and skip refuse ---------------------------------------------------------


def test_indices_at_refuses_a_rank_outside_the_world_and_takes_each_default_alone(monkeypatch):
    run = loader(bs=4, shuffle=False)
    with pytest.raises(ValueError, match=r"DataLoader.indices_at: rank 3 out of range \[0, 2\) \(world_size=2\)"):
        run.indices_at(0, 1, rank=3, world_size=2)
    with pytest.raises(ValueError, match=r"rank -1 out of range"):
        run.indices_at(0, 0, rank=-1, world_size=2)
    with pytest.raises(ValueError, match=r"world_size must be >= 1 \(got 0\)"):
        run.indices_at(0, 0, rank=0, world_size=0)
    with pytest.raises(TypeError, match=r"world_size must be an int"):
        run.indices_at(0, 0, rank=0, world_size=2.0)
    with pytest.raises(ValueError, match=r"epoch must be < 2\*\*63"):
        run.indices_at(2**63, 0)
    # a world_size alone keeps this process's rank (0 here), and a rank alone this world: never ignored
    assert run.indices_at(0, 0, world_size=2) == [0, 2, 4, 6]
    monkeypatch.setattr(topology, "current_world", lambda: (1, 2))
    assert run.indices_at(0, 0, world_size=4) == [1, 5, 9, 13]
    with pytest.raises(ValueError, match=r"rank 2 out of range \[0, 2\)"):
        run.indices_at(0, 0, rank=2)


@settings(deadline=None, max_examples=40)
@given(n=st.integers(1, 60), bs=st.integers(1, 7), drop_last=st.booleans(), world_size=st.integers(1, 4),
       epoch=st.integers(0, 3), extra=st.integers(-2, 2))
def test_state_at_refuses_what_indices_at_refuses(n, bs, drop_last, world_size, epoch, extra):
    run = DataLoader(list(range(n)), batch_size=bs, shuffle=True, seed=3, drop_last=drop_last)
    per_rank = n // world_size if drop_last else -(-n // world_size)  # DistributedSampler's layout
    steps = per_rank // bs if drop_last else -(-per_rank // bs)
    step = steps + extra
    if 0 <= step < steps:  # a batch: both answer, and the state resumes at that batch
        idx = run.indices_at(epoch, step, rank=0, world_size=world_size)
        sd = run.state_at(epoch, step, world_size=world_size)
        if world_size == 1:
            resumed = DataLoader(list(range(n)), batch_size=bs, shuffle=True, seed=3, drop_last=drop_last)
            resumed.load_state_dict(sd)
            assert next(iter(resumed)).tolist() == idx
    elif step == steps:  # after the last batch: a state, but no batch
        with pytest.raises(IndexError, match=rf"DataLoader.indices_at: step {step} out of range \[0, {steps}\)"):
            run.indices_at(epoch, step, rank=0, world_size=world_size)
        sd = run.state_at(epoch, step, world_size=world_size)
        resumed = DataLoader(list(range(n)), batch_size=bs, shuffle=True, seed=3, drop_last=drop_last)
        resumed.load_state_dict(sd)
        if world_size == 1:
            assert list(resumed) == []  # the rest of the epoch is empty
    else:  # past the end, or negative: both refuse
        with pytest.raises(IndexError, match=r"DataLoader.indices_at: step -?\d+ out of range"):
            run.indices_at(epoch, step, rank=0, world_size=world_size)
        with pytest.raises(IndexError, match=r"DataLoader.state_at: step -?\d+ out of range"):
            run.state_at(epoch, step, world_size=world_size)
    for call in (lambda: run.indices_at(epoch, 0, rank=world_size, world_size=world_size),
                 lambda: run.state_at(epoch, 0, world_size=0)):
        with pytest.raises(ValueError, match=r"out of range|world_size must be >= 1"):
            call()


def test_skip_refuses_indices_outside_the_dataset_and_steps_past_the_epoch():
    run = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=7)
    it = iter(run)
    next(it)
    before = run.state_dict()
    for kw, error, match in [
        ({"indices": [3, 25]}, ValueError, r"DataLoader.skip: indices holds 25, outside \[0, 20\)"),
        ({"indices": [20]}, ValueError, r"indices holds 20, outside \[0, 20\)"),
        ({"indices": 5}, TypeError, r"indices must be an iterable of ints \(got int\)"),
        ({"steps": range(10, 20)}, ValueError, r"steps=range\(10, 20\) reaches past the end of epoch 0, whose last "
                                               r"step is 4"),
        ({"steps": (3, 6)}, ValueError, r"steps=\(3, 6\) reaches past the end of epoch 0, whose last step is 4"),
        ({"steps": 5}, TypeError, r"steps must be a range or a \(start, stop\) pair \(got 5\)"),
        ({"steps": range(2**63, 2**63 + 1)}, ValueError, r"steps' start must be < 2\*\*63"),
    ]:
        with pytest.raises(error, match=match):
            run.skip(**kw)
        assert run.state_dict() == before, kw
    run.skip(indices=[19], steps=(3, 5))  # the last steps of the epoch, and the last index: accepted
    rest = [b.tolist() for b in it]
    assert len(rest) == 2 and 19 not in {x for b in rest for x in b}


def test_the_recipe_does_not_import_the_fetching_side():
    """Which indices a batch reads is decided without fetching: importing the recipe (and its
    control) loads neither ``loader.fetch`` nor the prefetcher."""
    code = ("import sys, seqloader.loader.recipe.recipe, seqloader.loader.recipe.control\n"
            "print(sorted(m for m in sys.modules if m == 'seqloader.loader.epoch.batches' or m.startswith('seqloader.prefetcher')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
