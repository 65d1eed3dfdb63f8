"""A process's decoded blocks: a bounded, least-recently-used arena that decodes each block once.

A columnar source (:mod:`seqloader.sources._table`) decodes whole blocks (Parquet row groups,
Arrow record batches) and slices batches out of them. Under thread workers
(``DataLoader(worker_method="thread")``, or ``threads_per_worker``) several threads of one
process read the same source at once, so the arena is shared by them and follows three rules:

* **Single flight.** A block is decoded once even when several threads need it at the same
  time: the first thread to ask decodes it; the others wait for that decode (at most
  :data:`WAIT_TIMEOUT` seconds, then ``TimeoutError`` naming the block) and take its result.
  An error raised by the decode is raised in the decoding thread and in every thread waiting
  for it (the same exception object, as ``concurrent.futures.Future.result`` does); the block
  is not remembered as failed, so a later read tries again.
* **No lock held while decoding.** The lock guards only the bookkeeping (which blocks are
  kept, which are being decoded, the counters), so different blocks decode in parallel on
  different threads (pyarrow releases the GIL while it decodes).
* **No deadlock.** A thread first decodes every block it claimed, and only then waits for the
  blocks that other threads claimed: a thread that others wait for never waits itself.

The arena keeps the ``capacity`` blocks used last; a block being read by a batch stays alive
through that batch's reference even after it leaves the arena. Counters (blocks decoded, their
bytes, blocks waited for, items read) are updated under the same lock.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Generic, Sequence, TypeVar

from seqloader.errors import check_positive_int

__all__ = ["Arena", "WAIT_TIMEOUT"]

V = TypeVar("V")

#: The longest a thread waits for another thread's decode of a block it needs, in seconds.
WAIT_TIMEOUT = 600.0


class _Flight:
    """A decode in progress: the thread that claimed the block sets ``done`` once ``value`` or
    ``error`` is filled in."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


class Arena(Generic[V]):
    """Decoded blocks of one process, at most ``capacity`` kept (see the module docstring).

    Args:
        capacity: blocks kept, ``>= 1``.
        op: the source's name, for messages.

    Example:
        >>> arena = Arena(2, "demo")
        >>> decode = lambda blocks: [(f"block {b}", 10) for b in blocks]
        >>> arena.get([0, 1], decode, str)
        {0: 'block 0', 1: 'block 1'}
        >>> arena.get([1, 2], decode, str), arena.kept()      # block 0, used last, is dropped
        ({1: 'block 1', 2: 'block 2'}, [1, 2])
        >>> arena.counters()["blocks_decoded"], arena.counters()["bytes_decoded"]
        (3, 30)
        >>> arena.get([5], lambda blocks: [], str)
        Traceback (most recent call last):
        RuntimeError: demo: the decode of blocks [5] returned 0 results
    """

    def __init__(self, capacity: int, op: str = "arena"):
        self.capacity = check_positive_int(op, "cache_blocks", capacity)
        self._op = op
        self._lock = threading.Lock()
        self._blocks: collections.OrderedDict[int, V] = collections.OrderedDict()
        self._flights: dict[int, _Flight] = {}
        self._counters = {"blocks_decoded": 0, "bytes_decoded": 0, "blocks_waited": 0, "items_read": 0}

    def counters(self) -> dict[str, int]:
        """A copy of the counters: ``blocks_decoded``, ``bytes_decoded``, ``blocks_waited`` (blocks
        a thread took from another thread's decode), ``items_read``."""
        with self._lock:
            return dict(self._counters)

    def count(self, name: str, n: int) -> None:
        """Add ``n`` to counter ``name``."""
        with self._lock:
            self._counters[name] += n

    def kept(self) -> list[int]:
        """The blocks kept, least recently used first."""
        with self._lock:
            return list(self._blocks)

    def get(self, blocks: Sequence[int], decode: Callable[[list[int]], Sequence[tuple[V, int]]],
            describe: Callable[[int], str]) -> dict[int, V]:
        """The decoded value of each of ``blocks`` (distinct ints), decoding those neither kept nor
        being decoded by another thread.

        Args:
            blocks: the blocks wanted.
            decode: ``decode(missing) -> [(value, nbytes), ...]``, one pair per block of
                ``missing`` in order; called without the lock held, at most once per call of
                :meth:`get`.
            describe: ``describe(block)`` names a block in a message (``"row group 3 of a.parquet"``).

        Returns:
            ``{block: value}`` for every block of ``blocks``.

        Raises:
            TimeoutError: another thread's decode of a block did not finish within
                :data:`WAIT_TIMEOUT` seconds.
            Exception: whatever ``decode`` raised, here or in the thread that decoded a block
                this call waited for.
        """
        out: dict[int, V] = {}
        mine: list[tuple[int, _Flight]] = []
        theirs: list[tuple[int, _Flight]] = []
        with self._lock:
            for b in blocks:
                if b in self._blocks:
                    self._blocks.move_to_end(b)
                    out[b] = self._blocks[b]
                elif b in self._flights:
                    theirs.append((b, self._flights[b]))
                else:
                    flight = self._flights[b] = _Flight()
                    mine.append((b, flight))
            self._counters["blocks_waited"] += len(theirs)
        if mine:
            self._decode(mine, decode, out)
        for b, flight in theirs:
            if not flight.done.wait(WAIT_TIMEOUT):
                raise TimeoutError(f"{self._op}: waited {WAIT_TIMEOUT:g} s for {describe(b)}, which another thread "
                                   "of this process is decoding; is a read hanging (a stalled file system)?")
            if flight.error is not None:
                raise flight.error
            out[b] = flight.value  # type: ignore[assignment]  # set with done, by the decoding thread
        return out

    def _decode(self, mine: list[tuple[int, _Flight]], decode: Callable[[list[int]], Sequence[tuple[V, int]]],
                out: dict[int, V]) -> None:
        """Decode the blocks this thread claimed; publish the values (or the error) to their waiters."""
        try:
            results = decode([b for b, _ in mine])
            if len(results) != len(mine):
                raise RuntimeError(f"{self._op}: the decode of blocks {[b for b, _ in mine]} returned "
                                   f"{len(results)} results")
        except BaseException as exc:
            with self._lock:
                for b, flight in mine:
                    del self._flights[b]
                    flight.error = exc
            for _, flight in mine:
                flight.done.set()
            raise
        with self._lock:
            for (b, flight), (value, nbytes) in zip(mine, results):
                del self._flights[b]
                flight.value = out[b] = self._blocks[b] = value
                self._counters["blocks_decoded"] += 1
                self._counters["bytes_decoded"] += int(nbytes)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
        for _, flight in mine:
            flight.done.set()
