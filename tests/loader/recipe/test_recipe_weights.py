"""Mixture weights that change during a run (``DataLoader.set_weights``): exact at the next batch,
flushed read-ahead, each source read from its cursor, resumable anywhere with another
``num_workers`` or world size, and a weighted sampler whose weights change."""

from __future__ import annotations

import json

import pytest
import torch

import seqloader
from seqloader import DataLoader
from seqloader.loader import world as topology
from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip, run_distributed

A, B, C = list(range(0, 300)), list(range(1000, 1300)), list(range(2000, 2300))


def source_of(x):
    return x // 1000


def mixture(seed=None):
    return seqloader.mix([A, B, C], weights=[7, 2, 1], seed=seed)


def make_loader(num_workers, at=6, seed=None, **kw):
    loader = DataLoader(mixture(seed), batch_size=8, seed=0, num_workers=num_workers, **kw)
    loader.set_weights([0, 1, 1], at_step=at)       # A leaves at step `at`
    loader.set_weights([1, 1, 2], at_step=at + 5)   # and comes back: its cursor goes on
    return loader


def test_a_change_applies_at_its_step_and_every_source_goes_on_from_its_cursor():
    batches = [b.tolist() for b in make_loader(0)]
    assert {source_of(x) for b in batches[6:11] for x in b} == {1, 2}
    assert 0 in {source_of(x) for x in batches[11]}
    for k in range(3):  # no item read twice or skipped: each source's items in order 0, 1, 2, ...
        mine = [x for b in batches for x in b if source_of(x) == k]
        assert mine == list(range(1000 * k, 1000 * k + len(mine)))
    assert batches[:6] == [b.tolist() for b in DataLoader(mixture(), batch_size=8, seed=0)][:6]


@pytest.mark.parametrize("seed", [None, 5])
def test_resume_before_at_and_after_the_changes_is_exact_with_other_num_workers(seed):
    def make(num_workers):
        return make_loader(num_workers, seed=seed)

    assert_resumes_exactly(make, stops=[0, 5, 6, 7, 11, 12, -1])


def now_changed(num_workers, after):
    """Read ``after`` batches, then change the weights *now*; the rest of the epoch."""
    loader = DataLoader(mixture(), batch_size=8, seed=0, num_workers=num_workers, prefetch_factor=4 if num_workers else None)
    it = iter(loader)
    head = [next(it) for _ in range(after)]
    loader.set_weights([0, 0, 1])
    return head, list(it), loader


def test_the_read_ahead_of_workers_is_dropped_at_a_change():
    head0, rest0, _ = now_changed(0, after=3)
    head2, rest2, loader = now_changed(2, after=3)  # the workers had read ahead under the old weights
    assert_batches_equal(head2 + rest2, head0 + rest0)
    assert all(source_of(x) == 2 for b in rest2 for x in b.tolist())
    sd = loader.state_dict()
    assert sd["recipe"]["weights"] == [[3, 0, 24, [0, 0, 1]]]


def test_a_hundred_changes_stay_small_and_resume():
    loader = DataLoader(mixture(seed=1), batch_size=2, seed=0)
    for k in range(100):
        loader.set_weights([1 + k % 3, 1, k % 2], at_step=k * 2)
    sd = loader.state_dict()
    assert len(json.dumps(sd["recipe"])) < 4096 and len(json.dumps(sd)) < 4096 + 1024
    ref = [b.tolist() for b in loader]
    resumed = DataLoader(mixture(seed=1), batch_size=2, seed=0)
    resumed.load_state_dict(json_round_trip(sd))
    assert [b.tolist() for b in resumed] == ref


def test_a_change_beyond_the_epoch_waits_for_its_epoch():
    loader = DataLoader(mixture(), batch_size=50, seed=0)
    n = len(loader)
    loader.set_weights([0, 1, 0], at_step=n + 2)  # epoch 1, its third batch
    assert loader.state_dict()["recipe"]["weights"] == [[n + 2, None, None, [0, 1, 0]]]
    epoch0 = [b.tolist() for b in loader]
    epoch1 = [b.tolist() for b in loader]
    assert {source_of(x) for b in epoch0 for x in b} == {0, 1, 2}
    assert {source_of(x) for b in epoch1[2:] for x in b} == {1}
    assert loader.state_dict()["recipe"]["weights"][0][1:3] == [1, 100]


def test_set_weights_errors():
    loader = DataLoader(mixture(), batch_size=8, seed=0)
    with pytest.raises(ValueError, match=r"weights\[1\] must be a finite number >= 0"):
        loader.set_weights([1, -1, 1])
    with pytest.raises(ValueError, match="shuffle=False"):
        DataLoader(mixture(), batch_size=8, seed=0, shuffle=True).set_weights([1, 1, 1])
    with pytest.raises(TypeError, match="the dataset is not a mixture"):
        DataLoader(A, batch_size=8, seed=0).set_weights([1])
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(ValueError, match="at_step=1 was already read"):
        loader.set_weights([1, 1, 1], at_step=1)


def test_ranks_switch_at_the_same_step_and_resume_with_another_world_size(monkeypatch):
    def global_order(world_size, upto=None, state=None):
        per_rank, states = [], []
        for rank in range(world_size):
            monkeypatch.setattr(topology, "current_world", lambda r=rank: (r, world_size))
            loader = DataLoader(mixture(), batch_size=4, seed=0)
            loader.set_weights([0, 1, 1], at_step=5)
            if state is not None:
                loader.load_state_dict(state)
            got = []
            for b in loader:
                got.append(b.tolist())
                if upto is not None and len(got) == upto:
                    states.append(json_round_trip(loader.state_dict()))
                    break
            per_rank.append(got)
        return per_rank, positions_order(per_rank), states

    _, ref, _ = global_order(1)
    _, head, states = global_order(1, upto=3)                     # 1 rank: steps 0..2
    _, middle, states2 = global_order(2, upto=4, state=states[0])  # 2 ranks: they switch at step 5
    _, tail, _ = global_order(1, state=states2[0])                 # back to 1 rank
    got = head + middle + tail
    assert got[:len(ref)] == ref  # the global order, position by position (padding after its end)
    assert states2[0]["position"] == 12 + 2 * 4 * 4 and states2[0]["step"] == 7


def positions_order(per_rank):
    """The samples of each rank's batches in global position order: rank r's sample j of a global
    step sits at position start + r + j * world_size (DistributedSampler's layout)."""
    out = []
    for step in range(max(len(r) for r in per_rank)):
        batches = [r[step] for r in per_rank if step < len(r)]
        for j in range(max(len(b) for b in batches)):
            out += [b[j] for b in batches if j < len(b)]
    return out


def _gloo_rank(rank, world_size, state):
    loader = DataLoader(mixture(), batch_size=4, seed=0)
    loader.set_weights([0, 1, 1], at_step=5)
    loader.load_state_dict(state)
    it = iter(loader)
    got = [next(it).tolist() for _ in range(4)]
    return got, loader.state_dict()


def test_two_gloo_ranks_resume_a_single_process_state_across_a_change(tmp_path):
    single = DataLoader(mixture(), batch_size=4, seed=0)
    single.set_weights([0, 1, 1], at_step=5)
    ref = [x for b in single for x in b.tolist()]
    single = DataLoader(mixture(), batch_size=4, seed=0)
    single.set_weights([0, 1, 1], at_step=5)
    it = iter(single)
    head = [x for _ in range(3) for x in next(it).tolist()]
    results = run_distributed(_gloo_rank, 2, args=(json_round_trip(single.state_dict()),), workdir=tmp_path,
                              timeout=120)
    steps = positions_order([results[r][0] for r in range(2)])
    assert head + steps == ref[:len(head) + len(steps)]
    assert results[0][1]["position"] == results[1][1]["position"] == 12 + 32


# -- a weighted sampler whose weights change ------------------------------------------------------------


def weighted(num_workers, weights):
    sampler = seqloader.WeightedSampler(weights, num_samples=64, seed=3)
    return DataLoader(list(range(10)), batch_size=4, sampler=sampler, seed=0, num_workers=num_workers)


def test_a_weighted_sampler_changes_weights_at_the_next_batch_and_resumes_with_the_same_weights():
    first, second = [1.0] * 10, [0.0] * 9 + [1.0]
    loader = weighted(0, first)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    loader.set_weights(second)
    sd = json_round_trip(loader.state_dict())
    rest = list(it)
    assert all(x == 9 for b in rest for x in b.tolist())
    resumed = weighted(2, second)  # built with the weights in force when saved
    resumed.load_state_dict(sd)
    assert_batches_equal(list(resumed), rest)
    wrong = weighted(0, [0.0] * 8 + [1.0, 0.0])
    with pytest.raises(ValueError, match="fingerprint"):
        wrong.load_state_dict(sd)
    assert len(head) == 4


def two_sources(num_workers=0):
    return DataLoader(seqloader.mix([A, B], weights=[1, 1]), batch_size=4, seed=0, num_workers=num_workers)


@pytest.mark.parametrize("bad, error, match", [
    ([1, 2, 3], ValueError, r"^DataLoader.set_weights: weights must have one entry per source \(2; got 3\)"),
    ([1], ValueError, r"^DataLoader.set_weights: weights must have one entry per source \(2; got 1\)"),
    ([1, 1e-9], ValueError, r"^DataLoader.set_weights: the mixture refuses weights=\[1, 1e-09\] .*weights\[1\] is "
                            r"too small"),
    ([0, 0], ValueError, r"at least one weight must be > 0"),
    ("11", TypeError, r"weights must be a sequence of numbers"),
])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_refused_weights_raise_at_the_call_and_leave_the_loader_as_it_was(bad, error, match, num_workers):
    ref = two_sources()
    want = [list(ref), list(ref)]
    loader = two_sources(num_workers)
    it = iter(loader)
    got = [next(it), next(it)]
    before = loader.state_dict()
    with pytest.raises(error, match=match):
        loader.set_weights(bad)
    with pytest.raises(error, match=match):
        loader.set_weights(bad, at_step=len(loader) + 3)  # beyond the epoch: refused now too, not when it comes
    assert loader.state_dict() == before
    got.append(next(it))  # next() works, on the same batches
    sd = json_round_trip(loader.state_dict())
    got += list(it)
    assert_batches_equal(got, want[0], "the epoch around the refused calls")
    resumed = two_sources()
    resumed.load_state_dict(sd)  # a state saved after the refused call loads and resumes
    assert_batches_equal(list(resumed), want[0][3:], "resumed after the refused call")
    loader.set_weights([0, 1])  # a correct call afterwards works
    assert {source_of(x) for b in loader for x in b.tolist()} == {1}
    resumed = two_sources()
    resumed.load_state_dict(json_round_trip(loader.state_dict()))


def test_at_step_beyond_an_int64_is_refused_naming_it():
    loader = two_sources()
    with pytest.raises(ValueError, match=r"DataLoader.set_weights: at_step must be < 2\*\*63"):
        loader.set_weights([1, 1], at_step=2**63)
    assert loader.state_dict()["recipe"] is None


def test_a_weighted_samplers_refused_weights_leave_the_loader_as_it_was():
    loader = weighted(0, [1.0] * 10)
    want = list(weighted(0, [1.0] * 10))
    it = iter(loader)
    got = [next(it)]
    before = loader.state_dict()
    with pytest.raises(ValueError, match=r"WeightedSampler.reweight: weights has 3 entries but the sampler has 10"):
        loader.set_weights([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"WeightedSampler.reweight: weights must be >= 0 \(weights\[2\] is -1.0\)"):
        loader.set_weights([1.0, 1.0, -1.0] + [1.0] * 7)
    assert loader.state_dict() == before
    got += list(it)
    assert_batches_equal(got, want)
    resumed = weighted(0, [1.0] * 10)
    resumed.load_state_dict(json_round_trip(before))
