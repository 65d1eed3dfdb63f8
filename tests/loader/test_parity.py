"""Parity with torch.utils.data.DataLoader for fixed orders: same batches, same len, same attributes."""

from __future__ import annotations

import inspect
import itertools
import re
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, SequentialSampler, get_worker_info

import seqloader
from seqloader import DataLoader

from seqloader.testing import assert_batches_equal


class Pairs(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.array([i, i * i]), "y": (i, float(i) / 2), "s": f"item{i}"}


class WithGetitems(Pairs):
    """Fetched a batch at a time, like torch does for datasets with __getitems__."""

    def __getitems__(self, indices):
        return [{"x": np.array([i, -i]), "y": (i, 0.5), "s": "batched"} for i in indices]


class Reversed(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


class Stream(IterableDataset):
    """An iterable split over workers via get_worker_info, as in torch's documentation."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(wid, self.n, nw))


def sum_collate(items):
    return sum(int(np.sum(it["x"])) for it in items)


CASES = {
    "sequential": dict(dataset=Pairs(10), batch_size=3),
    "drop_last": dict(dataset=Pairs(10), batch_size=3, drop_last=True),
    "custom_sampler": dict(dataset=Pairs(7), batch_size=2, sampler=Reversed(7)),
    "explicit_sequential_sampler": dict(dataset=Pairs(5), batch_size=2, sampler=SequentialSampler(range(5))),
    "batch_sampler": dict(dataset=Pairs(9), batch_sampler=BatchSampler(Reversed(9), 4, False)),
    "batch_size_none": dict(dataset=Pairs(4), batch_size=None),
    "getitems": dict(dataset=WithGetitems(7), batch_size=3),
    "collate_fn": dict(dataset=Pairs(8), batch_size=3, collate_fn=sum_collate),
    "list_dataset": dict(dataset=[(i, np.float32(i)) for i in range(6)], batch_size=4),
}


def _both(kwargs, num_workers=0):
    kwargs = dict(kwargs, num_workers=num_workers)
    return torch.utils.data.DataLoader(**kwargs), DataLoader(**kwargs, seed=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_batches_as_torch(name):
    ref, ours = _both(CASES[name])
    want = list(ref)
    assert_batches_equal(list(ours), want, name)
    assert len(ours) == len(ref) == len(want)


@pytest.mark.parametrize("name", ["sequential", "getitems", "batch_sampler"])
def test_same_batches_as_torch_with_workers(name):
    ref, ours = _both(CASES[name], num_workers=2)
    assert_batches_equal(list(ours), list(ref), name)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size, drop_last", [(3, False), (3, True), (None, False)])
def test_iterable_dataset_same_batches_as_torch(num_workers, batch_size, drop_last):
    kwargs = dict(dataset=Stream(11), batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
    ref = torch.utils.data.DataLoader(**kwargs)
    ours = DataLoader(**kwargs, seed=0)
    assert_batches_equal(list(ours), list(ref))
    assert_batches_equal(list(ours), list(ref), "second epoch")


def test_iterable_dataset_len_follows_torch():
    class Sized(Stream):
        def __len__(self):
            return self.n

    for bs, dl in [(3, False), (3, True), (None, False)]:
        kwargs = dict(dataset=Sized(10), batch_size=bs, drop_last=dl)
        assert len(DataLoader(**kwargs)) == len(torch.utils.data.DataLoader(**kwargs))
    with pytest.raises(TypeError):
        len(DataLoader(Stream(3)))


def test_shuffle_visits_every_item_once_per_epoch():
    loader = DataLoader(list(range(50)), batch_size=8, shuffle=True, seed=1)
    for _ in range(2):
        got = torch.cat(list(loader)).tolist()
        assert sorted(got) == list(range(50)) and got != list(range(50))
    assert len(loader) == 7


def test_every_constructor_argument_is_an_attribute():
    """Lightning-style re-instantiation: a loader rebuilt from its attributes yields the same."""
    loader = DataLoader(Pairs(9), batch_size=4, shuffle=True, drop_last=True, seed=11)
    params = [p for p in inspect.signature(DataLoader.__init__).parameters if p != "self"]
    ref_params = [p for p in inspect.signature(torch.utils.data.DataLoader.__init__).parameters
                  if p != "self"]
    assert params == ref_params + ["snapshot_every_n_steps", "seed", "max_worker_restarts",
                                   "batch_size_schedule", "profile_stages", "worker_method",
                                   "threads_per_worker", "autotune", "memory_budget"]  # torchdata's, then ours (worker_method: torch's development branch)
    kwargs = {p: getattr(loader, p) for p in params}
    kwargs["sampler"] = kwargs["batch_sampler"] = None  # torch's defaults, rebuilt from shuffle
    rebuilt = DataLoader(**kwargs)
    assert_batches_equal(list(rebuilt), list(loader))
    assert loader.seed == 11 and loader.shuffle is True


def test_default_collate_and_convert_like_torch():
    loader = DataLoader(Pairs(3), batch_size=None)
    assert loader.collate_fn is torch.utils.data.default_convert
    assert DataLoader(Pairs(3)).collate_fn is torch.utils.data.default_collate


def test_pin_memory_without_accelerator_warns_like_torch():
    kwargs = dict(dataset=list(range(4)), batch_size=2, pin_memory=True)
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: batches are pinned")
    with pytest.warns(UserWarning, match="no accelerator is found"):
        want = list(torch.utils.data.DataLoader(**kwargs))
    with pytest.warns(UserWarning, match="no accelerator is found"):
        got = list(DataLoader(**kwargs, seed=0))
    assert_batches_equal(got, want)


def test_exported_names():
    assert seqloader.DataLoader is seqloader.StatefulDataLoader
    assert issubclass(seqloader.DataLoader, torch.utils.data.DataLoader)
    assert "BijectiveShuffleSampler" in seqloader.__all__


class Failing(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError("no item 5")
        return i


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_dataset_errors_keep_their_type_and_gain_a_note(num_workers, persistent):
    loader = DataLoader(Failing(), batch_size=2, num_workers=num_workers, seed=0,
                        persistent_workers=persistent)
    with pytest.raises(KeyError, match="no item 5") as err:
        list(loader)
    assert "seqloader: raised in DataLoader at item 5 (batch 2, epoch 0)" in err.value.__notes__
    # the loader is still usable: the next epoch fails at the same place, after the same batches
    it = iter(loader)
    assert [b.tolist() for b in itertools.islice(it, 2)] == [[0, 1], [2, 3]]
    with pytest.raises(KeyError):
        next(it)


class WhoAmI(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = get_worker_info()
        return (info.id, info.num_workers, type(info.dataset).__name__, WhoAmI.initialised)

    initialised = False


def _init_worker(worker_id):
    WhoAmI.initialised = True


def test_map_style_workers_see_worker_info_and_run_worker_init_fn():
    loader = DataLoader(WhoAmI(), batch_size=None, num_workers=2, worker_init_fn=_init_worker, seed=0)
    got = list(loader)
    assert {g[0] for g in got} <= {0, 1}
    assert all(list(g[1:]) == [2, "WhoAmI", True] for g in got)


def test_torchs_iterator_hook_returns_ours():
    loader = DataLoader(list(range(4)), batch_size=2, seed=0)
    it = loader._get_iterator()
    assert [b.tolist() for b in it] == [[0, 1], [2, 3]]
    assert loader.state_dict()["epoch"] == 1


class _Bulk(Dataset):
    """``__getitem__`` takes a list of indices (bulk loading under ``batch_size=None``)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor(i) * 10


class _ListsSampler(torch.utils.data.Sampler):
    def __iter__(self):
        return iter([[0, 1, 2], [3, 4], [5]])  # lists of different lengths

    def __len__(self):
        return 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_of_index_lists_with_batch_size_none_reads_in_bulk_as_torch(num_workers):
    kw = dict(batch_size=None, sampler=_ListsSampler(), num_workers=num_workers)
    want = list(torch.utils.data.DataLoader(_Bulk(), **kw))
    got = list(DataLoader(_Bulk(), seed=0, **kw))
    assert [b.tolist() for b in got] == [b.tolist() for b in want] == [[0, 10, 20], [30, 40], [50]]


class _LongerThanItSays(torch.utils.data.IterableDataset):
    def __len__(self):
        return 3

    def __iter__(self):
        return iter(range(5))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_iterable_dataset_longer_than_its_len_warns_in_torchs_words(num_workers):
    def messages(loader_type):
        loader = loader_type(_LongerThanItSays(), batch_size=None, num_workers=num_workers)
        assert len(loader) == 3
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = [int(b) for b in loader]
        assert out == [0, 1, 2, 3, 4]
        return [re.sub(r"object at 0x[0-9a-f]+", "object", str(w.message)) for w in caught
                if "Length of IterableDataset" in str(w.message)]

    want = messages(torch.utils.data.DataLoader)
    assert len(want) == 2 and messages(DataLoader) == want
