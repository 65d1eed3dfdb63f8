"""``prefetch``: an ordered, seekable sequence whose items are computed ahead by worker processes.

A :class:`Prefetch` is a :class:`~seqloader.sequences.base.LazySequence`: ``p[i]`` is ``seq[i]``,
computed by worker ``i % num_workers`` of ``num_workers`` long-lived processes (the assignment
torch's ``DataLoader`` makes, so item code that reads its worker id sees the same thing, and a
worker may keep per-process state for the items it is given). Reading item ``i`` keeps the items
``i+1 .. i+num_workers*prefetch_factor`` in flight; reading any other item than the next one
*re-targets* the workers there (the items in between are never computed, stale results are
dropped). :meth:`Prefetch.reset` points the same workers at a new sequence with one small
message. Results travel through shared memory (:mod:`seqloader.prefetcher.shm`). A prefetcher knows
nothing of torch's ``DataLoader``: worker set-up beyond one intra-op thread (seeds, torch's
``WorkerInfo``) is the caller's ``worker_init_fn``.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
import weakref
from typing import Any, Callable, Sequence

from seqloader.errors import add_note, check_int, check_positive_int
from seqloader.prefetcher.crew import Crew, WorkerHandle
from seqloader.prefetcher.messages import Cancelled, Result, Retarget, WorkerFailed
from seqloader.prefetcher.shm import read_and_release
from seqloader.prefetcher.worker import dumps_seq
from seqloader.sequences.base import LazySequence

__all__ = ["ItemTimeout", "Prefetch", "WorkerDied", "prefetch"]

#: Longest single wait (seconds) before the reader re-checks that every worker is alive.
STATUS_CHECK_INTERVAL = 5.0

# NOTE: ownership of processes and shared memory, the messages, the liveness checks and the
# shutdown protocol are described in the NOTE next to Crew.close() in crew.py.


class WorkerDied(RuntimeError):
    """A worker process ended (signal, ``os._exit``, crash) while the reader needed it.

    Attributes:
        worker_id, pid: which worker.
        exitcode: its exit status (negative: killed by signal ``-exitcode``; ``None``: unknown).
        item: the item it was producing, or ``None`` if it was idle.
    """

    def __init__(self, message: str, *, worker_id: int, pid: int, exitcode: int | None,
                 item: int | None):
        super().__init__(message)
        self.worker_id, self.pid, self.exitcode, self.item = worker_id, pid, exitcode, item


class ItemTimeout(RuntimeError):
    """Waiting for one item took longer than ``timeout`` seconds; the ``Prefetch`` stays usable.

    Attributes:
        seconds: the timeout; item: the item waited for; worker_id, pid: its worker, if known.
    """

    def __init__(self, message: str, *, seconds: float, item: int, worker_id: int | None,
                 pid: int | None):
        super().__init__(message)
        self.seconds, self.item, self.worker_id, self.pid = seconds, item, worker_id, pid


class _RemoteTraceback(Exception):
    """The worker-side traceback of an item's error, chained as ``__cause__`` in the reader."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def _rebuild_error(report: dict, note: str) -> BaseException:
    exc = report["exc"]
    if exc is None and report["type"] is not None:
        try:
            exc = report["type"](report["message"])
        except Exception:
            exc = None
    if exc is None:
        exc = RuntimeError(f"{report['type_name']}: {report['message']}")
    add_note(exc, note)
    exc.__cause__ = _RemoteTraceback(report["traceback"])
    return exc


class Prefetch(LazySequence):
    """``seq`` evaluated ahead of the reader by worker processes; built by :func:`prefetch`.

    Read-ahead follows increasing positions: reading backwards or at random costs a seek (and
    a wasted read-ahead) per item. Not thread-safe: read it from one thread. See
    :func:`prefetch` for the arguments.
    """

    def __init__(self, seq, num_workers, prefetch_factor, ctx, worker_init_fn, timeout, shared):
        self._seq, self._len, self._timeout = seq, len(seq), timeout
        self._shared = shared if shared is not None else seq
        self._gen = 0
        self._next_read = self._next_submit = 0
        self._ready: dict[int, tuple] = {}  # index -> (Result or Failure, worker handle)
        self._broken: str | None = None
        self._crew = Crew(ctx, num_workers, prefetch_factor, worker_init_fn, self._shared)
        self._finalizer = weakref.finalize(self, self._crew.close)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        c = self._crew
        return f"prefetch(num_workers={c.num_workers}, prefetch_factor={c.prefetch_factor}, len={self._len})"

    def __reduce__(self):
        raise TypeError(f"{self!r}: a Prefetch owns worker processes and cannot be pickled; "
                        "pickle the sequence it reads instead")

    def __enter__(self) -> "Prefetch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers and free every shared-memory slot; idempotent.

        The shutdown protocol is the NOTE next to ``Crew.close`` in ``seqloader/prefetcher/crew.py``
        and in ``docs/design.md``. Values already returned stay valid. Reading after ``close``
        raises ``ValueError``.

        Example:
            >>> p = prefetch(range(3), num_workers=1)
            >>> x = p[2]
            >>> p.close(); p.close()  # idempotent
            >>> p.closed, x
            (True, 2)
            >>> p[0]
            Traceback (most recent call last):
            ValueError: prefetch(num_workers=1, prefetch_factor=2, len=3): read or reset after close(); create a new prefetch
        """
        self._ready.clear()
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (explicitly, by ``with``, or after a worker failure)."""
        return self._crew.closed

    def reset(self, seq: Sequence) -> None:
        """Point the same workers at ``seq``; nothing is respawned.

        The sequence is pickled with the object the workers already hold (the ``shared``
        argument of :func:`prefetch`, else the first sequence) replaced by a persistent id, so a
        new epoch over the same dataset costs one small message per worker (a pickled
        sequence larger than the pipe buffer, 64 KiB, waits for each worker to finish its
        current item). The next read may be any item of ``seq``; jobs of the old sequence that
        have not started are never computed.

        Args:
            seq: the new sequence (picklable once workers have started).

        Raises:
            TypeError: ``seq`` has no ``len`` or cannot be pickled.
            ValueError: the Prefetch is closed.

        Example:
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
        n = _check_seq("prefetch.reset", seq)
        blob = None
        if self._crew.handles:
            try:
                blob = dumps_seq(seq, self._shared)
            except Exception as exc:
                raise TypeError(f"prefetch.reset: seq cannot be pickled for the workers ({type(exc).__name__}: "
                                f"{exc})") from exc
        self._retarget()
        self._seq, self._len = seq, n
        self._next_read = self._next_submit = 0
        if blob is not None:
            for h in self._crew.handles:
                h.send(Retarget(self._gen, blob))

    # ----------------------------------------------------------------------- reading

    def _item(self, i: int) -> Any:
        self._check_open()
        crew = self._crew
        if not crew.handles:
            crew.start(self._seq, self._gen)
        if i != self._next_read:
            self._retarget()
            self._next_read = self._next_submit = i
        try:
            self._fill()
            if i not in self._ready:
                self._wait_for(i)
        except KeyboardInterrupt:
            # Interrupted anywhere in the bookkeeping: start a new generation so the next read
            # cannot wait for a reply that was half-handled.
            self._retarget()
            self._next_read = self._next_submit = -1
            raise
        msg, h = self._ready.pop(i)
        self._next_read = i + 1
        self._fill()
        if isinstance(msg, Result):
            return read_and_release(msg.payload, crew.pool)
        report = read_and_release(msg.payload, crew.pool)
        raise _rebuild_error(report, f"seqloader: raised while computing item {i} of {self!r} in worker "
                                     f"{h.worker_id} (pid {h.pid})")

    def _check_open(self) -> None:
        if self._crew.closed:
            why = f" after an earlier error ({self._broken})" if self._broken else ""
            raise ValueError(f"{self!r}: read or reset after close(){why}; create a new prefetch")

    def _retarget(self) -> None:
        """Start a new generation: queued jobs become stale, unread results are dropped."""
        self._gen += 1
        for msg, _ in self._ready.values():
            self._crew.pool.release(msg.payload.slot_id)
        self._ready.clear()

    def _fill(self) -> None:
        crew = self._crew
        limit = min(self._len, self._next_read + crew.num_workers * crew.prefetch_factor)
        while self._next_submit < limit:
            h = crew.worker_for(self._next_submit)
            if h is None:  # in order: wait for that worker rather than skip ahead
                return
            try:
                crew.submit(h, self._gen, self._next_submit)
            except OSError:  # its pipe is broken: the worker is gone
                self._fail_dead(h, self._next_read)
            self._next_submit += 1

    def _wait_for(self, i: int) -> None:
        crew = self._crew
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while i not in self._ready:
            wait_s = STATUS_CHECK_INTERVAL if deadline is None else max(0.0, deadline - time.monotonic())
            events = crew.poll(min(wait_s, STATUS_CHECK_INTERVAL))
            dead = [h for h, is_sentinel in events if is_sentinel]
            if not events:
                dead = [h for h in crew.handles if not h.process.is_alive()]
            for h in {h for h, _ in events} | set(dead):
                self._drain(h)
            if dead:
                self._fail_dead(dead[0], i)
            self._fill()
            if not events and deadline is not None and time.monotonic() >= deadline and i not in self._ready:
                h = self._worker_of(i)
                who = f" from worker {h.worker_id} (pid {h.pid})" if h is not None else ""
                raise ItemTimeout(f"{self!r}: timed out after {self._timeout} seconds waiting for item {i}{who}; "
                                  "increase timeout= or look at what the worker is doing",
                                  seconds=self._timeout, item=i, worker_id=None if h is None else h.worker_id,
                                  pid=None if h is None else h.pid)

    def _drain(self, h: WorkerHandle) -> None:
        while True:
            try:
                if not h.readable():
                    return
                msg = h.recv()
            except (EOFError, OSError):  # the worker died; its sentinel tells the rest
                return
            self._handle(h, msg)

    def _handle(self, h: WorkerHandle, msg) -> None:
        if isinstance(msg, WorkerFailed):
            report = pickle.loads(msg.report)
            exc = _rebuild_error(report, f"seqloader: {msg.stage} failed in worker {h.worker_id} (pid {h.pid})")
            self._fail(f"{msg.stage} failed in worker {h.worker_id}", exc)
        while h.pending and h.pending[0][:2] != (msg.gen, msg.index):
            h.pending.popleft()  # a reply lost to an interrupt: never wait for it
        if not h.pending:  # pragma: no cover - defensive: a reply for no job
            return
        gen, index, sid = h.pending.popleft()
        crew = self._crew
        crew.pool.mapped_by_worker(sid)
        if isinstance(msg, Cancelled) or msg.gen != self._gen:
            crew.pool.release(sid)
        else:
            self._ready[index] = (msg, h)

    def _worker_of(self, i: int) -> WorkerHandle | None:
        for h in self._crew.handles:
            if any(g == self._gen and j == i for g, j, _ in h.pending):
                return h
        return None

    def _fail_dead(self, h: WorkerHandle, i: int) -> None:
        item = h.pending[0][1] if h.pending else None
        what = f"while producing item {item}" if item is not None else f"while idle (reading item {i})"
        msg = f"seqloader worker {h.worker_id} (pid {h.pid}) {h.exit_description()} {what}"
        self._fail(msg, WorkerDied(f"{self!r}: {msg}", worker_id=h.worker_id, pid=h.pid,
                                   exitcode=h.process.exitcode, item=item))

    def _fail(self, why: str, exc: BaseException) -> None:
        self._broken = why
        self.close()
        raise exc


def _check_seq(op: str, seq: Any) -> int:
    try:
        return len(seq)
    except TypeError:
        raise TypeError(f"{op}: seq must be a sequence with len() and integer indexing "
                        f"(got {type(seq).__name__})") from None


def _resolve_context(ctx: Any):
    if ctx is None:
        return multiprocessing.get_context()
    if isinstance(ctx, str):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError(f"prefetch: multiprocessing_context {ctx!r} is not a start method here "
                             f"(expected one of {', '.join(methods)}, or a multiprocessing context object)")
        return multiprocessing.get_context(ctx)
    if not (hasattr(ctx, "Process") and hasattr(ctx, "Pipe")):
        raise TypeError(f"prefetch: multiprocessing_context must be None, a start method name or a "
                        f"multiprocessing context (got {type(ctx).__name__})")
    return ctx


def prefetch(seq: Sequence, num_workers: int, *, prefetch_factor: int = 2, multiprocessing_context: Any = None,
             worker_init_fn: Callable[[int], None] | None = None, timeout: float = 0,
             shared: Any = None) -> Prefetch:
    """Compute the items of ``seq`` ahead of the reader, in ``num_workers`` worker processes.

    The result is ordered and index-addressable like ``seq``. Reading item ``i`` keeps items
    ``i+1 .. i+num_workers*prefetch_factor`` in flight; reading any other item than the next
    re-targets the workers (items in between are never computed). Workers start on the first
    read and live until :meth:`Prefetch.close` (or ``with``/``del``/gc), across seeks and
    :meth:`Prefetch.reset`. Arrays and tensors in items come back as views of shared memory
    that stay valid as long as they are referenced.

    Workers do nothing to the global RNGs: under ``fork`` they start with the parent's states,
    so draw randomness with :func:`seqloader.rng_map` (a generator per item), or seed in
    ``worker_init_fn``. ``seqloader.DataLoader`` does the seeding torch's ``DataLoader`` does.

    Args:
        seq: a sequence (``len`` and integer indexing); picklable for ``spawn``/``forkserver``.
        num_workers: worker processes, ``>= 1`` (there is no in-process fallback: read ``seq``).
        prefetch_factor: jobs in flight per worker, ``>= 1``.
        multiprocessing_context: ``None`` (platform default), ``"fork"``, ``"spawn"``,
            ``"forkserver"`` or a ``multiprocessing`` context object.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each worker before it
            computes anything (an error there is raised by the first read, naming the worker).
        timeout: seconds to wait for one item before ``RuntimeError``; ``0`` waits forever
            (worker deaths are still detected at once).
        shared: an object sent to each worker once, at start (typically the dataset that
            every sequence passed to :meth:`Prefetch.reset` reads): a later sequence that
            references it is pickled with a reference instead of a copy. Default: ``seq``.

    Returns:
        A :class:`Prefetch` of ``len(seq)`` items.

    Raises:
        TypeError: ``seq`` has no ``len``; an argument has the wrong type.
        ValueError: ``num_workers < 1``, ``prefetch_factor < 1``, ``timeout < 0`` or an unknown
            start method.

    Example:
        >>> with prefetch(range(10), num_workers=2) as p:
        ...     p[0], p[-1], list(p[3:6])
        (0, 9, [3, 4, 5])
        >>> prefetch(range(10), num_workers=0)
        Traceback (most recent call last):
        ValueError: prefetch: num_workers must be a positive int (got 0); to evaluate in this process, read the sequence directly
    """
    _check_seq("prefetch", seq)
    workers = _check_workers(num_workers)
    prefetch_factor = check_positive_int("prefetch", "prefetch_factor", prefetch_factor)
    ctx = _resolve_context(multiprocessing_context)
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"prefetch: worker_init_fn must be callable or None (got {type(worker_init_fn).__name__})")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"prefetch: timeout must be a number of seconds (got {type(timeout).__name__})")
    if not timeout >= 0:
        raise ValueError(f"prefetch: timeout must be >= 0 (got {timeout}); 0 waits forever")
    return Prefetch(seq, workers, prefetch_factor, ctx, worker_init_fn, float(timeout), shared)


def _check_workers(num_workers: Any) -> int:
    n = check_int("prefetch", "num_workers", num_workers)
    if n < 1:
        raise ValueError(f"prefetch: num_workers must be a positive int (got {n}); to evaluate in this process, "
                         "read the sequence directly")
    return n
