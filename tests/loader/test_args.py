"""Argument errors: torch validates, so the exception types and messages are torch's."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import IterableDataset, SequentialSampler

from seqloader import DataLoader


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


DATA = list(range(10))

BAD = {
    "shuffle_with_sampler": dict(dataset=DATA, shuffle=True, sampler=SequentialSampler(DATA)),
    "batch_sampler_with_batch_size": dict(dataset=DATA, batch_sampler=[[0, 1]], batch_size=2),
    "batch_sampler_with_shuffle": dict(dataset=DATA, batch_sampler=[[0, 1]], shuffle=True),
    "batch_sampler_with_sampler": dict(dataset=DATA, batch_sampler=[[0, 1]], sampler=SequentialSampler(DATA)),
    "batch_sampler_with_drop_last": dict(dataset=DATA, batch_sampler=[[0, 1]], drop_last=True),
    "batch_size_none_with_drop_last": dict(dataset=DATA, batch_size=None, drop_last=True),
    "negative_num_workers": dict(dataset=DATA, num_workers=-1),
    "negative_timeout": dict(dataset=DATA, timeout=-1),
    "prefetch_factor_without_workers": dict(dataset=DATA, prefetch_factor=2),
    "negative_prefetch_factor": dict(dataset=DATA, num_workers=1, prefetch_factor=-1),
    "persistent_without_workers": dict(dataset=DATA, persistent_workers=True),
    "mp_context_without_workers": dict(dataset=DATA, multiprocessing_context="spawn"),
    "bad_mp_context_name": dict(dataset=DATA, num_workers=1, multiprocessing_context="nope"),
    "bad_mp_context_type": dict(dataset=DATA, num_workers=1, multiprocessing_context=3),
    "iterable_with_shuffle": dict(dataset=Stream(), shuffle=True),
    "iterable_with_sampler": dict(dataset=Stream(), sampler=SequentialSampler(DATA)),
    "iterable_with_batch_sampler": dict(dataset=Stream(), batch_sampler=[[0]]),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_same_exception_as_torch(name):
    kwargs = BAD[name]
    with pytest.raises(Exception) as ref:
        torch.utils.data.DataLoader(**kwargs)
    with pytest.raises(ref.type, match=re.escape(str(ref.value)[:40])):
        DataLoader(**kwargs, seed=0)


def test_attributes_cannot_be_reassigned_like_torch():
    loader = DataLoader(DATA, seed=0)
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        loader.batch_size = 3


@pytest.mark.parametrize("seed, exc, match", [
    (-1, ValueError, "seed must be a non-negative int"),
    (2**64, ValueError, "seed must be < 2\\*\\*64"),
    (1.5, TypeError, "seed must be an int"),
    (True, TypeError, "seed must be an int"),
])
def test_bad_seed(seed, exc, match):
    with pytest.raises(exc, match=match):
        DataLoader(DATA, seed=seed)


def test_timeout_without_workers_is_rejected_when_iterating():
    loader = DataLoader(DATA, timeout=1, seed=0)
    with pytest.raises(ValueError, match="timeout=1 needs num_workers > 0"):
        iter(loader)
