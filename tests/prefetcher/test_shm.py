"""Shared-memory slots: encoding, growth, leases, the pool bound, and names in ``/dev/shm``."""

from __future__ import annotations

import functools
import gc
import os
import time

import numpy as np
import pytest
import torch

import seqloader as sl
from seqloader import prefetch
from seqloader.prefetcher.processes.payload import SlotWriter
from seqloader.prefetcher.processes.shm import SHM_PREFIX, SlotPool, WorkerSlots, read_and_release, write_payload


def full_1000(i):
    return np.full(1000, i)


def sized(n):
    return np.full(n, n % 251, dtype=np.uint8)


def _names():
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"{SHM_PREFIX}{os.getpid()}_")}


@pytest.fixture
def pool():
    p = SlotPool(num_workers=1, keep=2)
    w = WorkerSlots()
    yield p, w
    w.close(unlink=False)
    p.close()


def _job(pool):
    p, w = pool
    sid, name = p.acquire(0)
    w.open(sid, name)
    return sid


def test_round_trip_keeps_values_and_dtypes(pool):
    p, w = pool
    value = {"a": np.arange(10, dtype=np.int16), "t": torch.arange(6, dtype=torch.float64).reshape(2, 3),
             "b": torch.zeros(3, dtype=torch.bfloat16), "s": "text", "n": [1, (2, None)]}
    sid = _job(pool)
    got = read_and_release(write_payload(value, w, sid), p)
    np.testing.assert_array_equal(got["a"], value["a"])
    assert got["a"].dtype == np.int16 and got["t"].dtype == torch.float64
    assert torch.equal(got["t"], value["t"]) and got["b"].dtype == torch.bfloat16
    assert got["s"] == "text" and got["n"] == [1, (2, None)]


def test_arrays_travel_out_of_band_and_small_things_in_band(pool):
    p, w = pool
    sid = _job(pool)
    payload = write_payload((np.zeros(1000), torch.ones(10), 7), w, sid)
    assert len(payload.buffers) == 2 and payload.data_len < 400
    assert all(off % 64 == 0 for off, _ in payload.buffers)
    read_and_release(payload, p)


def test_a_result_larger_than_its_slot_grows_the_slot(pool):
    p, w = pool
    sid = _job(pool)
    small = write_payload(np.zeros(10), w, sid)
    read_and_release(small, p)
    sid2 = _job(pool)
    assert sid2 == sid  # reused
    big = np.arange(3_000_000, dtype=np.int64)  # 24 MB > the initial size
    payload = write_payload(big, w, sid2)
    assert payload.size > small.size
    np.testing.assert_array_equal(read_and_release(payload, p), big)
    sid3, _ = p.acquire(0)
    p.release(sid3)
    assert sid3 == sid  # new slots start at the largest size seen, the grown one is kept


def test_a_leased_slot_is_not_reused_until_every_view_is_gone(pool):
    p, w = pool
    sid = _job(pool)
    value = read_and_release(write_payload(torch.arange(100), w, sid), p)
    view = value[10:20]
    del value
    gc.collect()
    other, _ = p.acquire(0)
    assert other != sid
    p.release(other)
    del view
    gc.collect()
    again = _job(pool)
    assert again in (sid, other)
    assert p.acquire(0)[0] in (sid, other)


def test_free_slots_beyond_the_bound_are_destroyed_and_forgotten(pool):
    p, w = pool
    sids = [_job(pool) for _ in range(4)]
    for sid in sids:
        p.mapped_by_worker(sid)
        p.release(sid)
    forgotten = p.take_forgotten(0)
    assert len(forgotten) == 2 and set(forgotten) <= set(sids)
    w.forget(forgotten)


def test_names_are_unlinked_once_the_worker_has_mapped_them(pool):
    p, w = pool
    before = _names()
    sid = _job(pool)
    assert len(_names() - before) == 1
    p.mapped_by_worker(sid)
    assert _names() == before
    value = np.arange(5)
    np.testing.assert_array_equal(read_and_release(write_payload(value, w, sid), p), value)


def test_a_worker_closing_while_a_job_holds_a_view_of_its_slot_is_quiet(pool):
    """At a worker's exit a runner thread may still be writing its slot through a view: that
    mapping is left to the process's exit instead of raising ``BufferError``."""
    p, w = pool
    sid = _job(pool)
    view = memoryview(w.ensure(sid, 100))
    w.close(unlink=False)  # BufferError: cannot close exported pointers exist, before
    view[:3] = b"abc"  # still mapped
    view.release()


class HoldsItsSlot(SlotWriter):
    """Item 1 writes into its slot and keeps the view for a while (a job still running when the
    worker is stopped), after creating ``marker``; the others are plain."""

    def __init__(self, i, marker):
        self.i, self.marker = i, marker

    def write_into_slot(self, reserve):
        (region,) = reserve([64])
        region[:1] = bytes([self.i])
        if self.i == 1:
            open(self.marker, "w").close()
            time.sleep(5)  # the worker is stopped meanwhile and exits while this view is exported
        return bytes(region[:1])


def hold_slot(marker, i):
    return HoldsItsSlot(i, marker)


def test_dropping_a_reader_while_a_thread_of_a_worker_writes_its_slot_prints_nothing(tmp_path, capfd):
    marker = str(tmp_path / "writing")
    seq = sl.smap(functools.partial(hold_slot, marker), range(8))
    p = prefetch(seq, num_workers=1, threads_per_worker=2, prefetch_factor=1)
    assert p[0] == bytes([0])
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert time.monotonic() < deadline, "item 1 never started"
        time.sleep(0.01)
    p.close()
    err = capfd.readouterr().err
    assert "BufferError" not in err and "Traceback" not in err, err


def test_a_running_prefetch_keeps_no_names_in_dev_shm():
    with prefetch(sl.smap(full_1000, range(30)), num_workers=2) as p:
        kept = [p[i] for i in range(10)]
        assert len(_names()) <= 4  # only slots whose first job is still in flight
        rest = list(p[10:])
        assert _names() == set()  # every reply is in: every slot is mapped by its worker
    assert _names() == set()
    assert [int(r[0]) for r in rest] == list(range(10, 30))
    assert [int(k[0]) for k in kept] == list(range(10))


def test_growing_results_in_a_prefetch():
    sizes = [10, 100_000, 10, 3_000_000, 50, 2_000_000]
    with prefetch(sl.smap(sized, sizes), num_workers=2) as p:
        for n, got in zip(sizes, p):
            assert got.shape == (n,) and got[-1] == n % 251


def test_each_kept_result_costs_one_descriptor_in_the_reader():
    def fds():
        return len(os.listdir("/proc/self/fd"))

    with prefetch(sl.smap(full_1000, range(200)), num_workers=2) as p:
        p[0]
        before = fds()
        kept = list(p[1:])
        assert fds() - before <= len(kept) + 8
    assert len(kept) == 199
