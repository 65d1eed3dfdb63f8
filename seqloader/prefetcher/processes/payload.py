"""A result in a slot: its layout, and values that write themselves (the protocol-5 pickling with
out-of-band buffers, :func:`~seqloader.prefetcher.wire.encode`, and :class:`~seqloader.prefetcher.wire.SlotWriter`
are the wire's, :mod:`seqloader.prefetcher.wire`, which Ray's actors use too).

A worker's result goes into its job's slot (:mod:`seqloader.prefetcher.processes.shm`) as a
:class:`~seqloader.prefetcher.processes.messages.Payload`; the parent unpickles it with arrays and tensors
as leased views of the slot (:func:`read_payload`). The layout of a slot holding a result::

    [ buffers a slot writer wrote in place ][ pickle bytes ][ the other out-of-band buffers ]
      0 ............................ data_offset .......... each at a 64-byte aligned offset

**Slot writers.** Most values are computed in ordinary memory and copied into the slot when they
are pickled (:func:`write_payload`). A value may instead be a :class:`SlotWriter`: the worker then
calls ``value.write_into_slot(reserve)`` *as part of computing the item* (its errors are the
item's errors), where ``reserve(sizes)`` grows the job's slot once and returns one writable
``memoryview`` per size, each a 64-byte aligned region of the slot. It returns the value to send,
whose arrays and tensors may view those regions; pickling that value does not copy a buffer that
already lies in a reserved region (:func:`encode_payload` compares addresses with the mapping's),
it only records its offset. So the bytes are written once, straight where the parent reads them.

The rule that keeps it safe: ``mmap.resize`` fails while any view of the mapping is exported. The
slot is grown by ``reserve`` before the first view exists, with room to spare for the pickle bytes
(:data:`HEADROOM`); the value (and every view) is dropped before the slot is grown again, which
only a value with more than that many bytes outside the regions needs (:meth:`Encoded.write`). A
writer must not keep a view past ``write_into_slot``: a view still alive at a resize is reported
as the item's error (``RuntimeError``), never written around.

**Who may return a writer.** Only the item the worker computes for its job, and only when asked
explicitly: a worker calls ``seq.slot_item(index)`` (:data:`SLOT_ITEM`) instead of ``seq[index]``
when the sequence has that method, and a writer may come back only from there. Code that runs
inside the item (a loader read inside a dataset, whose result is used there and never written
into a slot) indexes as usual and gets ordinary values: nothing global, no order of statements to
keep.
"""

from __future__ import annotations

import gc
import operator
import pickle
from typing import Any, Optional, Sequence

import numpy as np

from seqloader.prefetcher.processes.messages import Payload
# The wire (value pickling, slot writers) is shared with Ray: its names stay importable from here.
from seqloader.prefetcher.wire import SLOT_ITEM, SlotWriter, encode, is_plain_tensor, reduce_tensor

__all__ = ["HEADROOM", "SLOT_ITEM", "Encoded", "Reservation", "SlotWriter", "encode", "encode_payload",
           "is_plain_tensor", "read_and_release", "read_payload", "reduce_tensor", "write_payload"]

_ALIGN = 64
#: Bytes a :class:`Reservation` adds after the regions, for the pickle bytes and small buffers.
HEADROOM = 1 << 16


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _address(buf: Any) -> int:
    """The address of a contiguous buffer's first byte."""
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


# --------------------------------------------------------------------------- slot writers


def _grow(slots: Any, slot_id: int, nbytes: int) -> Any:
    """``slots.ensure(slot_id, nbytes)``; a view still exported blocks the resize: an error."""
    try:
        return slots.ensure(slot_id, nbytes)
    except BufferError:
        gc.collect()  # a view held only by a reference cycle
        try:
            return slots.ensure(slot_id, nbytes)
        except BufferError as exc:
            raise RuntimeError(f"prefetch: slot {slot_id} cannot grow to {nbytes} bytes while a view of it is "
                               "alive; a SlotWriter must not keep the views reserve() gave it") from exc


class Reservation:
    """The regions one job's :class:`SlotWriter` reserved in its slot (``reserve`` is its method).

    ``end`` is where the regions end (the pickle bytes start there), ``0`` until ``reserve``.
    """

    __slots__ = ("_slots", "_slot_id", "_base", "end")

    def __init__(self, slots: Any, slot_id: int):
        self._slots, self._slot_id = slots, slot_id
        self._base: Optional[int] = None
        self.end = 0

    def reserve(self, sizes: Sequence[int]) -> list[memoryview]:
        """One writable view per size, each at a 64-byte aligned offset of the slot, grown once.

        Raises:
            RuntimeError: called twice for one item.
            TypeError, ValueError: a size is not an int ``>= 0``.
        """
        if self._base is not None:
            raise RuntimeError("prefetch: reserve() was called twice for one item; reserve every region in one call")
        spans, end = [], 0
        for n in sizes:
            n = operator.index(n)
            if n < 0:
                raise ValueError(f"prefetch: reserve() needs sizes >= 0 (got {n})")
            spans.append((end, n))
            end = _align(end + n)
        whole = memoryview(_grow(self._slots, self._slot_id, end + HEADROOM))  # before any view exists
        self._base, self.end = _address(whole), end
        return [whole[o: o + n] for o, n in spans]

    def offset_of(self, raw: memoryview) -> Optional[int]:
        """The offset of ``raw`` in the slot if it lies inside the reserved regions, else ``None``."""
        if self._base is None or not raw.nbytes:
            return None
        off = _address(raw) - self._base
        return off if 0 <= off and off + raw.nbytes <= self.end else None


class Encoded:
    """A value pickled for a slot, not written yet: the pickle bytes and, per out-of-band buffer,
    either its offset in the slot (a writer put it there) or the buffer to copy. It holds no view
    of the slot, so :meth:`write` may grow it."""

    __slots__ = ("data", "placed", "start")

    def __init__(self, data: memoryview, placed: list, start: int):
        self.data, self.placed, self.start = data, placed, start

    def write(self, slots: Any, slot_id: int) -> Payload:
        """Write the pickle bytes (at ``start``) and the buffers to copy; return the :class:`Payload`."""
        data, start = self.data, self.start
        layout = []
        end = _align(start + len(data))
        for item in self.placed:
            if isinstance(item, tuple):
                layout.append(item)
            else:
                layout.append((end, item.nbytes))
                end = _align(end + item.nbytes)
        mm = _grow(slots, slot_id, end)
        mm[start: start + len(data)] = data
        for (off, n), item in zip(layout, self.placed):
            if not isinstance(item, tuple):
                mm[off: off + n] = item
        return Payload(slot_id, len(mm), len(data), tuple(layout), start)


def encode_payload(value: Any, reservation: Optional[Reservation] = None) -> Encoded:
    """Pickle ``value``; buffers inside ``reservation``'s regions are recorded, not copied.

    Raises:
        Exception: whatever pickling ``value`` raises.
    """
    data, raws = encode(value)
    if reservation is None or not reservation.end:
        return Encoded(data, raws, 0)
    placed = []
    for r in raws:
        off = reservation.offset_of(r)
        placed.append(r if off is None else (off, r.nbytes))
    return Encoded(data, placed, reservation.end)


def write_payload(value: Any, slots: Any, slot_id: int) -> Payload:
    """Pickle ``value`` into slot ``slot_id`` of ``slots`` (a ``WorkerSlots``, growing it if needed).

    Raises:
        Exception: whatever pickling ``value`` raises (the caller reports it as a failure).
    """
    return encode_payload(value).write(slots, slot_id)


# --------------------------------------------------------------------------- reading


def read_payload(payload: Payload, pool: Any) -> Any:
    """Unpickle a payload from the parent's mapping (``pool``: the ``SlotPool``); arrays and
    tensors are leased views."""
    mm = pool.mapping(payload.slot_id, payload.size)
    data = mm[payload.data_offset: payload.data_offset + payload.data_len]
    if not payload.buffers:
        return pickle.loads(data)
    lease = pool.lease(payload.slot_id)
    view = memoryview(lease).cast("B")
    return pickle.loads(data, buffers=[view[o: o + n] for o, n in payload.buffers])


def read_and_release(payload: Payload, pool: Any) -> Any:
    """:func:`read_payload`, then give the slot back unless the value leases it."""
    try:
        return read_payload(payload, pool)
    finally:
        pool.release(payload.slot_id)
