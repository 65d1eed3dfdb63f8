"""The reader's side of the result pipes: replies of the current generation and the one bounded wait.

An :class:`Inbox` belongs to one :class:`~seqloader.prefetcher.prefetch.Prefetch`. It holds the
generation number, the completed items of that generation (in the order their replies were
handled), and :meth:`Inbox.pump`: the single wait every reader uses (in-order reads,
:meth:`~seqloader.prefetcher.prefetch.Prefetch.take` and
:meth:`~seqloader.prefetcher.prefetch.Prefetch.start`). A pump is one ``poll`` on every result
pipe *and* every process sentinel, at most :data:`STATUS_CHECK_INTERVAL` seconds long, followed
by a liveness check; a dead worker is replaced by the owner's :class:`~seqloader.prefetcher.healing.Healer`
(``restarts > 0``) or closes the workers and raises, and a failed set-up closes the workers and
raises (see the shutdown and healing NOTEs in :mod:`seqloader.prefetcher.crew`).
"""

from __future__ import annotations

import functools
import pickle
import time
from typing import Any, Callable, NoReturn, Optional

from seqloader.prefetcher.crew import Crew, WorkerHandle
from seqloader.prefetcher.faults import ItemTimeout, WorkerDied, rebuild_error
from seqloader.prefetcher.messages import Cancelled, Failure, Ready, WorkerFailed
from seqloader.prefetcher.shm import read_and_release

__all__ = ["START_TIMEOUT", "STATUS_CHECK_INTERVAL", "Inbox"]

#: Longest single wait (seconds) before the reader re-checks that every worker is alive.
STATUS_CHECK_INTERVAL = 5.0
#: How long :meth:`Prefetch.start` waits for every worker's set-up (or ``timeout``, if longer).
START_TIMEOUT = 300.0


class Inbox:
    """Replies for one reader: ``ready`` maps item index -> ``(Result or Failure, worker)``.

    ``label`` is the owner's ``repr``, used in messages (the owner updates it when its length
    changes). ``broken`` says why the workers were closed after an error, if they were.
    """

    def __init__(self, crew: Crew, label: str):
        self.crew, self.label = crew, label
        self.gen = 0
        self.ready: dict[int, tuple] = {}
        self.broken: str | None = None
        self.shm_bytes = 0   # bytes of replies that came through shared-memory slots
        self.reads = 0       # items read ...
        self.ready_sum = 0   # ... and how many were already computed at each read (read-ahead used)
        self.stages: dict[str, float] = {}  # seconds per stage, summed over workers (when they time stages)
        self.healer: Any = None  # a Healer when dead workers are replaced (restarts > 0)
        self._describe: Optional[Callable[[int], str]] = None  # the owner's words for an item

    def name_items(self, describe: Optional[Callable[[Any, int], str]], seq: Any) -> None:
        """Name the items of ``seq`` (the sequence now read) with ``describe(seq, i)`` in messages."""
        self._describe = None if describe is None else functools.partial(describe, seq)

    def item_name(self, i: int) -> str:
        """The words for item ``i`` in a message: the owner's ``describe``, else ``"item {i}"``."""
        if self._describe is not None:
            try:
                return self._describe(i)
            except Exception as exc:  # a message must not fail: say so in it
                return f"item {i} (describe raised {type(exc).__name__}: {exc})"
        return f"item {i}"

    def new_generation(self) -> None:
        """Queued jobs become stale, unread results are dropped (their slots released)."""
        self.gen += 1
        for msg, _ in self.ready.values():
            self.crew.pool.release(msg.payload.slot_id)
        self.ready.clear()

    def interrupted(self) -> None:
        """A new generation after ``KeyboardInterrupt`` cut the bookkeeping short, waiting for no
        reply sent before: one may have been read from its pipe but not handled, and a worker
        whose jobs all wait for such a reply would never be sent another. Replies that still come
        answer no pending job and are freed on arrival (:meth:`handle`)."""
        self.new_generation()
        for h in self.crew.handles:
            h.pending.clear()

    def pump(self, wait_s: float, reading: int | None) -> bool:
        """Wait up to ``wait_s`` (at most :data:`STATUS_CHECK_INTERVAL`) and handle what came.

        Args:
            wait_s: seconds to wait for a reply or a worker's exit.
            reading: the item the reader waits for, for messages (``None``: none).

        Returns:
            Whether any reply or exit woke the wait.

        Raises:
            WorkerDied: a worker is gone and is not replaced (the workers are closed first).
            Exception: a worker's set-up failed: its own error (the workers are closed first).
        """
        crew = self.crew
        events = crew.poll(min(wait_s, STATUS_CHECK_INTERVAL))
        dead = [h for h, is_sentinel in events if is_sentinel]
        if not events:
            dead = [h for h in crew.handles if not h.process.is_alive()]
        for h in {h for h, _ in events} | set(dead):
            self.drain(h)
        for h in dead:
            if self.healer is None:
                self.fail_dead(h, reading)
            self.healer.heal(self, h, reading)
        if self.healer is not None:
            self.healer.check_starting(self)
        return bool(events)

    def wait(self, done: Callable[[], bool], timeout: float, reading: Callable[[], int],
             fill: Callable[[], None], waiting_for: Callable[[], str]) -> None:
        """Pump until ``done()``, calling ``fill()`` after each pump (bounded and liveness-checked).

        Raises:
            ItemTimeout: with ``timeout > 0``, nothing came for ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while not done():
            wait_s = STATUS_CHECK_INTERVAL if deadline is None else max(0.0, deadline - time.monotonic())
            events = self.pump(wait_s, reading())
            fill()
            if not events and deadline is not None and time.monotonic() >= deadline and not done():
                raise self.timeout(timeout, reading(), waiting_for())

    def wait_started(self, limit: float) -> None:
        """Wait until every worker has sent :class:`Ready`, bounded by ``limit`` s and liveness."""
        crew = self.crew
        deadline = time.monotonic() + limit
        while not all(h.set_up for h in crew.handles):
            left = deadline - time.monotonic()
            if left <= 0:
                late = ", ".join(f"{h.worker_id} (pid {h.pid})" for h in crew.handles if not h.set_up)
                self.fail("set-up timed out", RuntimeError(
                    f"{self.label}: worker(s) {late} did not finish their set-up (start method, "
                    f"worker_init_fn) within {limit:g} seconds; look at what worker_init_fn does"))
            self.pump(left, None)
        crew.running = True

    def drain(self, h: WorkerHandle) -> None:
        """Handle every reply waiting on ``h``'s result pipe."""
        while True:
            try:
                if not h.readable():
                    return
                msg = h.recv()
            except (EOFError, OSError):  # the worker died; its sentinel tells the rest
                return
            self.handle(h, msg)

    def handle(self, h: WorkerHandle, msg) -> None:
        if isinstance(msg, Ready):
            h.set_up = True
            return
        if isinstance(msg, WorkerFailed):
            report = pickle.loads(msg.report)
            exc = rebuild_error(report, f"seqloader: {msg.stage} failed in worker {h.worker_id} (pid {h.pid})")
            self.fail(f"{msg.stage} failed in worker {h.worker_id}", exc)
        pool = self.crew.pool
        if not any(job[:2] == (msg.gen, msg.index) for job in h.pending):
            # A job sent just before an interrupt cut its bookkeeping short: its reply answers
            # nothing we wait for. Free its slot; leave the jobs we do wait for alone.
            sid = msg.slot_id if isinstance(msg, Cancelled) else msg.payload.slot_id
            pool.mapped_by_worker(sid)
            pool.release(sid)
            return
        while h.pending[0][:2] != (msg.gen, msg.index):
            h.pending.popleft()  # replies lost to an interrupt (replies come in job order)
        gen, index, sid = h.pending.popleft()
        if not isinstance(msg, Cancelled):
            h.busy_s += msg.seconds
            h.items += 1
            self.shm_bytes += msg.payload.data_len + sum(n for _, n in msg.payload.buffers)
            for name, seconds in msg.stages:
                self.stages[name] = self.stages.get(name, 0.0) + seconds
        pool.mapped_by_worker(sid)
        if isinstance(msg, Cancelled) or msg.gen != self.gen:
            pool.release(sid)
        else:
            self.ready[index] = (msg, h)

    def worker_of(self, i: int) -> WorkerHandle | None:
        """The worker computing item ``i`` of the current generation, if any."""
        for h in self.crew.handles:
            if any(g == self.gen and j == i for g, j, _ in h.pending):
                return h
        return None

    def item_error(self, failure: Failure, i: int, h: WorkerHandle) -> BaseException:
        """The error item ``i`` raised in worker ``h``, rebuilt from its slot (released)."""
        report = read_and_release(failure.payload, self.crew.pool)
        return rebuild_error(report, f"seqloader: raised while computing item {i} of {self.label} in worker "
                                     f"{h.worker_id} (pid {h.pid})", index=i)

    def timeout(self, seconds: float, item: int, waiting_for: str) -> ItemTimeout:
        """The error for a wait longer than ``seconds`` (the reader stays usable)."""
        h = self.worker_of(item)
        who = f" from worker {h.worker_id} (pid {h.pid})" if h is not None else ""
        return ItemTimeout(f"{self.label}: timed out after {seconds} seconds waiting for {waiting_for}"
                           f"{who}; increase timeout= or look at what the worker is doing",
                           seconds=seconds, item=item, worker_id=None if h is None else h.worker_id,
                           pid=None if h is None else h.pid)

    def death(self, h: WorkerHandle, reading: int | None) -> tuple[str, Optional[int]]:
        """How worker ``h`` died, for messages, and the item it was producing (``None``: it was
        idle or had not finished its set-up)."""
        item = h.pending[0][1] if h.pending and h.set_up else None
        if not h.set_up:
            what = "while starting (before its set-up and worker_init_fn finished)"
        elif item is not None:
            what = f"while producing {self.item_name(item)}"
        else:
            what = "while idle" + (f" (reading item {reading})" if reading is not None else "")
        return f"seqloader worker {h.worker_id} (pid {h.pid}) {h.exit_description()} {what}", item

    def fail_dead(self, h: WorkerHandle, reading: int | None, why_not: str = "",
                  cause: BaseException | None = None, poison: bool = False) -> NoReturn:
        """Raise for a worker that is gone: the reason it reported last, if any (a worker that
        sent :class:`WorkerFailed` exits at once, so a send to it can fail before its report is
        read), else :class:`WorkerDied` (``why_not``: why it is not replaced, appended)."""
        self.drain(h)  # raises its WorkerFailed, if it sent one
        msg, item = self.death(h, reading)
        msg += why_not
        exc = WorkerDied(f"{self.label}: {msg}", worker_id=h.worker_id, pid=h.pid,
                         exitcode=h.process.exitcode, item=item, poison=poison)
        exc.__cause__ = cause
        self.fail(msg, exc)

    def fail(self, why: str, exc: BaseException) -> NoReturn:
        """Close the workers and slots (the shutdown protocol), then raise ``exc``."""
        self.broken = why
        self.ready.clear()
        self.crew.close()
        raise exc
