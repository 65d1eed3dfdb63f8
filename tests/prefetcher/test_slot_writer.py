"""Slot writers (``seqloader.prefetcher.processes.payload``): values that write their buffers into the job's slot.

The protocol is L2's and neutral: these tests use writers of their own (numpy and torch buffers),
in-process through ``Reservation``/``encode_payload`` and through real workers.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from seqloader import prefetch, smap
from seqloader.prefetcher.processes.payload import (HEADROOM, Reservation, SlotWriter, encode_payload,
                                                    read_and_release)
from seqloader.prefetcher.processes.shm import SlotPool, WorkerSlots


class Ramp(SlotWriter):
    """Writes ``arange(n) + i`` (float64) and ``full(m, i)`` (uint8) into two reserved regions and
    returns them with ``extra`` bytes of pickled data outside the regions."""

    __slots__ = ("i", "n", "m", "extra")

    def __init__(self, i, n=1000, m=10, extra=0):
        self.i, self.n, self.m, self.extra = i, n, m, extra

    def write_into_slot(self, reserve):
        a, b = reserve([self.n * 8, self.m])
        x = torch.frombuffer(a, dtype=torch.uint8).view(torch.float64)
        x.copy_(torch.arange(self.n, dtype=torch.float64) + self.i)
        y = np.frombuffer(b, dtype=np.uint8)
        y[:] = self.i % 256
        return {"x": x, "y": y, "pad": b"z" * self.extra, "label": torch.tensor([self.i])}


def check_ramp(value, i, n=1000, m=10, extra=0):
    assert torch.equal(value["x"], torch.arange(n, dtype=torch.float64) + i)
    assert value["y"].dtype == np.uint8 and value["y"].tolist() == [i % 256] * m
    assert value["pad"] == b"z" * extra and value["label"].tolist() == [i]


class Writers:
    """Item ``i`` is ``Ramp(i, **kwargs)``."""

    def __init__(self, items=8, **kwargs):
        self.items, self.kwargs = items, kwargs

    def __len__(self):
        return self.items

    def __getitem__(self, i):
        return Ramp(i, **self.kwargs)


@pytest.fixture
def slot():
    pool, slots = SlotPool(num_workers=1, keep=2), WorkerSlots()
    sid, name = pool.acquire(0)
    slots.open(sid, name)
    yield pool, slots, sid
    gc.collect()
    slots.close(unlink=False)
    pool.close()


def write_in_process(writer, slots, sid):
    """What a worker does with a writer (worker._evaluate, then Encoded.write)."""
    reservation = Reservation(slots, sid)
    value = writer.write_into_slot(reservation.reserve)
    encoded = encode_payload(value, reservation)
    del value
    return encoded.write(slots, sid)


def test_written_buffers_are_not_copied_and_the_pickle_bytes_follow_them(slot):
    pool, slots, sid = slot
    payload = write_in_process(Ramp(3), slots, sid)
    assert payload.data_offset == 8064  # the two regions: 8000 bytes, aligned, then 10 bytes, aligned
    in_place = [(o, n) for o, n in payload.buffers if o < payload.data_offset]
    assert in_place == [(0, 8000), (8000, 10)]  # recorded where the writer put them, not copied
    assert all(o >= payload.data_offset + payload.data_len for o, _ in payload.buffers if (o, _) not in in_place)
    check_ramp(read_and_release(payload, pool), 3)


def test_a_value_larger_than_the_headroom_grows_the_slot_after_the_views_died(slot):
    pool, slots, sid = slot
    payload = write_in_process(Ramp(5, extra=4 * HEADROOM), slots, sid)
    assert payload.size > 4 * HEADROOM
    check_ramp(read_and_release(payload, pool), 5, extra=4 * HEADROOM)


def test_reserve_is_called_once_with_sizes_of_zero_or_more(slot):
    _, slots, sid = slot
    r = Reservation(slots, sid)
    assert [v.nbytes for v in r.reserve([0, 5, 0])] == [0, 5, 0] and r.end == 64
    with pytest.raises(RuntimeError, match="reserve\\(\\) was called twice"):
        r.reserve([1])
    with pytest.raises(ValueError, match="sizes >= 0"):
        Reservation(slots, sid).reserve([-1])


def test_workers_write_writers_and_every_value_held_stays_valid():
    with prefetch(Writers(12), num_workers=2) as p:
        held = list(p)  # every value still references its slot: none may be reused under it
        again = list(p)
    for i, (a, b) in enumerate(zip(held, again)):
        check_ramp(a, i)
        check_ramp(b, i)


def test_a_large_writer_value_through_workers():
    with prefetch(Writers(4, n=300_000, extra=3 * HEADROOM), num_workers=2) as p:
        for i, v in enumerate(p):
            check_ramp(v, i, n=300_000, extra=3 * HEADROOM)


class Failing(SlotWriter):
    __slots__ = ()

    def write_into_slot(self, reserve):
        views = reserve([1 << 20])
        views[0][:4] = b"abcd"
        raise KeyError("the writer failed")


class Kept(SlotWriter):
    """A faulty writer: it keeps a view of the slot, and its value needs the slot to grow."""

    kept: list = []

    def write_into_slot(self, reserve):
        Kept.kept.append(reserve([16])[0])
        return b"z" * (2 * HEADROOM)


class Mixed:
    """Item 1 is ``Failing()``, item 2 ``Kept()``, the others ``Ramp(i)``."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {1: Failing(), 2: Kept()}.get(i, Ramp(i))


def test_errors_of_a_writer_are_the_items_errors_and_the_workers_go_on():
    with prefetch(Mixed(), num_workers=1) as p:
        check_ramp(p[0], 0)
        with pytest.raises(KeyError, match="the writer failed") as info:
            p[1]
        assert "raised while computing item 1" in info.value.__notes__[0]
        with pytest.raises(RuntimeError, match="a SlotWriter must not keep the views reserve\\(\\) gave it"):
            p[2]
        check_ramp(p[3], 3)


class AsksForSlot:
    """``slot_item(i)`` says it was asked for the slot; ``seq[i]`` says it was not, and reads
    ``inner`` (code run inside the item: a nested reader) by indexing."""

    def __init__(self, inner=None):
        self.inner = inner

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return ("indexed", None if self.inner is None else self.inner[i])

    def slot_item(self, i):
        return ("slot", None if self.inner is None else self.inner[i])


def test_only_the_job_itself_is_asked_for_its_slot_and_only_by_worker_processes():
    with prefetch(AsksForSlot(AsksForSlot()), num_workers=1) as p:
        assert list(p) == [("slot", ("indexed", None))] * 3  # what runs inside the item indexes as usual
    with prefetch(AsksForSlot(), num_workers=2, threads_per_worker=2) as p:
        assert list(p) == [("slot", None)] * 3  # threads inside a worker process: each job its own slot
    with prefetch(AsksForSlot(), num_workers=2, method="thread") as p:
        assert list(p) == [("indexed", None)] * 3  # no slot: threads hand values over by reference
    assert AsksForSlot()[0] == ("indexed", None)


# --------------------------------------------------------------------------- the worker's heap (heap.py)


def fresh_buffers(i):
    """Build two 20 MB buffers and free them, 12 times; the minor page faults of the last 10."""
    import resource

    def cycle():
        a, b = np.ones(20 << 20, np.uint8), np.ones(20 << 20, np.uint8)
        del a, b

    cycle()
    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        cycle()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_workers_keep_large_freed_buffers_for_reuse():
    # Without keep_large_buffers() glibc's dynamic trim threshold (2 x 20 MB) gives freed heap back
    # to the kernel, to be faulted in again: about 10,000 faults in these 10 cycles here, against
    # fewer than 10 with it. (A count of page faults, not a timing.)
    with prefetch(smap(fresh_buffers, range(1)), num_workers=1) as p:
        assert p[0] < 1000


def test_the_users_malloc_settings_win(monkeypatch):
    from seqloader.prefetcher.processes.heap import keep_large_buffers

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert keep_large_buffers() is False
