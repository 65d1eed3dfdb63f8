"""The resume contract: after load_state_dict the loader yields exactly what the uninterrupted run did."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch.utils.data import Dataset, RandomSampler, Sampler

from seqloader import BijectiveShuffleSampler, DataLoader
from seqloader.loader import world as topology

from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip, run_saving_after


# -- datasets (module level: picklable for workers and spawn) ------------------------------------

class Noisy(Dataset):
    """Items draw from all three global RNGs: batches are reproducible only if seeding is right."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i)]) + torch.rand(1), "np": np.float64(np.random.rand()),
                "py": (i, random.random())}


class Counting(Dataset):
    """Counts __getitem__ calls (in this process)."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        return i


class EveryThird(Sampler):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(list(range(0, self.n, 3)) + list(range(1, self.n, 3)))

    def __len__(self):
        return len(range(0, self.n, 3)) + len(range(1, self.n, 3))


class Uneven(Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        i, k = 0, 1
        while i < self.n:
            yield list(range(i, min(self.n, i + k)))
            i, k = i + k, k % 3 + 1

    def __len__(self):
        return len(list(iter(self)))


def make_shuffled(nw):
    return DataLoader(Noisy(11), batch_size=3, shuffle=True, seed=5, num_workers=nw)


def make_sequential_drop_last(nw):
    return DataLoader(list(range(10)), batch_size=4, drop_last=True, seed=1, num_workers=nw)


def make_unbatched(nw):
    return DataLoader(Noisy(5), batch_size=None, shuffle=True, seed=2, num_workers=nw)


def make_custom_sampler(nw):
    return DataLoader(Noisy(8), batch_size=2, sampler=EveryThird(8), seed=3, num_workers=nw)


def make_random_sampler(nw):  # a RandomSampler without generator draws from the global RNG
    data = list(range(9))
    return DataLoader(data, batch_size=2, sampler=RandomSampler(data), seed=3, num_workers=nw)


def make_batch_sampler(nw):
    return DataLoader(Noisy(9), batch_sampler=Uneven(9), seed=4, num_workers=nw)


def make_bijective(nw):
    return DataLoader(list(range(13)), batch_size=4, sampler=BijectiveShuffleSampler(range(13), seed=9),
                      seed=4, num_workers=nw)


def make_persistent(nw):
    return DataLoader(Noisy(7), batch_size=2, shuffle=True, seed=6, num_workers=nw,
                      persistent_workers=nw > 0)


@pytest.mark.parametrize("make_loader, stops", [
    (make_shuffled, [1, 2, -1]),
    (make_sequential_drop_last, [0, 1, -1]),
    (make_unbatched, [3]),
    (make_custom_sampler, [1, -2]),
    (make_random_sampler, [2]),
    (make_batch_sampler, [2, -1]),
    (make_bijective, [1]),
    (make_persistent, [2]),
])
def test_resumes_exactly(make_loader, stops):
    assert_resumes_exactly(make_loader, stops)


def test_resumes_in_a_fresh_spawned_process():
    assert_resumes_exactly(make_shuffled, [2], workers=(2,), spawn=True)


def test_classic_break_after_three_batches():
    """list(range(15)), batch_size=5, shuffle: stop after the last of three batches (before
    StopIteration): the resumed loader finishes that epoch with nothing, then reads the next."""
    def make():
        return DataLoader(list(range(15)), batch_size=5, shuffle=True, seed=0)

    ref = make()
    epochs = [[b.tolist() for b in ref] for _ in range(3)]
    loader = make()
    seen = []
    for i, batch in enumerate(loader):
        seen.append(batch.tolist())
        if i == 2:
            sd = json_round_trip(loader.state_dict())
            break
    assert seen == epochs[0] and (sd["epoch"], sd["position"]) == (0, 15)
    resumed = make()
    resumed.load_state_dict(sd)
    assert [[b.tolist() for b in resumed] for _ in range(3)] == [[]] + epochs[1:]
    # stopping after one batch resumes the remaining two
    loader = make()
    next(iter(loader))
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert [b.tolist() for b in resumed] == epochs[0][1:]


def test_load_mid_iteration_on_the_same_object():
    loader = make_shuffled(0)
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    sd = loader.state_dict()
    rest = list(it)
    loader.load_state_dict(sd)
    assert_batches_equal(list(loader), rest)
    # a live iterator is superseded by load_state_dict
    it = iter(loader)
    next(it)
    loader.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="superseded"):
        next(it)
    assert_batches_equal(list(loader), rest)
    assert len(first) == 2


def test_new_iter_after_a_break_starts_the_next_epoch():
    ref = make_shuffled(0)
    e0, e1 = list(ref), list(ref)
    loader = make_shuffled(0)
    next(iter(loader))
    assert_batches_equal(list(loader), e1)
    assert loader.state_dict()["epoch"] == 2 and e0


def test_resume_seeks_without_reading_skipped_items():
    ds = Counting(1000)
    loader = DataLoader(ds, batch_size=10, shuffle=True, seed=0)
    it = iter(loader)
    for _ in range(90):
        next(it)
    sd = loader.state_dict()
    fresh_ds = Counting(1000)
    resumed = DataLoader(fresh_ds, batch_size=10, shuffle=True, seed=0)
    resumed.load_state_dict(sd)
    got = list(resumed)
    assert fresh_ds.calls == 100 and len(got) == 10
    assert_batches_equal(got, list(it))


def test_tutorial_stateful_sampler_and_noisy_dataset():
    """torchdata's tutorial: a Stateful sampler (own generator) and a dataset with RNG state."""
    for num_workers in (0, 2):
        dl = DataLoader(NoisyRange(5, 1, 1), sampler=MySampler(5, 1, 10), batch_size=2,
                        drop_last=False, num_workers=num_workers, seed=0)
        batches, sd = run_saving_after(dl, 2)
        dl.load_state_dict(sd)
        batches2 = list(dl)
        assert len(batches) == 5
        assert_batches_equal(batches2, batches[3:])


class MySampler(Sampler):
    def __init__(self, high: int, seed: int, limit: int):
        self.seed, self.high, self.limit = seed, high, limit
        self.g = torch.Generator()
        self.g.manual_seed(self.seed)
        self.i = 0

    def __iter__(self):
        while self.i < self.limit:
            val = int(torch.randint(high=self.high, size=(1,), generator=self.g))
            self.i += 1
            yield val

    def load_state_dict(self, state_dict):
        self.i = state_dict["i"]
        self.g.set_state(state_dict["rng"])

    def state_dict(self):
        return {"i": self.i, "rng": self.g.get_state()}


class NoisyRange(Dataset):
    def __init__(self, high: int, mean: float, std: float):
        self.high, self.mean, self.std = high, torch.tensor([float(mean)]), torch.tensor([float(std)])

    def __len__(self):
        return self.high

    def __getitem__(self, idx):
        if not (0 <= idx < self.high):
            raise IndexError()
        return idx + torch.normal(self.mean, self.std).item()

    def load_state_dict(self, state_dict):
        torch.set_rng_state(state_dict["rng"])

    def state_dict(self):
        return {"rng": torch.get_rng_state()}


def test_stateful_sampler_resumes_across_epochs_in_a_fresh_loader():
    """A sampler with its own generator: its state from the start of the epoch is saved."""
    class Shuffler(Sampler):
        def __init__(self, n):
            self.n, self.g = n, torch.Generator().manual_seed(0)

        def __iter__(self):
            return iter(torch.randperm(self.n, generator=self.g).tolist())

        def __len__(self):
            return self.n

        def state_dict(self):
            return {"rng": self.g.get_state()}

        def load_state_dict(self, sd):
            self.g.set_state(sd["rng"])

    def make():
        return DataLoader(list(range(7)), batch_size=2, sampler=Shuffler(7), seed=0)

    ref = make()
    e0, e1, e2 = list(ref), list(ref), list(ref)
    loader = make()
    list(loader)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(sd)
    assert_batches_equal(list(resumed), e1[1:])
    assert_batches_equal(list(resumed), e2)
    assert e0


def test_iterating_leaves_the_callers_global_rngs_alone():
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    want = (torch.rand(1), np.random.rand(), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    list(DataLoader(Noisy(6), batch_size=2, shuffle=True, seed=1))
    assert (torch.rand(1), np.random.rand(), random.random()) == want


def test_seed_none_is_drawn_from_torch_default_generator():
    torch.manual_seed(123)
    a = DataLoader(list(range(20)), batch_size=4, shuffle=True)
    torch.manual_seed(123)
    b = DataLoader(list(range(20)), batch_size=4, shuffle=True)
    g = torch.Generator().manual_seed(123)
    c = DataLoader(list(range(20)), batch_size=4, shuffle=True, generator=g)
    assert a.seed == b.seed == c.seed
    assert_batches_equal(list(a), list(b))


def test_epochs_depend_only_on_seed_and_epoch():
    a, b = make_shuffled(0), make_shuffled(0)
    assert_batches_equal(list(a) + list(a), list(b) + list(b))
    c = DataLoader(Noisy(11), batch_size=3, shuffle=True, seed=6)
    assert [t["py"][0].tolist() for t in c] != [t["py"][0].tolist() for t in make_shuffled(0)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_ranks_shard_the_global_order_and_resume(monkeypatch, drop_last):
    n, bs, world = 11, 2, 3

    def run(rank, sd=None):
        monkeypatch.setattr(topology, "current_world", lambda: (rank, world))
        loader = DataLoader(list(range(n)), batch_size=bs, shuffle=True, seed=7, drop_last=drop_last)
        if sd is not None:
            loader.load_state_dict(sd)
        return loader

    per_rank = {}
    for r in range(world):
        ref = run(r)
        assert len(ref) == (1 if drop_last else 2)
        e0, e1 = list(ref), list(ref)
        per_rank[r] = e0
        loader = run(r)
        next(iter(loader))
        sd = loader.state_dict()
        assert sd["position"] == bs * world  # with drop_last, the end of the (one-batch) epoch
        resumed = run(r, sd)
        assert_batches_equal(list(resumed), e0[1:], f"rank {r}")
        assert_batches_equal(list(resumed), e1, f"rank {r}, next epoch")
    items = [int(x) for r in range(world) for b in per_rank[r] for x in b]
    if drop_last:  # 11 // 3 = 3 per rank, batches of 2: one full batch each
        assert len(items) == world * 2 and len(set(items)) == len(items)
    else:  # 4 per rank (padded by wrapping): every item at least once
        assert len(items) == world * 4 and set(items) == set(range(n))
    # same global order as world_size=1, read round-robin over ranks
    monkeypatch.setattr(topology, "current_world", lambda: (0, 1))
    order = [int(x) for b in DataLoader(list(range(n)), batch_size=1, shuffle=True, seed=7) for x in b]
    assert [int(x) for x in per_rank[1][0]] == [order[1], order[4]]


def test_elastic_resume_with_a_different_world_size(monkeypatch):
    n = 12
    monkeypatch.setattr(topology, "current_world", lambda: (0, 2))
    loader = DataLoader(list(range(n)), batch_size=2, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    assert sd["position"] == 4 and sd["saved_with"]["world_size"] == 2
    seen = []
    for r in range(4):
        monkeypatch.setattr(topology, "current_world", lambda r=r: (r, 4))
        resumed = DataLoader(list(range(n)), batch_size=2, shuffle=True, seed=1)
        resumed.load_state_dict(sd)
        seen += [int(x) for b in resumed for x in b]
    monkeypatch.setattr(topology, "current_world", lambda: (0, 1))
    order = [int(x) for b in DataLoader(list(range(n)), batch_size=1, shuffle=True, seed=1) for x in b]
    assert sorted(seen) == sorted(order[4:])


def test_seed_drawn_before_the_world_existed_is_refused(monkeypatch):
    monkeypatch.setattr(topology, "current_world", lambda: (0, 1))
    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)  # seed=None, drawn locally
    monkeypatch.setattr(topology, "current_world", lambda: (1, 2))
    with pytest.raises(ValueError, match=r"seed=None was drawn when torch.distributed had world_size=1"):
        iter(loader)
    with pytest.raises(ValueError, match="build the loader after init_process_group"):
        list(loader)
    assert loader.state_dict()["epoch"] == 0  # the refused iter() changed nothing
    # a loaded state carries the shared seed
    monkeypatch.setattr(topology, "current_world", lambda: (0, 2))
    sd = DataLoader(list(range(8)), batch_size=2, shuffle=True, seed=3).state_dict()
    monkeypatch.setattr(topology, "current_world", lambda: (1, 2))
    loader.load_state_dict(sd)
    assert len(list(loader)) == 2


def test_zero_length_epochs_advance_the_epoch():
    loader = DataLoader(list(range(3)), batch_size=4, drop_last=True, seed=0)
    assert list(loader) == [] and loader.state_dict()["epoch"] == 1
    assert list(loader) == [] and loader.state_dict()["epoch"] == 2


def test_batches_do_not_depend_on_num_workers():
    want = list(make_shuffled(0))
    for nw in (1,):
        assert_batches_equal(list(make_shuffled(nw)), want, f"num_workers={nw}")


@settings(deadline=None, max_examples=40)
@given(n=st.integers(0, 23), bs=st.one_of(st.none(), st.integers(1, 6)), drop_last=st.booleans(),
       shuffle=st.booleans(), world=st.integers(1, 3), data=st.data())
def test_property_resume_from_every_step(n, bs, drop_last, shuffle, world, data):
    """Built-in orders at num_workers=0: every saved step resumes exactly, on every rank."""
    rank = data.draw(st.integers(0, world - 1))
    drop_last = drop_last and bs is not None
    n = max(n, 1) if shuffle else n  # torch's RandomSampler rejects an empty dataset
    with mock.patch.object(topology, "current_world", lambda: (rank, world)):
        def make():
            return DataLoader(list(range(n)), batch_size=bs, shuffle=shuffle, drop_last=drop_last, seed=n)

        ref = make()
        e0, e1 = list(ref), list(ref)
        assert len(e0) == len(ref)
        loader, states = make(), []
        for _ in loader:
            states.append(json_round_trip(loader.state_dict()))
        for k, sd in enumerate(states, start=1):
            resumed = make()
            resumed.load_state_dict(sd)
            assert_batches_equal(list(resumed), e0[k:], f"stop {k}")  # empty after the last batch
            assert_batches_equal(list(resumed), e1, f"stop {k}, next epoch")
        if world == 1 and bs is not None:
            items = [int(x) for b in e0 for x in b]
            assert len(set(items)) == len(items) and (drop_last or sorted(items) == list(range(n)))
