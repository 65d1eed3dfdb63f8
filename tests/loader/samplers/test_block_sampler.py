"""``BlockShuffleSampler`` through ``seqloader.DataLoader``: an O(1) order, exact resume, lanes kept in the state."""

from __future__ import annotations

import pytest
import torch

import seqloader
from seqloader.testing import assert_resumes_exactly, json_round_trip

ENDS = [7, 7, 20, 33, 40, 52, 60]  # blocks of 7, 0, 13, 13, 7, 12, 8 items


def make(num_workers, window=2, seed=3, lanes=None):
    data = list(range(60))
    sampler = seqloader.BlockShuffleSampler(data, blocks=ENDS, window=window, seed=seed, lanes=lanes)
    return seqloader.DataLoader(data, batch_size=4, sampler=sampler, num_workers=num_workers, seed=0)


def test_every_item_once_per_epoch_and_epochs_differ():
    loader = make(0)
    e0 = torch.cat(list(loader)).tolist()
    e1 = torch.cat(list(loader)).tolist()
    assert sorted(e0) == sorted(e1) == list(range(60)) and e0 != e1


def make_two_lanes(num_workers):
    return make(num_workers, lanes=2)  # fixed: by default the first loader's num_workers decides


def test_resumes_exactly_with_other_num_workers():
    assert_resumes_exactly(make_two_lanes, stops=[0, 1, 7, -1])


def test_lanes_come_from_the_first_loader_and_stay_in_the_state():
    loader = make(2)
    assert (loader.sampler.lanes, loader.sampler.chunk) == (2, 4)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    sd = json_round_trip(loader.state_dict())
    assert sd["sampler"]["lanes"] == 2
    resumed = make(0)  # would choose lanes=1: the saved lanes win, so the order is the same
    resumed.load_state_dict(sd)
    rest = list(resumed)
    ref = list(make(2))
    assert all(torch.equal(a, b) for a, b in zip(head + rest, ref)) and len(head + rest) == len(ref)


def test_a_state_for_another_window_is_refused():
    sd = make(0).state_dict()
    with pytest.raises(ValueError, match=r"'window' is 2 in the state but this sampler has 3"):
        make(0, window=3).load_state_dict(sd)


def test_seams_are_split_by_default_and_a_state_saved_before_that_keeps_its_order():
    loader = make(2)
    assert loader.sampler.split_seams is True
    sd = json_round_trip(loader.state_dict())
    assert sd["sampler"]["split_seams"] is True
    old = dict(sd, sampler={k: v for k, v in sd["sampler"].items() if k != "split_seams"})  # an older state
    resumed = make(0)
    resumed.load_state_dict(old)
    assert resumed.sampler.split_seams is False
    from seqloader.orders.block_permutation import BlockPermutation
    from seqloader.rng import derive_seed
    perm = BlockPermutation(ENDS, 2, derive_seed(3, "shuffle", 0), lanes=2, chunk=4)   # the order before
    assert torch.cat(list(resumed)).tolist() == perm(torch.arange(60).numpy()).tolist()
    with pytest.raises(ValueError, match="BlockShuffleSampler.load_state_dict: split_seams must be a bool"):
        make(0).load_state_dict(dict(sd, sampler=dict(sd["sampler"], split_seams="yes")))
