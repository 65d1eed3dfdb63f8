"""``set_epoch``: what frameworks tell a loader, on the loader or on ``loader.sampler``.

Each case compares the batches read after ``set_epoch`` with an uninterrupted loader's epoch,
batch by batch (``torch.equal`` on indices and on augmentation drawn from torch's global RNG).
The order of an epoch is settled at the first ``next()``: Lightning calls ``iter()`` before
``set_epoch`` when a ``fit`` (or a resume) begins.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from seqloader import BijectiveShuffleSampler, DataLoader
from seqloader.testing import assert_batches_equal

N, BATCH = 20, 4  # 5 batches per epoch


class Aug(Dataset):
    """An index and an augmentation drawn from torch's global RNG."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"index": i, "aug": torch.rand(2)}


def make(num_workers=0, **kw):
    kw.setdefault("shuffle", True)
    return DataLoader(Aug(), batch_size=BATCH, seed=7, num_workers=num_workers, **kw)


@pytest.fixture(scope="module")
def reference():
    """Epochs 0..3 of an uninterrupted loader."""
    loader = make()
    return [list(loader) for _ in range(4)]


def test_the_default_sampler_is_torchs_class_and_forwards_set_epoch_to_the_loader():
    shuffled, ordered = make(), make(shuffle=False)
    assert isinstance(shuffled.sampler, RandomSampler) and isinstance(ordered.sampler, SequentialSampler)
    assert shuffled.batch_sampler.sampler is shuffled.sampler
    shuffled.sampler.set_epoch(3)
    ordered.batch_sampler.sampler.set_epoch(2)
    assert (shuffled.state_dict()["epoch"], ordered.state_dict()["epoch"]) == (3, 2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_between_iter_and_the_first_batch_reads_that_epoch(reference, num_workers):
    loader = make(num_workers)
    it = iter(loader)          # what Lightning does when fit() begins, before telling the epoch
    loader.sampler.set_epoch(2)
    first = next(it)
    assert loader.stats()["current"]["epoch"] == 2
    assert_batches_equal([first] + list(it), reference[2])
    assert_batches_equal(list(loader), reference[3])  # and counting goes on from there


def test_set_epoch_before_iter_reads_that_epoch(reference):
    loader = make()
    loader.set_epoch(1)
    assert_batches_equal(list(loader), reference[1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_saved_at_an_epochs_end_then_set_epoch_reads_the_next_epoch(reference, num_workers):
    """Lightning resuming from a checkpoint written after an epoch's last batch: it loads the
    state, calls iter(), then set_epoch(next epoch), and uses that iterator for the next epoch."""
    saved = make()
    for _ in saved:
        pass_state = saved.state_dict()  # the last one: after the last batch, before StopIteration
    assert pass_state["epoch"] == 0 and pass_state["position"] == N
    loader = make(num_workers)
    loader.load_state_dict(pass_state)
    it = iter(loader)
    loader.sampler.set_epoch(1)
    assert_batches_equal(list(it), reference[1])
    assert_batches_equal(list(loader), reference[2])


def test_without_set_epoch_a_state_at_an_epochs_end_resumes_into_its_empty_rest(reference):
    loader = make()
    loader.load_state_dict({**make().state_dict(), "position": N})
    assert list(loader) == []
    assert_batches_equal(list(loader), reference[1])


def test_set_epoch_after_the_last_batch_ends_the_iterator_and_the_next_iter_reads_that_epoch(reference):
    loader = make()
    it = iter(loader)
    got = [next(it) for _ in range(5)]  # the whole epoch, StopIteration not reached yet
    loader.set_epoch(1)
    with pytest.raises(StopIteration):
        next(it)
    assert_batches_equal(got, reference[0])
    assert_batches_equal(list(loader), reference[1])  # epoch 1, not 2


@pytest.mark.parametrize("resumed", [False, True], ids=["running", "resumed"])
def test_set_epoch_mid_epoch_applies_from_the_next_iter(reference, resumed):
    loader = make()
    it = iter(loader)
    first = next(it)
    if resumed:  # a mid-epoch state loaded, then a contradicting set_epoch before its first batch
        state = loader.state_dict()
        loader = make()
        loader.load_state_dict(state)
        it = iter(loader)
    loader.set_epoch(3)
    rest = list(it)
    assert_batches_equal([first] + rest, reference[0])  # the epoch under way is read as it began
    assert_batches_equal(list(loader), reference[3])


def distributed_loader():
    """A loader over a DistributedSampler (one replica), and the sampler."""
    sampler = DistributedSampler(Aug(), num_replicas=1, rank=0, shuffle=True, seed=3)
    return DataLoader(Aug(), batch_size=BATCH, sampler=sampler, seed=7), sampler


@pytest.fixture(scope="module")
def distributed_reference():
    """Epochs 0..2 of an uninterrupted loader over a DistributedSampler, set_epoch before each."""
    loader, sampler = distributed_loader()
    epochs = []
    for e in range(3):
        sampler.set_epoch(e)
        epochs.append(list(loader))
    return epochs


def test_a_distributed_samplers_set_epoch_after_iter_moves_the_loaders_epoch(distributed_reference):
    """A sampler with set_epoch (Lightning injects a DistributedSampler): the loader's epoch, and
    so each batch's seeds, follow the sampler's epoch when it is set before the first batch."""
    fresh, sampler = distributed_loader()
    it = iter(fresh)
    sampler.set_epoch(1)
    assert_batches_equal(list(it), distributed_reference[1])
    assert fresh.state_dict()["sampler_epoch"] == 1


def test_a_bijective_samplers_set_epoch_after_iter_moves_the_loaders_epoch():
    def loader():
        return DataLoader(Aug(), batch_size=BATCH, sampler=BijectiveShuffleSampler(Aug(), seed=1), seed=7)

    ref = loader()
    epochs = [list(ref) for _ in range(2)]
    fresh = loader()
    it = iter(fresh)
    fresh.sampler.set_epoch(1)
    assert_batches_equal(list(it), epochs[1])


@pytest.mark.parametrize("copy_fn", [copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))],
                         ids=["deepcopy", "pickle"])
def test_a_copied_loaders_sampler_forwards_to_the_copy(copy_fn):
    loader = make()
    twin = copy_fn(loader)
    twin.sampler.set_epoch(2)
    assert (loader.state_dict()["epoch"], twin.state_dict()["epoch"]) == (0, 2)
    assert twin.batch_sampler.sampler is twin.sampler


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(6))


def test_an_iterable_loader_takes_set_epoch_before_iter_and_mid_stream_from_the_next_iter():
    loader = DataLoader(Stream(), batch_size=2, seed=0)
    loader.set_epoch(2)
    it = iter(loader)
    assert loader.state_dict()["epoch"] == 2
    loader.set_epoch(5)  # the stream is open: from the next iter()
    assert [b.tolist() for b in it] == [[0, 1], [2, 3], [4, 5]]
    iter(loader)
    assert loader.state_dict()["epoch"] == 5


@pytest.mark.parametrize("bad", [-1, 1.5, "2"])
def test_set_epoch_rejects_what_is_not_a_non_negative_int(bad):
    with pytest.raises((ValueError, TypeError), match="DataLoader.set_epoch: epoch"):
        make().set_epoch(bad)


def test_the_loaders_set_epoch_also_tells_a_custom_sampler(distributed_reference):
    fresh, sampler = distributed_loader()
    fresh.set_epoch(2)
    assert sampler.epoch == 2
    assert_batches_equal(list(fresh), distributed_reference[2])


def test_manual_seed_before_iter_does_not_repeat_an_epoch_but_set_epoch_does():
    """The departure of docs/migrating.md: torch's idiom (``torch.manual_seed`` before each pass)
    repeats torch's order; seqloader's order is ``(seed, epoch)``, and ``set_epoch(0)`` repeats it."""
    data = list(range(32))
    torch.manual_seed(123)
    theirs = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    torch.manual_seed(7)
    first_torch = [b.tolist() for b in theirs]
    torch.manual_seed(7)
    assert [b.tolist() for b in theirs] == first_torch  # torch: the same order again

    ours = DataLoader(data, batch_size=8, shuffle=True)
    torch.manual_seed(7)
    first = [b.tolist() for b in ours]
    torch.manual_seed(7)
    assert [b.tolist() for b in ours] != first  # the next epoch, whatever the global generator says
    ours.set_epoch(0)
    assert [b.tolist() for b in ours] == first
