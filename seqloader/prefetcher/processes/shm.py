"""Shared-memory slots: the parent's pool and a worker's view of it (the result encoding is in
:mod:`seqloader.prefetcher.processes.payload`; its names are importable from here too).

A *slot* is one POSIX shared-memory segment (``/dev/shm/seqloader_<pid>_<random>``) that carries
one result at a time from one worker to the parent. Ownership is never by convention:

- The **parent** creates every segment (:class:`SlotPool`), sized sparsely with ``ftruncate`` (no
  page is touched, nothing is zeroed up front), and *unlinks its name as soon as the owning
  worker has mapped it* (the worker's first reply for that slot). From then on the segment has
  no name: it lives exactly as long as some process maps it, so a crash of any process cannot
  leave a file in ``/dev/shm``. Each process holds one descriptor per slot (the one inside its
  ``mmap``), which ``mmap.resize`` uses to remap a grown slot.
- Each slot belongs to **one worker** (the worker that maps it), which writes a result into it
  (:func:`~seqloader.prefetcher.processes.payload.write_payload`; the encoding, and values that write
  themselves into the slot, are in :mod:`seqloader.prefetcher.processes.payload`). A result larger than
  the slot grows it in place (``ftruncate`` by the worker, remap by the parent); there is no
  size to tune and no silent pickling fallback. Plain dense CPU tensors and numpy arrays are
  written as out-of-band buffers; other tensors (nested, sparse, quantized, subclasses, other
  devices) are pickled by torch's reduction into the same slot (:func:`is_plain_tensor`).
- The parent reads a result with :func:`~seqloader.prefetcher.processes.payload.read_payload`. Arrays and
  tensors in the result are *views* of the slot, kept alive by reference counting: every view
  holds a *lease* (a ctypes array over the slot's mapping) and the slot goes back to the pool
  only when the last view of that result is garbage. So a returned batch is never overwritten,
  however long it is kept; a user that holds many results simply makes the pool allocate more
  slots, and free slots beyond a small bound per worker are destroyed.
- A worker that dies and is replaced (``restarts``) has its slots *retired*
  (:meth:`SlotPool.retire`): no process can map them by name any more, so its free and busy
  slots are destroyed, its leased ones live on until their values die, and its replacement gets
  fresh slots.

Pages are faulted in once per slot (by the worker on its first write and by the parent on its
first read) and then reused, which is where the speed comes from: torch's DataLoader allocates
and faults a fresh shared segment for every batch.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import secrets
import threading
import weakref

import _posixshmem

# The result encoding lives in payload.py (the wire's pickling: wire.py); its names stay importable from here.
from seqloader.prefetcher.processes.payload import encode, is_plain_tensor, read_and_release, read_payload, write_payload
from seqloader.prefetcher.wire import SHM_PREFIX

__all__ = ["SHM_PREFIX", "SlotPool", "WorkerSlots", "encode", "is_plain_tensor", "read_and_release", "read_payload",
           "write_payload"]

_MIN_SIZE = 1 << 16
_RETIRED = -1  # the owner of a leased slot whose worker died (SlotPool.retire)


def _round_size(n: int) -> int:
    page = mmap.PAGESIZE
    return max(_MIN_SIZE, (n + page - 1) // page * page)


def create_segment(size: int) -> tuple[str, int]:
    """Create a new segment of ``size`` bytes (sparse); return ``(name, fd)``."""
    while True:
        name = f"/{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        try:
            fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            unlink_segment(name)
            raise
        return name, fd


def unlink_segment(name: str) -> None:
    """Remove a segment's name (idempotent); mappings stay valid until unmapped."""
    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- parent side


class _Slot:
    __slots__ = ("name", "mm", "worker", "state")

    def __init__(self, name: str, fd: int, size: int, worker: int):
        self.name, self.worker = name, worker
        self.state = "busy"  # "busy" (in a job or a result not yet read), "leased" or "free"
        self.mm = _map(fd, size)


def _map(fd: int, size: int) -> mmap.mmap:
    """Map ``fd`` and close it: the mmap keeps its own descriptor (one per slot, not two).

    A grown slot is remapped with ``mmap.resize`` (``ftruncate`` to the size the worker already
    set, then ``mremap``). Not ``MADV_DONTFORK``: a process forked later (a worker of another
    loader) may legitimately read a value the caller kept, so it must inherit the mapping.
    """
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class SlotPool:
    """The parent's segments: created on demand, reused, destroyed; one owner worker each.

    ``acquire(worker)`` returns a free slot of that worker (creating one when none is free);
    a slot returns to its worker's free list when its job's reply is handled without a lease,
    or when the last view of a leased result dies. At most ``keep`` free slots per worker are
    kept; the rest are destroyed and reported by ``take_forgotten`` so the parent can tell the
    worker to unmap them.
    """

    def __init__(self, num_workers: int, keep: int):
        self._keep = keep
        self._slots: dict[int, _Slot] = {}
        self._free: list[list[int]] = [[] for _ in range(num_workers)]
        self._released: collections.deque = collections.deque()  # filled by lease finalizers
        self._forgotten: list[list[int]] = [[] for _ in range(num_workers)]
        self._next_id = 0
        self._size = _MIN_SIZE  # the largest size seen: new slots start there
        self._closed = False

    def acquire(self, worker: int) -> tuple[int, str]:
        """A free slot id of ``worker`` and its name (for a :class:`Job`)."""
        self._collect()
        free = self._free[worker]
        if free:
            sid = free.pop()
            self._slots[sid].state = "busy"
        else:
            sid = self._next_id
            self._next_id += 1
            name, fd = create_segment(self._size)
            self._slots[sid] = _Slot(name, fd, self._size, worker)
        return sid, self._slots[sid].name

    def mapped_by_worker(self, slot_id: int) -> None:
        """The owner worker has replied for this slot, so it maps it: drop the name."""
        slot = self._slots.get(slot_id)
        if slot is not None and slot.name:
            unlink_segment(slot.name)
            slot.name = ""

    def mapping(self, slot_id: int, size: int) -> mmap.mmap:
        """The parent's mapping of a slot, remapped if a worker grew it to ``size``."""
        slot = self._slots[slot_id]
        if len(slot.mm) != size:
            slot.mm.resize(size)  # no lease can exist: the slot was in a job
            self._size = max(self._size, size)
        return slot.mm

    def lease(self, slot_id: int) -> ctypes.Array:
        """A buffer over the slot that gives the slot back when it (and every view) dies."""
        slot = self._slots[slot_id]
        slot.state = "leased"
        lease = (ctypes.c_ubyte * len(slot.mm)).from_buffer(slot.mm)
        fin = weakref.finalize(lease, self._released.append, slot_id)
        fin.atexit = False
        return lease

    def release(self, slot_id: int) -> None:
        """Give a busy (not leased) slot back to its worker's free list (a slot destroyed with its
        dead worker, see :meth:`retire`, is gone already)."""
        slot = self._slots.get(slot_id)
        if slot is not None and slot.state == "busy":
            self._put_back(slot_id)

    def retire(self, worker: int) -> None:
        """``worker`` died: destroy its free and busy slots (their names were unlinked after its
        first reply, so a replacement could not map them) and keep its leased ones valid until
        their values die, then destroy them too. The replacement gets fresh slots."""
        self._collect()
        for sid, slot in list(self._slots.items()):
            if slot.worker != worker:
                continue
            if slot.state == "leased":
                slot.worker = _RETIRED
            else:
                self._destroy(sid)
        self._free[worker], self._forgotten[worker] = [], []

    def _collect(self) -> None:
        while self._released:
            sid = self._released.popleft()
            if sid in self._slots and self._slots[sid].state == "leased":
                self._put_back(sid)

    def _put_back(self, sid: int) -> None:
        slot = self._slots[sid]
        slot.state = "free"
        w = slot.worker
        if w == _RETIRED:  # its worker died: no process maps it any more
            self._destroy(sid)
            return
        if len(self._free[w]) < self._keep:
            self._free[w].append(sid)
        else:
            self._destroy(sid)
            self._forgotten[w].append(sid)

    def take_forgotten(self, worker: int) -> tuple:
        """Slots destroyed since the last call that ``worker`` should unmap."""
        self._collect()
        out, self._forgotten[worker] = tuple(self._forgotten[worker]), []
        return out

    def _destroy(self, sid: int) -> None:
        slot = self._slots.pop(sid)
        if slot.name:
            unlink_segment(slot.name)
        try:
            slot.mm.close()
        except BufferError:  # a lease still exports it; the mapping dies with the lease
            pass

    def close(self) -> None:
        """Unlink every remaining name and close every descriptor (idempotent).

        Leased results stay valid: their mappings are released when they are garbage.
        """
        if self._closed:
            return
        self._closed = True
        for sid in list(self._slots):
            self._destroy(sid)
        self._released.clear()


# --------------------------------------------------------------------------- worker side


class WorkerSlots:
    """A worker's mappings of its slots, opened by name on first use and grown on demand.

    The table is behind a lock: with several threads in the worker, one thread maps the slot of
    a new job while others grow the slots of theirs (each job has its own slot, so a mapping is
    only ever grown by the one thread computing its job)."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple] = {}  # slot id -> (mmap, name)
        self._lock = threading.Lock()

    def open(self, slot_id: int, name: str) -> None:
        """Map ``slot_id`` if it is new (the parent unlinks the name after our reply)."""
        with self._lock:
            if slot_id in self._maps:
                return
        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
        mapped = (_map(fd, os.fstat(fd).st_size), name)
        with self._lock:
            self._maps[slot_id] = mapped

    def ensure(self, slot_id: int, nbytes: int) -> mmap.mmap:
        """The mapping of ``slot_id``, grown (``ftruncate`` + ``mremap``) to hold ``nbytes``."""
        with self._lock:
            mm = self._maps[slot_id][0]
        if len(mm) < nbytes:
            mm.resize(_round_size(max(nbytes, 2 * len(mm))))
        return mm

    def forget(self, slot_ids) -> None:
        """Unmap slots the parent destroyed (free ones: no job of this worker uses them)."""
        with self._lock:
            entries = [self._maps.pop(sid, None) for sid in slot_ids]
        for entry in entries:
            if entry is not None:
                entry[0].close()

    def close(self, unlink: bool) -> None:
        """Unmap everything; with ``unlink`` (the parent died) also remove any name left.

        The worker is exiting: with several threads, one may still be inside a job, writing into
        its slot through a view (``Runner.stop`` never waits for a running job). That mapping
        cannot be closed (``BufferError``) and is left to the process's exit, which unmaps it.
        """
        with self._lock:
            entries, self._maps = list(self._maps.values()), {}
        for mm, name in entries:
            if unlink:
                unlink_segment(name)
            try:
                mm.close()
            except BufferError:  # exported to a running job's view; unmapped when the process exits
                pass
