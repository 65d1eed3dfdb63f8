"""as_iterable_dataset: exact-once splitting over ranks and torch DataLoader workers."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from torch.utils.data import DataLoader

import seqloader
from seqloader.integrations.torch_iterable import as_iterable_dataset


class Squares:
    """A plain map-style dataset (not a seqloader sequence)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


@pytest.mark.parametrize("n", [0, 1, 7, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_ranks_partition_the_sequence_in_order(n, world_size):
    parts = [list(as_iterable_dataset(range(n), rank=r, world_size=world_size)) for r in range(world_size)]
    assert sorted(sum(parts, [])) == list(range(n))
    for r, part in enumerate(parts):
        assert part == list(range(r, n, world_size))
        assert len(as_iterable_dataset(range(n), rank=r, world_size=world_size)) == len(part)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 3])
def test_torch_dataloader_workers_and_ranks_yield_each_item_once(num_workers, world_size):
    n = 23
    seen = []
    for r in range(world_size):
        ds = as_iterable_dataset(Squares(n), rank=r, world_size=world_size)
        loader = DataLoader(ds, batch_size=1, num_workers=num_workers)
        got = [int(b) for b in loader]
        # batch_size=1: torch takes batches from its workers round-robin, so a rank sees its part in order
        assert got == [i * i for i in range(r, n, world_size)]
        seen += got
    assert sorted(seen) == sorted(i * i for i in range(n))


def test_batches_with_two_workers_cover_the_rank_exactly_once():
    ds = as_iterable_dataset(list(range(20)), rank=1, world_size=2)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    # worker w yields ds positions w, w+2, ...: worker 0 -> 1, 5, 9, 13, 17; worker 1 -> 3, 7, 11, 15, 19
    assert [b.tolist() for b in batches] == [[1, 5, 9, 13], [3, 7, 11, 15], [17], [19]]


def test_worker_split_without_a_loader_is_the_whole_rank():
    ds = as_iterable_dataset(range(10), rank=0, world_size=1)
    assert list(ds) == list(range(10)) and len(ds) == 10


def test_defaults_to_a_single_process_when_distributed_is_not_initialised():
    assert not torch.distributed.is_initialized()
    ds = as_iterable_dataset(range(5))
    assert (ds.rank, ds.world_size, list(ds)) == (0, 1, [0, 1, 2, 3, 4])


def test_pickles_for_spawned_workers():
    ds = pickle.loads(pickle.dumps(as_iterable_dataset(range(9), rank=2, world_size=4)))
    assert (list(ds), repr(ds)) == ([2, 6], "as_iterable_dataset(rank=2, world_size=4, len=2)")


def test_argument_errors():
    with pytest.raises(ValueError, match=r"rank and world_size must be given together \(got rank=1, world_size=None\)"):
        as_iterable_dataset(range(4), rank=1)
    with pytest.raises(ValueError, match=r"world_size must be a positive int \(got 0\)"):
        as_iterable_dataset(range(4), rank=0, world_size=0)
    with pytest.raises(ValueError, match=r"rank must be a non-negative int \(got -1\)"):
        as_iterable_dataset(range(4), rank=-1, world_size=2)
    with pytest.raises(TypeError, match=r"rank must be an int \(got float 1.0\)"):
        as_iterable_dataset(range(4), rank=1.0, world_size=2)
    with pytest.raises(TypeError, match=r"seq must be a sized, indexable sequence \(got generator\)"):
        as_iterable_dataset(i for i in range(3))


def test_load_state_dict_makes_the_next_iterator_seek():
    ds = as_iterable_dataset(range(20), rank=1, world_size=2)
    it = iter(ds)
    head = [next(it) for _ in range(3)]
    state = ds.state_dict()
    assert (head, state) == ([1, 3, 5], {"yielded": 3})
    fresh = as_iterable_dataset(range(20), rank=1, world_size=2)
    fresh.load_state_dict(state)
    assert list(fresh) == [7, 9, 11, 13, 15, 17, 19]
    assert list(fresh) == list(range(1, 20, 2))  # only the next iterator resumes


def test_load_state_dict_rejects_a_malformed_state():
    ds = as_iterable_dataset(range(4), rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"expected \{'yielded': int\} \(got \{'position': 3\}\)"):
        ds.load_state_dict({"position": 3})
    with pytest.raises(ValueError, match=r"yielded must be a non-negative int \(got -1\)"):
        ds.load_state_dict({"yielded": -1})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_seqloader_dataloader_resumes_it_by_seeking(num_workers, caplog):
    def make():
        return seqloader.DataLoader(as_iterable_dataset(Squares(23), rank=1, world_size=2), batch_size=2,
                                    num_workers=num_workers)

    full = [b.tolist() for b in make()]
    assert sorted(sum(full, [])) == [i * i for i in range(1, 23, 2)]
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it, loader  # stop its workers
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full
    assert "replays" not in caplog.text  # a seek, not a replay
