"""The datasets of the executor contract (``test_executors.py``), in a module of their own: worker
processes under ``spawn`` and Ray actors import the module an item's class comes from.

Each dataset is a small, seeded or deterministic pipeline whose batches must not depend on what
computes them, or an item that misbehaves in one precise way at one index."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from resumable_stream import Stream

#: how long an item that waits for the test to release it waits at most (seconds)
RELEASE_BOUND = 120.0


class GlobalDraws(Dataset):
    """Draws from the global generators (torch, numpy, random) in ``__getitem__``: seeded per
    batch by the loader under worker processes and at ``num_workers=0``."""

    def __init__(self, n=24):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import random

        return torch.tensor([float(i), float(torch.rand(())), float(np.random.rand()), random.random()])


class ThreadSafeDraws(Dataset):
    """Draws through ``torch.thread_safe_generator()``: the advice that works on every executor."""

    def __init__(self, n=24):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.thread_safe_generator()
        return torch.tensor([float(i), float(torch.rand((), generator=g))])


class InitialSeed(Dataset):
    """The idiom of docs/determinism.md: a generator of its own seeded from ``torch.initial_seed()``."""

    def __init__(self, n=32):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, int(np.random.default_rng(torch.initial_seed() % 2**32).integers(1 << 30))])


class WorkerInfoItems(Dataset):
    """Each item says which worker computed it and what ``get_worker_info()`` said there."""

    def __init__(self, n=16):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        if info is None:
            return torch.tensor([i, -1, -1, -1])
        return torch.tensor([i, info.id, info.num_workers, int(info.dataset is not None)])


class RaisesAt(Dataset):
    """``__getitem__(at)`` raises ``error`` (an exception instance, ``BaseException`` included);
    ``"exit"`` calls ``os._exit(9)`` (the worker dies)."""

    def __init__(self, at, error, n=64):
        self.at, self.error, self.n = at, error, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            if self.error == "exit":
                os._exit(9)
            if self.error == "sys.exit":
                sys.exit(3)
            # a fresh exception each time: a raised instance kept in the dataset would hold the
            # traceback, hence the reader's frames, for as long as the dataset lives
            raise type(self.error)(*self.error.args)
        return i


class WaitsAt(Dataset):
    """``__getitem__(at)`` waits until the file ``release`` exists (at most :data:`RELEASE_BOUND`
    seconds): an item that takes longer than any timeout, ended by the test."""

    def __init__(self, at, release, n=16):
        self.at, self.release, self.n = at, str(release), n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            deadline = time.monotonic() + RELEASE_BOUND
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.02)
        return i


class Strided(IterableDataset):
    """torch's idiom: worker ``w`` of ``k`` yields ``w, w + k, ...`` below ``n`` (a generator)."""

    def __init__(self, n=16):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        yield from range(w, self.n, k)


def strided_iterator(n=16):
    """The same stream from an iterator class (``__next__``, which threads could interleave),
    resumable (torchdata's protocol): ``tests/resumable_stream.py``."""
    return Stream(n)


class Warns(Dataset):
    """Item 5 shows a ``UserWarning``: it must reach the training process."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            import warnings

            warnings.warn(f"item {i} says so", UserWarning)
        return i


class DrawingStream(IterableDataset):
    """An iterator class whose state is in the object (read by whichever thread calls ``next``),
    drawing through ``torch.thread_safe_generator()``; resumable (torchdata's protocol)."""

    def __iter__(self):
        info = get_worker_info()
        self.i, self.n = (0, 1) if info is None else (info.id, info.num_workers)
        return self

    def __next__(self):
        if self.i >= 24:
            raise StopIteration
        value, self.i = self.i, self.i + self.n
        return torch.tensor([value, int(torch.randint(0, 10**6, (), generator=torch.thread_safe_generator()))])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, sd):
        self.i = sd["i"]


def seed_numpy_with_worker_id(worker_id):
    """torch's ``worker_init_fn`` idiom."""
    np.random.seed(worker_id)


def record_worker_id(worker_id):
    """A ``worker_init_fn`` that leaves a mark ``get_worker_info()`` can be compared with."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id, (info, worker_id)
