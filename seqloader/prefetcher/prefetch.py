"""``prefetch``: an ordered, seekable sequence whose items are computed ahead by an executor's workers.

A :class:`Prefetch` is a :class:`~seqloader.sequences.base.LazySequence`: ``p[i]`` is ``seq[i]``,
computed by worker ``i % num_workers`` (torch's assignment) of an executor (worker processes,
threads, threads inside processes, Ray actors: :mod:`seqloader.prefetcher.executor`). Reading item
``i`` keeps ``i+1 .. i+num_workers*prefetch_factor`` in flight; reading another item *re-targets*
the workers. :meth:`Prefetch.take` reads in completion order (:mod:`~seqloader.prefetcher.unordered`),
:meth:`Prefetch.seek` positions both readers, :meth:`Prefetch.reset` points the workers at a new
sequence. With ``restarts > 0`` a dead worker is replaced (:mod:`seqloader.prefetcher.healing`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence

from seqloader.errors import check_int, check_positive_int
from seqloader.prefetcher.checks import check_seq, check_skip
from seqloader.prefetcher.executor import Executor
from seqloader.prefetcher.faults import ItemTimeout, WorkerDied
from seqloader.prefetcher.healing import Healer
from seqloader.prefetcher.inbox import START_TIMEOUT, Inbox
from seqloader.prefetcher.ordered import InOrder
from seqloader.prefetcher.roster import Roster
from seqloader.prefetcher.unordered import Taker, TakeWindow, continue_in_order
from seqloader.sequences.base import LazySequence

__all__ = ["ItemTimeout", "Prefetch", "WorkerDied"]

# NOTE: what an executor guarantees: executor.py; for worker processes (ownership of processes and shared
# memory, messages, starting, liveness, healing, shutdown) processes/executor.py's NOTEs; threads: threads.py.


class Prefetch(LazySequence):
    """``seq`` evaluated ahead of the reader by the workers of an executor; built by
    :func:`~seqloader.prefetcher.api.prefetch`.

    Read-ahead follows increasing positions: reading backwards or at random costs a seek (and
    a wasted read-ahead) per item. :meth:`take` reads in completion order instead. Not
    thread-safe: read it from one thread. See :func:`prefetch` for the arguments.

    Args:
        seq: the sequence.
        executor: who computes the items (:mod:`seqloader.prefetcher.executor`); the Prefetch
            owns it and closes it.
        prefetch_factor: jobs in flight per worker (per thread of a worker).
        timeout: seconds to wait for one item (``0``: no bound but liveness).
        affinity: item ``i`` on worker ``i % num_workers`` (else the least busy).
        restarts, respawn: healing (:mod:`seqloader.prefetcher.healing`).
        describe: ``describe(seq, i) -> str``, how messages about a dead worker name item ``i`` of
            the sequence being read (the layer above knows it is a batch and which dataset
            indices it reads).
    """

    def __init__(self, seq: Sequence[Any], executor: Executor, prefetch_factor: int, timeout: float,
                 affinity: bool = True, restarts: int = 0, respawn: Optional[Callable[[int], Any]] = None,
                 describe: Optional[Callable[[Any, int], str]] = None):
        self._seq, self._len, self._timeout = seq, len(seq), timeout
        self._healing = (restarts, respawn, describe)
        self._pid = os.getpid()
        self._wire(executor, prefetch_factor, affinity)

    def _wire(self, executor: Executor, prefetch_factor: int, affinity: bool) -> None:
        """Build the reader's parts around ``executor`` (at construction, and in a forked child)."""
        restarts, respawn, describe = self._healing
        self._executor = executor
        self._taker: Taker | None = None  # out-of-order reading (take), if that is the mode
        self._roster = Roster(executor, prefetch_factor, affinity)
        self._inbox = Inbox(self._roster, repr(self))
        self._inbox.name_items(describe, self._seq)
        self._in_order = InOrder(self._inbox, self._roster)  # in-order reading; -1: not reading in order
        self._in_order.restart(0, self._len)
        if restarts:
            self._inbox.healer = Healer(restarts, respawn, self._seq, max(START_TIMEOUT, self._timeout))
        self._launched = False
        # the gc path must not block (a thread inside a long item cannot be joined)
        self._finalizer = weakref.finalize(self, getattr(executor, "stop_nowait", executor.close))

    def _after_fork(self) -> None:
        """This copy was inherited by a forked child: read with workers of the child's own (a
        thread executor starts fresh threads; worker processes belong to the parent: an error)."""
        executor = self._executor.forked()
        self._pid = os.getpid()
        self._wire(executor, self._roster.prefetch_factor, self._roster.affinity)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        r, kind = self._roster, self._executor.kind
        method = "" if kind == "process" else f"method={kind!r}, "
        threads = f", threads={r.executor.concurrency}" if kind == "process" and r.executor.concurrency > 1 else ""
        return f"prefetch({method}num_workers={r.num_workers}{threads}, prefetch_factor={r.prefetch_factor}, len={self._len})"

    def __reduce__(self):
        raise TypeError(f"{self!r}: a Prefetch owns its workers and cannot be pickled; "
                        "pickle the sequence it reads instead")

    @property
    def executor(self) -> Executor:
        """The executor computing the items (``executor.kind``: ``"process"``, ``"thread"``, ...)."""
        return self._executor

    def __enter__(self) -> "Prefetch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers and free every shared-memory slot; idempotent.

        The shutdown protocols are the NOTEs in ``seqloader/prefetcher/processes/executor.py`` and
        ``seqloader/prefetcher/threads.py``, and in ``docs/design.md``. Values already returned stay
        valid. Reading after ``close`` raises ``ValueError``.

        Example:
            >>> from seqloader import prefetch
            >>> p = prefetch(range(3), num_workers=1)
            >>> x = p[2]
            >>> p.close(); p.close()  # idempotent
            >>> p.closed, x
            (True, 2)
            >>> p[0]
            Traceback (most recent call last):
            ValueError: prefetch(num_workers=1, prefetch_factor=2, len=3): read or reset after close(); create a new prefetch
        """
        self._inbox.ready.clear()
        self._taker = None
        self._finalizer.detach()
        self._executor.close()

    def counters(self) -> dict:
        """Where the workers' time went, since they started (readable after :meth:`close` too).

        Returns:
            ``{"workers": [{"busy_s": float, "cpu_s": float, "items": int, "restarts": int}, ...],
            "reads": int, "ready_sum": int, "shm_bytes": int, "restarts": int, "stages": {name: float},
            "executor": str}``: per worker the seconds spent computing items (wall time, and CPU
            time of the threads that computed them), how many, and how many times it died and was
            replaced (``restarts=``); items read in order and the sum, over those reads, of the
            items already computed at that moment (read-ahead used); bytes that came through shared
            memory; replacements; and the seconds per stage, summed over the workers, when they
            time their stages (:mod:`seqloader.sequences.stage_times`; else empty); the executor's
            kind (``"process"``, ``"thread"``).

        Example:
            >>> from seqloader import prefetch
            >>> with prefetch(range(4), num_workers=2) as p:
            ...     _ = list(p)
            >>> c = p.counters(); sum(w["items"] for w in c["workers"]), c["reads"]
            (4, 4)
        """
        return self._inbox.counters()

    def listen(self, listener: Optional[Callable[[Any, Any], None]]) -> None:
        """Call ``listener(done, seq)`` in the reader's thread with each computed item's :class:`~seqloader.prefetcher.executor.Done`
        and the sequence it is an item of (``None``: superseded since); ``None``: stop (a trace listens)."""
        self._inbox.listener = listener

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (explicitly, by ``with``, or after a worker failure)."""
        return self._executor.closed

    def start(self) -> None:
        """Start the workers and wait until each has run its set-up; idempotent.

        The first read (indexing or :meth:`take`) calls it: call it to start the workers early
        or to learn at once that ``worker_init_fn`` fails. The wait is bounded by 300 s (or
        ``timeout``, if longer) and checks that the workers are alive; ``spawn`` takes seconds.

        Raises:
            Exception: ``worker_init_fn`` raised: its own exception (type kept, a note naming
                worker and pid, the worker's traceback chained).
            WorkerDied: a worker died before its set-up finished.
            RuntimeError: a set-up took longer than the bound.
            TypeError: ``spawn``/``forkserver`` cannot pickle the sequence, ``shared`` or
                ``worker_init_fn``.
            ValueError: the Prefetch is closed. (Every other error closes it.)

        Example:
            >>> from seqloader import prefetch
            >>> def needs_config(worker_id):
            ...     raise KeyError(f"no config for worker {worker_id}")
            >>> p = prefetch(range(3), num_workers=1, worker_init_fn=needs_config)
            >>> try:
            ...     p.start()
            ... except KeyError as exc:
            ...     print(repr(exc), exc.__notes__[0].split(" (pid")[0], p.closed)
            KeyError('no config for worker 0') seqloader: worker_init_fn failed in worker 0 True
        """
        self._check_open()
        if self._roster.running:
            return
        if not self._launched:
            self._launched = True
            self._executor.launch(self._seq, self._inbox.gen)
        self._inbox.wait_started(max(START_TIMEOUT, self._timeout))

    def seek(self, position: int, *, skip: Iterable[int] = ()) -> None:
        """Read from ``position`` on: ``p[position]`` next, or :meth:`take` from there.

        Starts a new generation (items in flight are dropped); nothing is submitted before the
        next read. ``skip`` lists items :meth:`take` must neither compute nor return: to resume
        an out-of-order reader, save its watermark (the smallest item not taken) and the items
        taken above it, then ``seek(watermark, skip=taken_above)``. ``skip`` does not apply to
        indexing (``p[i]`` after a ``seek`` with ``skip`` seeks again).

        Args:
            position: in ``[0, len]`` (``len``: nothing left to take).
            skip: item indices in ``[position, len)``.

        Raises:
            TypeError: ``position`` or an item of ``skip`` is not an int.
            IndexError: ``position`` or an item of ``skip`` is out of range.
            ValueError: the Prefetch is closed.

        Example:
            >>> from seqloader import prefetch
            >>> p = prefetch(range(8), num_workers=2)
            >>> p.seek(3, skip={4, 6})  # 0..2 were taken, and 4 and 6 beyond them
            >>> p.remaining, sorted(p.take()[0] for _ in range(p.remaining))
            (3, [3, 5, 7])
            >>> p.seek(3, skip={1})
            Traceback (most recent call last):
            IndexError: prefetch.seek: skip holds item 1, out of range [3, 8); skip lists items at or after position
            >>> p.close()
        """
        self._check_open()
        position = check_int("prefetch.seek", "position", position)
        if not 0 <= position <= self._len:
            raise IndexError(f"prefetch.seek: position {position} out of range [0, {self._len}]")
        skipped = check_skip(skip, position, self._len)
        self._retarget()
        if skipped:
            self._in_order.restart(-1)
            window = TakeWindow(self._len, self._roster.num_workers, position, skipped,
                                affinity=self._roster.affinity)
            self._taker = Taker(self._inbox, self._roster, window)
        else:
            self._in_order.restart(position)

    def reset(self, seq: Sequence) -> None:
        """Point the same workers at ``seq``; nothing is respawned.

        Worker processes get ``seq`` pickled with the object they hold (``shared``, else the first
        sequence) as a persistent id: one small message each. The next read may be any item of
        ``seq`` (:meth:`take` starts at 0); jobs of the old sequence not started are never computed.

        Args:
            seq: the new sequence (picklable once workers have started).

        Raises:
            TypeError: ``seq`` has no ``len`` or cannot be pickled.
            ValueError: the Prefetch is closed.

        Example:
            >>> from seqloader import prefetch
            >>> with prefetch(range(5), num_workers=1) as p:
            ...     first = list(p)
            ...     p.reset(range(10, 13))
            ...     len(p), list(p)
            (3, [10, 11, 12])
            >>> p.reset(range(3))
            Traceback (most recent call last):
            ValueError: prefetch(...): read or reset after close(); create a new prefetch
        """
        self._check_open()
        n = check_seq("prefetch.reset", seq)
        self._executor.reset(seq, self._inbox.gen + 1)  # raises before anything changed
        self._retarget()
        self._seq, self._len = seq, n
        self._inbox.label = repr(self)
        self._inbox.name_items(self._healing[2], seq)
        self._in_order.restart(0, n)
        if self._inbox.healer is not None:
            self._inbox.healer.sequence_changed(seq)

    # ----------------------------------------------------------------------- reading in order

    def _item(self, i: int) -> Any:
        self._check_open()
        reader = self._in_order
        if not self._roster.running:
            self.start()
        try:
            if i != reader.next_read:  # a seek
                self._retarget()
                reader.restart(i)
            reply, m = reader.read(i, self._timeout)
        except KeyboardInterrupt:
            # Interrupted anywhere in the bookkeeping (a seek included): start a new generation
            # so the next read cannot wait for a reply that was half-handled or dropped.
            self._inbox.interrupted()
            self._taker = None
            reader.restart(-1)
            raise
        return self._inbox.result(i, reply, m)

    def _check_open(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()
        if self._executor.closed:
            broken = self._inbox.broken
            why = f" after an earlier error ({broken})" if broken else ""
            raise ValueError(f"{self!r}: read or reset after close(){why}; create a new prefetch")

    def _retarget(self) -> None:
        """Start a new generation: queued jobs become stale, unread results are dropped."""
        self._inbox.new_generation()
        self._taker = None

    # ----------------------------------------------------------------------- reading out of order

    @property
    def remaining(self) -> int:
        """How many items :meth:`take` has still to return, from the read position to the end.

        Raises:
            ValueError: the read position is unknown (an indexed read was interrupted by
                ``KeyboardInterrupt``): call :meth:`seek` first.

        Example:
            >>> from seqloader import prefetch
            >>> with prefetch(range(5), num_workers=1) as p:
            ...     p[0], p.remaining, p.take(), p.remaining, p.seek(5), p.remaining
            (0, 4, (1, 1), 3, None, 0)
        """
        return self._take_window().remaining()

    def take(self, *, window: int | None = None) -> tuple[int, Any]:
        """The first item to complete among those not taken yet, as ``(index, value)``.

        Takes every item from the read position (0, the item after the last indexed read, or
        the :meth:`seek` position less its ``skip``) to the end exactly once, in completion
        order. Item ``j`` is still computed by worker ``j % num_workers``, at most
        ``prefetch_factor`` in flight per worker, and only items below ``watermark + window``
        are submitted (the watermark: the smallest item not taken). So a slow item holds up
        only its own worker's later items; what the other workers complete is returned at
        once, up to the window's end (:mod:`seqloader.prefetcher.unordered`). An indexed read
        afterwards seeks.

        An item that raised re-raises its error as indexing does (type and message kept, a
        note naming item, worker and pid, the remote traceback chained) with the attribute
        ``exc.seqloader_index`` set to its index: that item counts as taken. Every other
        error takes nothing; after ``KeyboardInterrupt`` the items in flight start again.

        Args:
            window: how far past the watermark items may be submitted; default
                ``num_workers * prefetch_factor``. At most ``window - 1`` items above the
                watermark are ever taken: that bounds a resume's ``skip`` (see :meth:`seek`).

        Returns:
            ``(index, seq[index])``.

        Raises:
            IndexError: every item has been taken (see :attr:`remaining`).
            TypeError, ValueError: ``window`` is not a positive int; the Prefetch is closed; the
                read position is unknown (see :attr:`remaining`).
            ItemTimeout: no item completed within ``timeout`` seconds (the Prefetch stays usable).
            WorkerDied: a worker died (the Prefetch is closed).
            Exception: the item's own error, with ``seqloader_index`` set.

        Example:
            >>> from seqloader import prefetch, smap
            >>> p = prefetch(smap(lambda i: 10 // (i - 1), range(3)), num_workers=2)
            >>> got = []
            >>> while p.remaining:
            ...     try:
            ...         got.append(p.take())
            ...     except ZeroDivisionError as exc:
            ...         got.append((exc.seqloader_index, "failed"))
            >>> sorted(got, key=str)
            [(0, -10), (1, 'failed'), (2, 10)]
            >>> p.take()
            Traceback (most recent call last):
            IndexError: prefetch(num_workers=2, prefetch_factor=2, len=3): take() with every item taken; seek() to read again
            >>> p.close()
        """
        self._check_open()
        roster = self._roster
        window = roster.num_workers * roster.capacity if window is None else \
            check_positive_int("prefetch.take", "window", window)
        if not roster.running:
            self.start()
        taker = self._taker_for_take()
        if not taker.window.remaining():
            raise IndexError(f"{self!r}: take() with every item taken; seek() to read again")
        return taker.take(window, self._timeout)

    def _taker_for_take(self) -> Taker:
        """The out-of-order reader, continuing an in-order read-ahead if there is one."""
        if self._taker is None:
            self._taker = Taker(self._inbox, self._roster, self._take_window())
            self._in_order.restart(-1)
        return self._taker

    def _take_window(self) -> TakeWindow:
        if self._taker is not None:
            return self._taker.window
        return continue_in_order(self._in_order, self._roster, self._len, repr(self))
