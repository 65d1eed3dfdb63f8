"""``seqloader.sampler``: torchdata's ``Stateful`` protocol and ``StatefulDistributedSampler``."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from seqloader.sampler import Stateful, StatefulDistributedSampler


def make(n=23, **kw):
    kw.setdefault("num_replicas", 3)
    kw.setdefault("rank", 1)
    return StatefulDistributedSampler(list(range(n)), **kw)


def torch_order(n=23, epoch=0, **kw):
    kw.setdefault("num_replicas", 3)
    kw.setdefault("rank", 1)
    s = DistributedSampler(list(range(n)), **kw)
    s.set_epoch(epoch)
    return list(s)


@st.composite
def sampler_args(draw):
    num_replicas = draw(st.integers(1, 5))
    return dict(n=draw(st.integers(0, 40)), num_replicas=num_replicas,
                rank=draw(st.integers(0, num_replicas - 1)), shuffle=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)), drop_last=draw(st.booleans()))


@given(sampler_args(), st.integers(0, 3))
def test_order_equals_torch_distributed_sampler(args, epoch):
    s = make(**args)
    s.set_epoch(epoch)
    want = torch_order(epoch=epoch, **args)
    assert list(s) == want
    assert len(s) == len(want) == s.state_dict()["yielded"]


def test_constructor_arguments_and_initial_state():
    s = StatefulDistributedSampler(range(10), num_replicas=4, rank=3, shuffle=False, seed=7,
                                   drop_last=True)
    assert (s.num_replicas, s.rank, s.shuffle, s.seed, s.drop_last, s.epoch) == (4, 3, False, 7, True, 0)
    assert (s.yielded, s.next_yielded, s.state_dict()) == (0, None, {"yielded": 0})
    assert isinstance(s, DistributedSampler)
    assert repr(s) == ("StatefulDistributedSampler(len=2, num_replicas=4, rank=3, shuffle=False, "
                       "seed=7, epoch=0, yielded=0)")
    with pytest.raises(ValueError, match="Invalid rank 4"):  # torch's check
        StatefulDistributedSampler(range(10), num_replicas=4, rank=4)


def test_yielded_counts_the_indices_of_the_current_iterator():
    s = make()
    s.load_state_dict({"yielded": 5})
    list(s)                                  # consumes the loaded position
    it = iter(s)                             # a new epoch starts at iter(), not at the first next()
    assert s.state_dict() == {"yielded": 0}
    for k in range(1, len(s) + 1):
        next(it)
        assert s.yielded == k and s.state_dict() == {"yielded": k}
    with pytest.raises(StopIteration):
        next(it)
    assert s.state_dict() == {"yielded": len(s)}


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_state_saved_mid_epoch_resumes_exactly_the_remaining_indices(shuffle):
    full = list(make(shuffle=shuffle, seed=5))
    for k in range(len(full) + 1):
        s = make(shuffle=shuffle, seed=5)
        it = iter(s)
        head = [next(it) for _ in range(k)]
        sd = json.loads(json.dumps(s.state_dict()))
        resumed = make(shuffle=shuffle, seed=5)
        resumed.load_state_dict(sd)
        assert resumed.next_yielded == k
        rest = list(resumed)
        assert head + rest == full, k
        assert resumed.state_dict() == {"yielded": len(full)} and resumed.next_yielded is None
        assert list(resumed) == full  # the loaded position is used once


def test_resume_in_a_later_epoch_needs_set_epoch_as_in_torch():
    s = make(seed=1)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(3)]
    resumed = make(seed=1)
    resumed.load_state_dict(s.state_dict())
    resumed.set_epoch(2)  # the epoch is not part of the state
    assert head + list(resumed) == torch_order(seed=1, epoch=2)


def test_set_epoch_changes_the_order():
    s = make(n=50, seed=3)
    epoch0 = list(s)
    s.set_epoch(1)
    epoch1 = list(s)
    assert epoch0 != epoch1 and len(epoch0) == len(epoch1) == 17
    assert epoch1 == torch_order(n=50, seed=3, epoch=1)
    s.set_epoch(0)
    assert list(s) == epoch0
    assert list(make(n=50, shuffle=False)) == list(make(n=50, shuffle=False, seed=9))


def test_a_state_saved_at_the_end_of_an_epoch():
    """``{"yielded": len}``: the resumed epoch has nothing left, the one after is whole."""
    s = make()
    full = list(s)
    sd = s.state_dict()
    assert sd == {"yielded": len(full)} == {"yielded": 8}
    resumed = make()
    resumed.load_state_dict(sd)
    assert list(resumed) == [] and resumed.state_dict() == sd
    assert list(resumed) == full


def test_state_dict_right_after_load_state_dict_is_the_loaded_state():
    s = make()
    list(s)
    s.load_state_dict({"yielded": 2})
    assert s.yielded == 8 and s.state_dict() == {"yielded": 2}  # pending, so saving again keeps it


def test_empty_dataset():
    s = make(n=0)
    assert list(s) == [] and s.state_dict() == {"yielded": 0}
    s.load_state_dict({"yielded": 0})
    assert list(s) == []
    with pytest.raises(ValueError, match="'yielded' is 1 in the state_dict but this sampler yields 0"):
        s.load_state_dict({"yielded": 1})


def test_a_negative_value_raises_value_error():
    s = make()
    with pytest.raises(ValueError, match=r"'yielded' must be a non-negative int \(got -1\)"):
        s.load_state_dict({"yielded": -1})


@pytest.mark.parametrize("state, exc, match", [
    ({}, ValueError, r"'yielded' is missing from the state_dict \(keys \[\]\)"),
    ({"samples_yielded": 3}, ValueError, r"'yielded' is missing .*'samples_yielded'"),
    ({"yielded": 3, "generator": None}, ValueError, r"unknown keys \['generator'\]"),
    ({"yielded": 1.5}, TypeError, r"'yielded' must be an int \(got float 1.5\)"),
    ({"yielded": "3"}, TypeError, r"'yielded' must be an int \(got str '3'\)"),
    ({"yielded": True}, TypeError, r"'yielded' must be an int \(got bool True\)"),
    ({"yielded": None}, TypeError, r"'yielded' must be an int \(got NoneType None\)"),
    ({"yielded": 9}, ValueError, r"'yielded' is 9 in the state_dict but this sampler yields 8 "
                                 r"indices per epoch \(len\(dataset\)=23, num_replicas=3"),
    (None, TypeError, r"state_dict must be a dict .*\(got NoneType\)"),
    ([("yielded", 3)], TypeError, r"state_dict must be a dict .*\(got list\)"),
])
def test_a_malformed_state_names_the_key_and_changes_nothing(state, exc, match):
    s = make()
    s.load_state_dict({"yielded": 4})
    with pytest.raises(exc, match=r"^StatefulDistributedSampler\.load_state_dict: " + match):
        s.load_state_dict(state)
    assert s.next_yielded == 4 and s.state_dict() == {"yielded": 4}


def test_a_numpy_int_is_stored_as_a_python_int():
    s = make()
    s.load_state_dict({"yielded": np.int64(3)})
    assert type(s.next_yielded) is int and json.dumps(s.state_dict()) == '{"yielded": 3}'


class _Both:
    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


class _OnlySave:
    def state_dict(self):
        return {}


class _OnlyLoad:
    def load_state_dict(self, state_dict):
        pass


@pytest.mark.parametrize("obj, want", [
    (make(), True),
    (_Both(), True),
    (torch.nn.Linear(1, 1), True),      # any object with both methods, as in torchdata
    (_OnlySave(), False),
    (_OnlyLoad(), False),
    (DistributedSampler(range(4), num_replicas=1, rank=0), False),
    (object(), False),
    ({"state_dict": 1}, False),
])
def test_stateful_protocol(obj, want):
    assert isinstance(obj, Stateful) is want


def test_pickle_keeps_the_order_and_the_position():
    s = make(seed=4)
    s.set_epoch(3)
    it = iter(s)
    head = [next(it) for _ in range(3)]
    copy = pickle.loads(pickle.dumps(s))
    assert (copy.yielded, copy.epoch, copy.seed, copy.next_yielded) == (3, 3, 4, None)
    copy.load_state_dict(copy.state_dict())
    assert head + list(copy) == torch_order(seed=4, epoch=3)
    s.load_state_dict({"yielded": 5})
    pending = pickle.loads(pickle.dumps(s))
    assert pending.next_yielded == 5 and list(pending) == torch_order(seed=4, epoch=3)[5:]


@pytest.mark.parametrize("batch_size, drop_last", [(2, False), (3, False), (3, True)])
def test_as_the_sampler_of_torchs_single_process_dataloader(batch_size, drop_last):
    """torch's single-process loader draws ``batch_size`` indices per batch, when the batch is made.

    So after ``k`` full batches the sampler has yielded ``k * batch_size`` indices: the state
    torchdata's ``StatefulDataLoader`` also records for a sampler it iterates lazily. (With worker
    processes torch draws indices ahead of the batches it has returned, so the live state is
    ahead too.) A new sampler loaded with that state continues with the next batch.
    """
    dataset = torch.arange(100, 125)
    order = torch_order(n=25, num_replicas=2, rank=0, seed=2)   # 13 indices per rank
    s = StatefulDistributedSampler(dataset, num_replicas=2, rank=0, seed=2)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=s, drop_last=drop_last, num_workers=0)
    batches = []
    for k, batch in enumerate(loader, start=1):
        batches.append(batch.tolist())
        assert s.state_dict() == {"yielded": min(k * batch_size, len(order))}  # a short last batch
        if k == 2:
            resumed = StatefulDistributedSampler(dataset, num_replicas=2, rank=0, seed=2)
            resumed.load_state_dict(s.state_dict())
            rest = [b.tolist() for b in DataLoader(dataset, batch_size=batch_size, sampler=resumed,
                                                   drop_last=drop_last)]
    want = [[100 + i for i in order[j:j + batch_size]] for j in range(0, len(order), batch_size)]
    if drop_last and len(want[-1]) < batch_size:
        want.pop()
    assert batches == want and rest == want[2:]
    assert s.state_dict() == {"yielded": len(order)}
