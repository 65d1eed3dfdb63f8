"""A mixture is a pure function of the position, so the loader resumes it exactly under any num_workers."""

from __future__ import annotations

import torch

import seqloader as sl
from seqloader import DataLoader
from seqloader.sequences.mix import mix
from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip


# -- module level: picklable for workers and spawn -------------------------------------------------

def source(k: int, n: int) -> list:
    return [(k, i) for i in range(n)]


def with_noise(x, rng):
    """Draws from the item's generator and from torch's global RNG (seeded per batch by the loader)."""
    return {"source": x[0], "index": x[1], "noise": rng.standard_normal(2), "torch": torch.rand(1)}


def mixture(stop: str = "all", seed=5):
    seqs = [source(0, 17), sl.shuffle(source(1, 7), 3), source(2, 4)]
    return sl.rng_map(with_noise, mix(seqs, [0.7, 0.2, 0.1], seed=seed, stop=stop), 9)


def make_shuffled(nw):
    return DataLoader(mixture(), batch_size=4, shuffle=True, seed=1, num_workers=nw)


def make_sequential(nw):
    return DataLoader(mixture("first", seed=None), batch_size=3, drop_last=True, seed=2, num_workers=nw)


def make_mix_of_a_loader_order(nw):
    # the mixture itself shuffled (an IndexMap over it), read in batches by the loader
    seqs = [source(0, 10), source(1, 6)]
    return DataLoader(sl.shuffle(mix(seqs, [1, 1], length=23), 4), batch_size=5, seed=3, num_workers=nw)


# -- tests -------------------------------------------------------------------------------------------

def test_mix_resumes_exactly_across_num_workers():
    # save with num_workers in {0, 2}, load into a fresh loader with {0, 2}: every later batch equal
    assert_resumes_exactly(make_shuffled, stops=[1, 4, -1])


def test_unseeded_mix_and_shuffled_mix_resume_exactly():
    assert_resumes_exactly(make_sequential, stops=[2])
    assert_resumes_exactly(make_mix_of_a_loader_order, stops=[1, -1])


def test_mix_resumes_in_a_fresh_spawned_process():
    assert_resumes_exactly(make_shuffled, stops=[3], workers=(2,), spawn=True)


def test_mix_in_spawned_workers_gives_the_same_batches():
    want = list(make_shuffled(0))
    got = list(DataLoader(mixture(), batch_size=4, shuffle=True, seed=1, num_workers=2,
                          multiprocessing_context="spawn"))
    assert_batches_equal(got, want, "spawn workers")


def test_mid_epoch_state_names_positions_of_the_mixture():
    loader = make_shuffled(2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = json_round_trip(loader.state_dict())
    rest = list(it)
    resumed = make_shuffled(0)
    resumed.load_state_dict(state)
    assert state["position"] == 12 and state["dataset_len"] == len(mixture())
    assert_batches_equal(list(resumed), rest, "resumed with num_workers=0")
    seen = [(int(s), int(i)) for b in first + rest for s, i in zip(b["source"], b["index"])]
    m = mix([source(0, 17), sl.shuffle(source(1, 7), 3), source(2, 4)], [0.7, 0.2, 0.1], seed=5, stop="all")
    assert sorted(seen) == sorted(m)
