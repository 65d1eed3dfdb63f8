"""``ThreadPrefetch``: an ordered, seekable sequence whose items are computed ahead by threads.

The thread backend of ``seqloader.prefetch(seq, num_workers, method="thread")``, for items that
wait on I/O or on code that releases the GIL (remote reads, most decoders): the semantics of the
process backend (:class:`seqloader.prefetcher.prefetch.Prefetch`) on the threads of a
:class:`seqloader.threads.ThreadPool`, without processes, shared memory or pickling, and without
torch. Items are returned as computed (no copy).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Sequence, TypeVar, cast

from seqloader.errors import add_note, check_int, check_positive_int
from seqloader.sequences._util import check_sequence, read
from seqloader.sequences.base import LazySequence
from seqloader.threads import Channel, TaskTimeout, ThreadPool

__all__ = ["TaskTimeout", "ThreadPrefetch"]

T = TypeVar("T")

#: The attribute a read sets on an item's error: its index (as the process backend does).
INDEX_ATTR = "seqloader_index"


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"prefetch: timeout must be a number of seconds (got {type(timeout).__name__})")
    if not timeout >= 0:
        raise ValueError(f"prefetch: timeout must be >= 0 (got {timeout}); 0 waits forever")
    return float(timeout)


class ThreadPrefetch(LazySequence[T]):
    """``seq`` evaluated ahead of the reader by ``num_threads`` threads of this process.

    Item ``i`` is ``seq[i]``. Reading item ``i`` keeps ``i+1 .. i+num_threads*prefetch_factor``
    in flight (never past the end); reading any other item than the next, or :meth:`seek`,
    *re-targets*: a new generation, in which queued jobs of older ones are never computed and
    results of running ones are dropped. Any free thread computes the next queued item. Not
    thread-safe: read it from one thread (``seq`` is read from several threads at once).

    An error raised by ``seq[i]`` is re-raised by ``p[i]`` with its type and message, a note
    naming the item and the thread, and ``exc.seqloader_index = i``; the prefetch stays usable.
    ``timeout > 0`` bounds the wait for one item with :class:`~seqloader.threads.TaskTimeout` (a
    ``RuntimeError``), after which the prefetch stays usable too (reading the same item again
    waits for the same computation). The threads start on the first read and stop at
    :meth:`close` (``with``; gc only signals them, see :mod:`seqloader.threads`). Items computed
    in a thread run with that thread's state: the global RNGs are shared, so draw randomness with
    ``rng_map``. Build it with ``prefetch(seq, num_workers, method="thread")``.

    Args:
        seq: a sequence (``len`` and integer indexing), read from several threads.
        num_threads: threads, ``>= 1``.
        prefetch_factor: items in flight per thread, ``>= 1``.
        timeout: seconds to wait for one item; ``0`` waits forever (bounded waits check that
            the threads are alive).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range.

    Example:
        >>> with ThreadPrefetch(range(10), num_threads=2) as p:
        ...     p[0], p[1], p[-1], list(p[3:6])
        (0, 1, 9, [3, 4, 5])
        >>> p.closed
        True
        >>> ThreadPrefetch(range(10), num_threads=0)
        Traceback (most recent call last):
        ValueError: prefetch: num_workers must be a positive int (got 0); to evaluate in this process, read the sequence directly
    """

    def __init__(self, seq: Sequence[T], num_threads: int, prefetch_factor: int = 2, timeout: float = 0):
        self._len = check_sequence("prefetch", "seq", seq)
        n = check_int("prefetch", "num_workers", num_threads)
        if n < 1:
            raise ValueError(f"prefetch: num_workers must be a positive int (got {n}); to evaluate in this "
                             "process, read the sequence directly")
        self._seq = seq
        self._num_threads = n
        self._prefetch_factor = check_positive_int("prefetch", "prefetch_factor", prefetch_factor)
        self._timeout = _check_timeout(timeout)
        self._pool = ThreadPool(n, name=f"seqloader-prefetch@{id(self):x}")
        self._channel: Channel[T] = Channel(self._pool)
        self._gen = -1  # the channel's generation this reader's bookkeeping belongs to
        self._next_read = self._next_submit = 0  # -1: unknown after an interrupted read
        self._finalizer = weakref.finalize(self, self._pool.stop_nowait)  # never blocks (see threads.py)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"prefetch(method='thread', num_workers={self._num_threads}, "
                f"prefetch_factor={self._prefetch_factor}, len={self._len})")

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r}: a ThreadPrefetch owns threads and cannot be pickled; "
                        "pickle the sequence it reads instead")

    def __enter__(self) -> ThreadPrefetch[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (explicitly or by ``with``)."""
        return self._pool.closed

    def close(self) -> None:
        """Stop the threads; idempotent. Queued items are never computed.

        Joins the threads against one 5 s deadline (a thread inside a long item finishes it
        alone, then exits). Reading after ``close`` raises ``ValueError``.

        Example:
            >>> p = ThreadPrefetch(range(3), num_threads=1)
            >>> x = p[2]
            >>> p.close(); p.close()  # idempotent
            >>> p.closed, x
            (True, 2)
            >>> p[0]
            Traceback (most recent call last):
            ValueError: prefetch(method='thread', num_workers=1, prefetch_factor=2, len=3): read after close(); create a new prefetch
        """
        self._pool.close()
        self._finalizer.detach()

    def seek(self, position: int) -> None:
        """Read from ``position`` on: ``p[position]`` is read next, without a seek of its own.

        Starts a new generation (items in flight are dropped); nothing is submitted before the
        next read.

        Args:
            position: in ``[0, len]``.

        Raises:
            TypeError: ``position`` is not an int.
            IndexError: ``position`` is out of range.
            ValueError: the prefetch is closed.

        Example:
            >>> with ThreadPrefetch(range(8), num_threads=2) as p:
            ...     p.seek(5)
            ...     p[5], p[6], p.seek(8)
            (5, 6, None)
            >>> ThreadPrefetch(range(8), num_threads=2).seek(9)
            Traceback (most recent call last):
            IndexError: prefetch.seek: position 9 out of range [0, 8]
        """
        self._check_open("seek")
        position = check_int("prefetch.seek", "position", position)
        if not 0 <= position <= self._len:
            raise IndexError(f"prefetch.seek: position {position} out of range [0, {self._len}]")
        self._retarget(position)

    def reset(self, seq: Sequence[T]) -> None:
        """Read ``seq`` from now on, with the same threads; the next read may be any item.

        Raises:
            TypeError: ``seq`` is not a sequence.
            ValueError: the prefetch is closed.

        Example:
            >>> with ThreadPrefetch(range(5), num_threads=1) as p:
            ...     p.reset(range(10, 13))
            ...     len(p), list(p)
            (3, [10, 11, 12])
            >>> p.reset([])
            Traceback (most recent call last):
            ValueError: prefetch(method='thread', num_workers=1, prefetch_factor=2, len=3): reset after close(); create a new prefetch
        """
        self._check_open("reset")
        n = check_sequence("prefetch.reset", "seq", seq)
        self._retarget(0)
        self._seq, self._len = seq, n

    # -- reading ----------------------------------------------------------------------------------

    def _item(self, i: int) -> T:
        self._check_open("read")
        channel = self._channel
        if i != self._next_read or channel.generation != self._gen:  # a seek, or the first read after a fork
            self._retarget(i)
        try:
            self._fill()
            outcome = channel.collect(i, self._timeout or None)
        except KeyboardInterrupt:
            self._retarget(-1)  # the next read starts a new generation wherever it is
            raise
        if outcome is None:
            thread = channel.thread_of(i)
            where = f"in thread {thread}" if thread is not None else "still queued (every thread busy)"
            raise TaskTimeout(f"{self!r}: timed out after {self._timeout} seconds waiting for item {i} ({where}); "
                              "increase timeout= or look at what the thread is doing",
                              seconds=self._timeout, item=i, thread=thread)
        self._next_read = i + 1
        self._fill()
        if outcome.error is not None:
            exc = outcome.error
            add_note(exc, f"seqloader: raised while computing item {i} of {self!r} in thread {outcome.thread}")
            try:
                setattr(exc, INDEX_ATTR, i)
            except AttributeError:  # pragma: no cover - exceptions with __slots__
                pass
            raise exc
        return cast(T, outcome.value)  # no error: the value of seq[i]

    def _check_open(self, op: str) -> None:
        if self._pool.closed:
            raise ValueError(f"{self!r}: {op} after close(); create a new prefetch")

    def _retarget(self, position: int) -> None:
        self._gen = self._channel.retarget()
        self._next_read = self._next_submit = position

    def _fill(self) -> None:
        limit = min(self._len, self._next_read + self._num_threads * self._prefetch_factor)
        while self._next_submit < limit:
            self._channel.submit(self._next_submit, functools.partial(read, self._seq, self._next_submit))
            self._next_submit += 1
