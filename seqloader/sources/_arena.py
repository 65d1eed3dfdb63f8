"""A process's decoded blocks: a bounded, least-recently-used arena that decodes each block once.

A columnar source (:mod:`seqloader.sources._table`) decodes whole blocks (Parquet row groups,
Arrow record batches) and slices batches out of them. Under thread workers
(``DataLoader(worker_method="thread")``, or ``threads_per_worker``) several threads of one
process read the same source at once, so the arena is shared by them and follows these rules:

* **Single flight.** A block is decoded once even when several threads need it at the same
  time: the first thread to ask decodes it; the others wait for that decode (at most
  :data:`WAIT_TIMEOUT` seconds, then ``TimeoutError`` naming the block) and take its result.
  An error raised by the decode is raised in the decoding thread and in every thread waiting
  for it (the same exception object, as ``concurrent.futures.Future.result`` does); the block
  is not remembered as failed, so a later read tries again.
* **No lock held while decoding.** The lock guards only the bookkeeping (which blocks are
  kept, which are being decoded, pins, slots, the counters), so different blocks decode in
  parallel on different threads (pyarrow releases the GIL while it decodes).
* **No deadlock.** A thread first decodes every block it claimed, and only then waits for the
  blocks that other threads claimed: a thread that others wait for never waits itself.
* **Ahead of need.** :meth:`Arena.ahead` claims blocks a reader will need soon (the loader
  knows them from its order: :mod:`seqloader.loader.epoch.read_ahead`) and decodes them on
  background threads of the process, which end when none is left, so that no batch waits for a
  whole window's decode. A claimed block whose decode has not begun is decoded by the first
  reader that needs it (never waited for); one being decoded is waited for as above, after the
  waiting reader has decoded the claims still queued, oldest first (:meth:`Arena._help`: a
  wait at a window's start becomes the next blocks' decode). A claim only takes a free slot or
  one of an unpinned block that has been read: a block decoded ahead and not read yet is needed
  sooner than one read already, so it is never evicted for another claim ahead (with two lanes,
  a lane's look at its window after next came while the other lane's next window, decoded
  ahead, was not read yet, and least recently used evicted that window: issue 43 measured 39 of
  144 row groups decoded twice an epoch).
* **Pins.** :meth:`Arena.pinned` hands out the blocks pinned: a pinned block is never evicted
  and its *slot* never reused until the ``with`` block ends, so a batch may read views of it.
* **Slots.** Each block is given one of ``capacity`` slot numbers when it is claimed (a free
  one, or the slot of the least recently used unpinned block, which is then evicted), or
  ``None`` when every slot is pinned or being filled. The decode may store the block at its
  slot (the columnar source copies its columns into one buffer per column, so a batch spanning
  several blocks is one ``take``); a slot is reused only once its block has left the arena.

The arena keeps at most ``capacity`` blocks, the ones used last (more only while pinned).
Counters (blocks decoded, their bytes, blocks waited for, items read) are updated under the
same lock.

**Too small an arena** decodes the same blocks again and again (readers that use more blocks at
once than it keeps: a block shuffle's window per worker process, one per thread under thread
workers): the epoch is still exact but can be tens of times slower. ``seqloader.DataLoader``
sizes the arenas of sources built with the default ``cache_blocks=None``
(:mod:`seqloader.loader.epoch.block_caches`); an explicit ``cache_blocks`` is kept as given. A block decoded again soon
after it was evicted (fewer than ``capacity`` other decodes in between) is counted
(``blocks_decoded_again``); when more than half of the last ``4 * capacity`` decodes were such,
the arena warns once (:class:`ArenaTooSmall`, a ``RuntimeWarning``) with the fix.
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

from seqloader.errors import check_positive_int
from seqloader.threads.burst import Burst

__all__ = ["Arena", "ArenaTooSmall", "WAIT_TIMEOUT"]

V = TypeVar("V")

#: The longest a thread waits for another thread's decode of a block it needs, in seconds.
WAIT_TIMEOUT = 600.0



class ArenaTooSmall(RuntimeWarning):
    """A source's ``cache_blocks`` is smaller than what its readers use at once: blocks are decoded again."""


#: ``decode(blocks, slots) -> [(value, nbytes), ...]``: one pair per block, in order.
Decode = Callable[[list[int], list[Optional[int]]], Sequence[tuple[V, int]]]


class _Entry:
    """A block being decoded (``done`` not set) or kept (``done`` set, ``value`` filled in)."""

    __slots__ = ("done", "value", "error", "slot", "pins", "started", "decode", "read")

    def __init__(self, slot: Optional[int], started: bool = True, decode: Optional[Decode[Any]] = None) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None
        self.slot = slot
        self.pins = 0
        self.started = started   # a thread is decoding it (False: claimed ahead, not begun yet)
        self.decode = decode     # a claim ahead's decode (whoever begins it calls it)
        self.read = decode is None   # a reader has pinned it (a claim ahead: not yet)


class Arena(Generic[V]):
    """Decoded blocks of one process, at most ``capacity`` kept (see the module docstring).

    Args:
        capacity: blocks kept (and slots), ``>= 1``.
        op: the source's name, for messages.
        counters: the counters to start from (those of the arena this one replaces), else zeros.

    Example:
        >>> arena = Arena(2, "demo")
        >>> decode = lambda blocks, slots: [((b, s), 10) for b, s in zip(blocks, slots)]
        >>> with arena.pinned([0, 1], decode, str) as got:
        ...     got                                        # (block, slot)
        {0: (0, 0), 1: (1, 1)}
        >>> with arena.pinned([2], decode, str) as got:    # block 0, used least recently, gives its slot
        ...     got, arena.kept()
        ({2: (2, 0)}, [1, 2])
        >>> arena.counters()["blocks_decoded"], arena.counters()["bytes_decoded"]
        (3, 30)
        >>> with arena.pinned([5], lambda blocks, slots: [], str):
        ...     pass
        Traceback (most recent call last):
        RuntimeError: demo: the decode of blocks [5] returned 0 results
    """

    def __init__(self, capacity: int, op: str = "arena", counters: Optional[dict[str, int]] = None):
        self.capacity = check_positive_int(op, "cache_blocks", capacity)
        self._op = op
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}                                # decoding or kept
        self._kept: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # LRU of kept
        self._free = list(range(capacity - 1, -1, -1))                      # free slots (pop: lowest)
        self._counters = {"blocks_decoded": 0, "bytes_decoded": 0, "blocks_waited": 0, "items_read": 0,
                          "blocks_decoded_again": 0}
        self._counters.update(counters or {})   # (a grown arena goes on counting where the last stopped)
        self._claims = 0                                                     # blocks claimed for decoding
        self._evicted: collections.OrderedDict[int, int] = collections.OrderedDict()  # block -> claims then
        self._recent: collections.deque[bool] = collections.deque(maxlen=4 * self.capacity)  # was a claim "again"?
        self._warned = False
        self._burst: Optional[Burst] = None   # the threads decoding ahead (made on first use)

    def counters(self) -> dict[str, int]:
        """A copy of the counters: ``blocks_decoded``, ``bytes_decoded``, ``blocks_waited`` (blocks
        a thread took from another thread's decode), ``items_read``, ``blocks_decoded_again``
        (decoded again soon after they were evicted: see the module docstring)."""
        with self._lock:
            return dict(self._counters)

    def kept(self) -> list[int]:
        """The blocks kept, least recently used first."""
        with self._lock:
            return list(self._kept)

    def pinned(self, blocks: Sequence[int], decode: Decode[V], describe: Callable[[int], str],
               items: int = 0) -> "_Pinned[V]":
        """``with arena.pinned(blocks, decode, describe) as values:`` the decoded value of each of
        ``blocks`` (distinct ints), pinned until the ``with`` block ends; the blocks neither kept
        nor being decoded by another thread are decoded here.

        Args:
            blocks: the blocks wanted.
            decode: ``decode(missing, slots) -> [(value, nbytes), ...]``, one pair per block of
                ``missing`` in order (``slots[i]``: the slot of ``missing[i]``, or ``None``);
                called without the lock held, at most once per call.
            describe: ``describe(block)`` names a block in a message (``"row group 3 of a.parquet"``).
            items: added to the ``items_read`` counter (under the same lock).

        Raises:
            TimeoutError: another thread's decode of a block did not finish within
                :data:`WAIT_TIMEOUT` seconds.
            Exception: whatever ``decode`` raised, here or in the thread that decoded a block
                this call waited for.
        """
        return _Pinned(self, blocks, decode, describe, items)

    def _pin(self, blocks: Sequence[int], decode: Decode[V], describe: Callable[[int], str],
             items: int) -> tuple[dict[int, V], list[_Entry]]:
        """The values of ``blocks`` and the entries pinned for them (unpinned again if this raises)."""
        out: dict[int, V] = {}
        held: list[_Entry] = []      # entries this call pinned
        mine: list[tuple[int, _Entry]] = []
        theirs: list[tuple[int, _Entry]] = []
        thrashed = None              # a block decoded again right after its eviction, when that is the rule
        with self._lock:
            missing = []
            for b in blocks:   # first pin what is there, so that claiming a slot cannot evict it
                entry = self._entries.get(b)
                if entry is None:
                    missing.append(b)
                    continue
                if entry.done.is_set():
                    self._kept.move_to_end(b)
                    out[b] = entry.value  # type: ignore[assignment]  # a kept entry holds its value
                elif not entry.started:   # claimed ahead and not begun: decoded here, not waited for
                    entry.started = True
                    mine.append((b, entry))
                else:
                    theirs.append((b, entry))
                entry.pins += 1
                entry.read = True
                held.append(entry)
            for b in missing:
                if self._claimed(b):
                    thrashed = b
                entry = self._entries[b] = _Entry(self._slot())
                entry.pins += 1
                held.append(entry)
                mine.append((b, entry))
            self._counters["blocks_waited"] += len(theirs)
            self._counters["items_read"] += items
        if thrashed is not None:   # (outside the lock: a warning may run any code)
            warnings.warn(f"{self._op}: cache_blocks={self.capacity} is too small for its readers: more than "
                          f"half of the last {self._recent.maxlen} blocks decoded had been evicted a moment "
                          f"before ({describe(thrashed)}, for one); the batches are right but each block is "
                          "decoded many times. Leave cache_blocks=None (the default: seqloader.DataLoader sizes it "
                          "from its BlockShuffleSampler and executor), or keep at least what the readers use at "
                          "once: a "
                          "block shuffle's window per worker process, 2 * window with threads_per_worker, "
                          "window * (num_workers + 1) with worker_method='thread'", ArenaTooSmall, stacklevel=3)
        try:
            if mine:
                self._decode(mine, decode, out)
            for b, entry in theirs:
                while not entry.done.is_set() and self._help(decode):
                    pass   # (a block another thread decodes: decode one claimed ahead meanwhile)
                if not entry.done.wait(WAIT_TIMEOUT):
                    raise TimeoutError(f"{self._op}: waited {WAIT_TIMEOUT:g} s for {describe(b)}, which another "
                                       "thread of this process is decoding; is a read hanging (a stalled file "
                                       "system)?")
                if entry.error is not None:
                    raise entry.error
                out[b] = entry.value  # type: ignore[assignment]  # set with done, by the decoding thread
        except BaseException:
            self._unpin(held)
            raise
        return out, held

    def ahead(self, blocks: Sequence[int], decode: Decode[V], threads: int = 2) -> int:
        """Decode in the background, ahead of need, those of ``blocks`` neither kept nor being
        decoded, while a slot is free or held by an unpinned block (a pinned one is never evicted);
        returns how many were claimed. Each claimed block is decoded by one of at most ``threads``
        threads of this process (:class:`~seqloader.threads.burst.Burst`: they end when none is
        left); a reader that needs a claimed block before its decode began decodes it itself (it
        never waits behind the queue)."""
        claims = []
        with self._lock:
            for b in blocks:
                if b in self._entries:
                    continue
                slot = self._slot(ahead=True)
                if slot is None:
                    break
                self._claimed(b)
                entry = self._entries[b] = _Entry(slot, started=False, decode=decode)
                claims.append((b, entry))
            if claims and (self._burst is None or self._burst.num_threads != threads):
                # (another loader's thread count: the old burst's threads end once its queue is
                # empty; a claim it drops is decoded by the reader that needs it)
                self._burst = Burst(f"seqloader-ahead-{self._op}", threads)
            burst = self._burst
        for b, entry in claims:
            burst.submit(functools.partial(self._decode_claim, b, entry))  # type: ignore[union-attr]
        return len(claims)

    def _decode_claim(self, b: int, entry: _Entry, decode: Optional[Decode[Any]] = None) -> None:
        """Decode block ``b`` claimed by :meth:`ahead` (a background thread with the claim's
        decode, or a reader helping with its own ``decode``), unless a thread began it already;
        its value (or error) goes to the threads that wait for it, as for any decode. An error is
        not raised here: the block is not kept, and the reader that needs it decodes it again (and raises)."""
        with self._lock:
            if entry.started or entry.decode is None or self._entries.get(b) is not entry:
                return
            entry.started = True
        try:
            self._decode([(b, entry)], entry.decode if decode is None else decode, {})
        except Exception:   # (published to its waiters by _decode; a later reader tries again)
            pass

    def _help(self, decode: Decode[Any]) -> bool:
        """A reader that would wait for another thread's decode decodes the oldest block claimed
        ahead and not begun instead, with its own ``decode`` (in this thread, also where the
        claims go to decode processes), a block needed soon: the waits at a window's start become
        work; ``False`` if there is none."""
        with self._lock:
            claim = next(((b, e) for b, e in self._entries.items() if not e.started), None)
        if claim is None:
            return False
        self._decode_claim(*claim, decode)
        return True

    def _claimed(self, b: int) -> bool:
        """Count a claim of block ``b`` for decoding (under the lock); ``True`` once, at the claim
        that shows the arena thrashing (see the module docstring)."""
        self._claims += 1
        evicted = self._evicted.pop(b, None)
        again = evicted is not None and self._claims - evicted <= self.capacity
        self._counters["blocks_decoded_again"] += again
        self._recent.append(again)
        if again and not self._warned and len(self._recent) == self._recent.maxlen \
                and 2 * sum(self._recent) > len(self._recent):
            self._warned = True
            return True
        return False

    def _unpin(self, held: list[_Entry]) -> None:
        with self._lock:
            for entry in held:
                entry.pins -= 1
            self._trim()

    def _slot(self, ahead: bool = False) -> Optional[int]:
        """A free slot, or the slot of the least recently used unpinned block (evicted), or ``None``;
        for a claim ``ahead``, only a block that has been read: one decoded ahead and not read yet
        is needed sooner than any other (a reader's claim may take its slot)."""
        if self._free:
            return self._free.pop()
        for b, entry in self._kept.items():
            if entry.pins == 0 and entry.slot is not None and (entry.read or not ahead):
                self._evict(b, entry)
                return self._free.pop()
        return None

    def _evict(self, b: int, entry: _Entry) -> None:
        del self._kept[b]
        del self._entries[b]
        self._evicted[b] = self._claims
        if len(self._evicted) > 4 * self.capacity:
            self._evicted.popitem(last=False)
        if entry.slot is not None:
            self._free.append(entry.slot)

    def _trim(self) -> None:
        """Evict unpinned blocks, least recently used first, while more than ``capacity`` are kept."""
        if len(self._kept) <= self.capacity:
            return
        for read in (True, False):   # (the blocks read first: one decoded ahead is needed next)
            for b, entry in list(self._kept.items()):
                if len(self._kept) <= self.capacity:
                    return
                if entry.pins == 0 and entry.read == read:
                    self._evict(b, entry)

    def _decode(self, mine: list[tuple[int, _Entry]], decode: Decode[V], out: dict[int, V]) -> None:
        """Decode the blocks this thread claimed; publish the values (or the error) to their waiters."""
        try:
            results = decode([b for b, _ in mine], [e.slot for _, e in mine])
            if len(results) != len(mine):
                raise RuntimeError(f"{self._op}: the decode of blocks {[b for b, _ in mine]} returned "
                                   f"{len(results)} results")
        except BaseException as exc:
            with self._lock:
                for b, entry in mine:
                    del self._entries[b]
                    if entry.slot is not None:
                        self._free.append(entry.slot)
                    entry.error = exc
            for _, entry in mine:
                entry.done.set()
            raise
        with self._lock:
            for (b, entry), (value, nbytes) in zip(mine, results):
                entry.value = out[b] = value
                self._kept[b] = entry
                self._counters["blocks_decoded"] += 1
                self._counters["bytes_decoded"] += int(nbytes)
            self._trim()
        for _, entry in mine:
            entry.done.set()


class _Pinned(Generic[V]):
    """What :meth:`Arena.pinned` returns: pins on ``__enter__``, unpins on ``__exit__``."""

    __slots__ = ("_arena", "_args", "_held")

    def __init__(self, arena: Arena[V], *args: object):
        self._arena, self._args = arena, args
        self._held: list[_Entry] = []

    def __enter__(self) -> dict[int, V]:
        out, self._held = self._arena._pin(*self._args)  # type: ignore[arg-type]  # pinned()'s arguments
        return out

    def __exit__(self, *exc: object) -> None:
        self._arena._unpin(self._held)
