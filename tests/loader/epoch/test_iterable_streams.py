"""IterableDataset streams on seqloader's workers (issue 9.5, 11.1): torch's round-robin, torchdata's
state protocol, persistent workers, epoch ends. torch's DataLoader is the oracle for the order."""

from __future__ import annotations

import os

import pytest
import torch

from seqloader import DataLoader
from seqloader.loader.state.state import KEYS_OF_VERSION
from seqloader.testing import assert_batches_equal, json_round_trip


class Sharded(torch.utils.data.IterableDataset):
    """Worker w of n yields range(w, total, n) (sharding itself by get_worker_info), with a draw
    from torch's global RNG; Stateful through a counter of items yielded by the live iterator."""

    def __init__(self, total=23):
        self.total, self.start, self.pos = total, 0, 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        mine = list(range(w, self.total, n))
        start, self.start = self.start, 0
        for self.pos in range(start, len(mine)):
            yield torch.tensor([mine[self.pos], int(torch.randint(0, 10**6, ()))])
        self.pos = len(mine)

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.start = sd["pos"] + 1  # pos is the last item yielded (or the length, at the end)


class SelfIterator(torch.utils.data.IterableDataset):
    """``__iter__`` returns ``self`` and resets; the state must be loaded after ``iter()``."""

    def __init__(self, n=40):
        self.n, self.cur, self.end = n, 0, 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        self.cur, self.end = self.n * w // k, self.n * (w + 1) // k
        return self

    def __next__(self):
        if self.cur >= self.end:
            raise StopIteration
        self.cur += 1
        return self.cur - 1

    def state_dict(self):
        return {"cur": self.cur, "end": self.end}

    def load_state_dict(self, sd):
        self.cur, self.end = sd["cur"], sd["end"]


class EpochCounting(torch.utils.data.IterableDataset):
    """Counts its own epochs at the end of each pass (state: next item and epoch)."""

    def __init__(self, n=12):
        self.n, self.i, self.epoch, self.resume = n, 0, 0, None

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        start, self.resume = (self.resume or 0), None
        for self.i in range(start, self.n // k):
            yield (w * 100 + self.i, self.epoch, os.getpid())
        self.i, self.epoch = 0, self.epoch + 1

    def state_dict(self):
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, sd):
        self.resume, self.epoch = sd["i"], sd["epoch"]


def keep(x):
    return x


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_same_batches_as_torch_round_robin(num_workers):
    ds = Sharded()
    ours = [b[:, 0].tolist() for b in DataLoader(ds, batch_size=3, num_workers=num_workers, seed=0)]
    torch_ = [b[:, 0].tolist() for b in torch.utils.data.DataLoader(Sharded(), batch_size=3,
                                                                    num_workers=num_workers)]
    assert ours == torch_


@pytest.mark.parametrize("num_workers", [0, 2])
def test_get_worker_info_and_stateful_resume_exact_at_every_step(num_workers):
    def make():
        return DataLoader(Sharded(), batch_size=2, num_workers=num_workers, seed=4)

    ref = make()
    e0, e1 = list(ref), list(ref)
    loader, states = make(), [json_round_trip(make().state_dict())]
    for _ in loader:
        states.append(json_round_trip(loader.state_dict()))
    for k, sd in enumerate(states):
        resumed = make()
        resumed.load_state_dict(sd)
        assert_batches_equal(list(resumed), e0[k:], f"stop {k}")
        assert_batches_equal(list(resumed), e1, f"stop {k}, next epoch")


@pytest.mark.parametrize("saved, loaded", [(0, 1), (1, 0)])
def test_a_state_resumes_with_the_same_number_of_streams_whatever_num_workers_says(saved, loaded):
    # num_workers=0 and num_workers=1 both read one stream: their states are interchangeable
    def make(num_workers):
        return DataLoader(Sharded(), batch_size=2, num_workers=num_workers, seed=4)

    ref = make(saved)
    e0, e1 = list(ref), list(ref)
    loader = make(saved)
    it = iter(loader)
    for _ in range(3):
        next(it)
    resumed = make(loaded)
    resumed.load_state_dict(json_round_trip(loader.state_dict()))
    assert_batches_equal(list(resumed), e0[3:], "rest of the epoch")
    assert_batches_equal(list(resumed), e1, "next epoch")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterator_dataset_loads_its_state_after_iter(num_workers):
    def make():
        return DataLoader(SelfIterator(), batch_size=None, num_workers=num_workers, seed=0)

    ref = list(make())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    sd = json_round_trip(loader.state_dict())
    resumed = make()
    resumed.load_state_dict(sd)
    assert head + list(resumed) == ref
    assert sorted(int(x) for x in ref) == list(range(40))


def test_an_early_state_before_every_worker_produced_a_batch_is_valid():
    loader = DataLoader(Sharded(), batch_size=2, num_workers=2, seed=1)
    ref = list(DataLoader(Sharded(), batch_size=2, num_workers=2, seed=1))
    it = iter(loader)
    got = [next(it)]
    sd = loader.state_dict()
    assert [w["batches"] for w in sd["iterable"]["workers"]] == [1, 0]
    resumed = DataLoader(Sharded(), batch_size=2, num_workers=2, seed=1)
    resumed.load_state_dict(sd)
    assert_batches_equal(got + list(resumed), ref)


def test_persistent_workers_keep_their_processes_and_dataset_copies_across_epochs():
    loader = DataLoader(EpochCounting(), batch_size=None, num_workers=2, persistent_workers=True,
                        collate_fn=keep, seed=0)
    e0, e1 = list(loader), list(loader)
    assert {p for _, _, p in e0} == {p for _, _, p in e1} and len({p for _, _, p in e0}) == 2
    assert {e for _, e, _ in e0} == {0} and {e for _, e, _ in e1} == {1}  # the copies live on
    fresh = DataLoader(EpochCounting(), batch_size=None, num_workers=2, collate_fn=keep, seed=0)
    assert {e for _, e, _ in list(fresh) + list(fresh)} == {0}  # non-persistent: new copies


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, True)])
def test_a_state_saved_after_stopiteration_resumes_the_next_epoch_with_the_streams_states(num_workers, persistent):
    def make():
        return DataLoader(EpochCounting(), batch_size=None, num_workers=num_workers,
                          persistent_workers=persistent, collate_fn=keep, seed=0)

    loader = make()
    list(loader)
    sd = json_round_trip(loader.state_dict())
    want = [(i, e) for i, e, _ in loader]
    resumed = make()
    resumed.load_state_dict(sd)
    assert [(i, e) for i, e, _ in resumed] == want and {e for _, e in want} == {1}


def test_a_state_saved_after_the_last_batch_resumes_into_an_empty_rest():
    loader = DataLoader(Sharded(), batch_size=4, num_workers=2, seed=0)
    ref = DataLoader(Sharded(), batch_size=4, num_workers=2, seed=0)
    e1 = (list(ref), list(ref))[1]
    batches = list(iter_keep(loader))
    sd = batches.pop()
    resumed = DataLoader(Sharded(), batch_size=4, num_workers=2, seed=0)
    resumed.load_state_dict(sd)
    assert list(resumed) == []
    assert_batches_equal(list(resumed), e1)


def iter_keep(loader):
    """Yield the batches of one epoch, then the state after the last batch (before StopIteration)."""
    it = iter(loader)
    n = 0
    sd = None
    for b in it:
        n += 1
        sd = json_round_trip(loader.state_dict())
        yield b
    yield sd


def test_another_num_workers_is_a_clear_error_and_a_version_1_iterable_state_is_refused():
    loader = DataLoader(Sharded(), batch_size=2, num_workers=2, seed=0)
    sd = loader.state_dict()
    with pytest.raises(ValueError, match=r"'iterable' holds 2 worker stream\(s\) but this loader has 1"):
        DataLoader(Sharded(), batch_size=2, num_workers=0, seed=0).load_state_dict(sd)
    v1 = {k: v for k, v in sd.items() if k in KEYS_OF_VERSION[1]}
    v1.update(version=1, iterable={"workers": v1["iterable"]["workers"], "next_worker": 0})
    with pytest.raises(ValueError, match="version-1 state_dict was saved for an IterableDataset"):
        loader.load_state_dict(v1)


class Cursor(torch.utils.data.IterableDataset):
    """Its own iterator, *not* reset by ``__iter__``: where it stands is only in its state."""

    def __init__(self, n=10):
        self.n, self.i = n, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, sd):
        self.i = sd["i"]


def test_at_num_workers_0_iter_opens_the_stream_so_a_state_before_any_batch_resumes_it():
    ds = Cursor()
    loader = DataLoader(ds, batch_size=None, seed=0)
    iter(loader)  # like torch, iter(dataset) happens here, and the stream's state is taken
    sd = loader.state_dict()
    assert sd["iterable"]["workers"][0]["state"] == {"dataset": None, "iterator": {"i": 0}}
    assert [int(x) for x in loader] == list(range(10))  # a new iter() reads the untouched object
    resumed = DataLoader(ds, batch_size=None, seed=0)  # the same object, now at its end
    resumed.load_state_dict(sd)
    assert [int(x) for x in resumed] == list(range(10))


class SlowSecondStream(torch.utils.data.IterableDataset):
    """Worker w yields 10 * w + k for k < 5; worker 1's first item waits until the reader has
    received worker 0's last item and set ``release`` (a fork-shared event), so with
    ``in_order=False`` worker 0's stream certainly comes first whatever the machine's load."""

    def __init__(self):
        import multiprocessing
        self.release = multiprocessing.get_context("fork").Event()

    def __iter__(self):
        w = torch.utils.data.get_worker_info().id
        for k in range(5):
            if w == 1 and k == 0:
                assert self.release.wait(60), "the reader never got stream 0's last item"
            yield 10 * w + k


def _stream_loader(ds, in_order):
    return DataLoader(ds, batch_size=None, num_workers=2, in_order=in_order, seed=0,
                      multiprocessing_context="fork")


def test_in_order_false_yields_a_streams_batches_while_another_stream_is_stuck_and_resumes_each_once():
    ds = SlowSecondStream()
    got, states = [], []
    for x in _stream_loader(ds, in_order=False):
        got.append(int(x))
        if got[-1] == 4:
            ds.release.set()
    assert got == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]  # torch's in-order round-robin: 0, 10, 1, 11, ...
    ds = SlowSecondStream()  # stuck again: states taken while stream 1's first item is pending
    loader = _stream_loader(ds, in_order=False)
    it = iter(loader)
    for _ in range(3):
        next(it)
        states.append(json_round_trip(loader.state_dict()))
    ds.release.set()
    del it
    assert states[-1]["position"] == 1 and states[-1]["ahead"] == [2, 4]  # items 0, 2, 4: stream 0
    for sd in states:
        done = sd["iterable"]["workers"][0]["batches"] + sd["iterable"]["workers"][1]["batches"]
        for in_order in (False, True):
            resumed = _stream_loader(ds, in_order)
            resumed.load_state_dict(sd)
            rest = [int(x) for x in resumed]
            assert sorted(got[:done] + rest) == sorted(got), (sd, in_order, rest)
            for w in (0, 1):  # each stream's batches in the stream's order
                mine = [x for x in rest if x // 10 == w]
                assert mine == sorted(mine)


@pytest.mark.parametrize("resume_in_order", [False, True])
def test_in_order_false_with_stateful_streams_resumes_every_batch_once_with_the_same_values(resume_in_order):
    """Completion order varies from run to run; each batch's content (the item and its draw
    from torch's global RNG) does not, and a resume from any step yields exactly the rest."""
    def loader(in_order):
        return DataLoader(Sharded(), batch_size=2, num_workers=2, in_order=in_order, seed=3)

    ref = loader(False)
    got, states = [], []
    for batch in ref:
        got.append(batch)
        states.append(json_round_trip(ref.state_dict()))
    by_first = {int(b[0, 0]): b for b in got}
    assert sorted(by_first) == sorted(int(b[0, 0]) for b in DataLoader(Sharded(), batch_size=2, num_workers=2, seed=3))
    for j, sd in enumerate(states):
        resumed = loader(resume_in_order)
        resumed.load_state_dict(sd)
        rest = list(resumed)
        assert sorted(int(b[0, 0]) for b in got[:j + 1] + rest) == sorted(by_first)
        for b in rest:
            assert torch.equal(b, by_first[int(b[0, 0])])
