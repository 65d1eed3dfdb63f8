"""The arrays columnar batches are gathered into (``seqloader/sources/_batch_buffers.py``): reused
only once nothing refers to them, whatever refers to them (a view, a tensor, a row)."""

from __future__ import annotations

import threading

import numpy as np
import torch

from seqloader.sources._batch_buffers import BatchBuffers

I32 = np.dtype(np.int32)


def address(a):
    return a.__array_interface__["data"][0]


def test_an_array_is_reused_once_released():
    pool = BatchBuffers()
    a = pool.empty((4, 3), I32)
    where = address(a)
    del a
    assert address(pool.empty((4, 3), I32)) == where


def test_an_array_still_referred_to_is_never_handed_out():
    pool = BatchBuffers()
    held = []
    for keep in (lambda a: a, lambda a: a[1], lambda a: torch.from_numpy(a), lambda a: a.reshape(-1),
                 lambda a: memoryview(a)):
        a = pool.empty((4, 3), I32)
        a[:] = len(held)
        held.append(keep(a))
        del a
    for k, h in enumerate(held):
        assert (np.asarray(h) == k).all()
    assert len({address(np.asarray(h)) for h in held}) == len(held)   # five arrays, none shared


def test_shapes_and_dtypes_have_their_own_arrays():
    pool = BatchBuffers()
    a = pool.empty((4, 3), I32)
    where = address(a)
    del a
    b = pool.empty((4, 3), np.dtype(np.int64))
    c = pool.empty((2, 3), I32)
    assert b.dtype == np.int64 and c.shape == (2, 3)
    assert address(pool.empty((4, 3), I32)) == where


def test_the_pool_is_bounded_and_allocates_past_it():
    pool = BatchBuffers(most_bytes=0)   # (at least 4 pooled)
    kept = [pool.empty((2,), I32) for _ in range(10)]
    assert len({address(a) for a in kept}) == 10
    assert len(pool._pools[((2,), I32)]) == 4


def test_threads_never_get_the_same_array():
    pool = BatchBuffers()
    errors = []

    def work(k):
        for _ in range(300):
            a = pool.empty((8, 8), I32)
            a[:] = k
            if not (a == k).all():
                errors.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
