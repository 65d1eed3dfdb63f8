"""The reader's side of the executor: replies of the current generation, and the one bounded wait.

An :class:`Inbox` belongs to one :class:`~seqloader.prefetcher.prefetch.Prefetch`. It holds the
generation number, the completed items of that generation (in the order their replies were
handled) and :meth:`Inbox.pump`: the single wait every reader uses (in-order reads,
:meth:`~seqloader.prefetcher.prefetch.Prefetch.take` and
:meth:`~seqloader.prefetcher.prefetch.Prefetch.start`). A pump is one
:meth:`~seqloader.prefetcher.executor.Executor.poll`, at most :data:`STATUS_CHECK_INTERVAL`
seconds long, which also reports dead workers; a dead worker is replaced by the owner's
:class:`~seqloader.prefetcher.healing.Healer` (``restarts > 0``) or closes the workers and
raises, and a failed set-up closes the workers and raises. The messages of item errors,
timeouts and deaths are written here, once for every executor.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, NoReturn, Optional

from seqloader.errors import add_note
from seqloader.prefetcher.executor import Died, Done, SetupFailed, Started
from seqloader.prefetcher.faults import INDEX_ATTR, SETUP_STEP, ItemTimeout, WorkerDied
from seqloader.prefetcher.roster import Member, Roster

__all__ = ["START_TIMEOUT", "STATUS_CHECK_INTERVAL", "Inbox"]

#: Longest single wait (seconds) before the reader re-checks that every worker is alive.
STATUS_CHECK_INTERVAL = 5.0
#: How long :meth:`Prefetch.start` waits for every worker's set-up (or ``timeout``, if longer).
START_TIMEOUT = 300.0


class Inbox:
    """Replies for one reader: ``ready`` maps item index -> ``(reply, member)``.

    ``label`` is the owner's ``repr``, used in messages (the owner updates it when its length
    changes). ``broken`` says why the workers were closed after an error, if they were.
    """

    def __init__(self, roster: Roster, label: str):
        self.roster, self.executor, self.label = roster, roster.executor, label
        self.gen = 0
        self.ready: dict[int, tuple[Any, Member]] = {}
        self.broken: str | None = None
        self.reads = 0       # items read ...
        self.ready_sum = 0   # ... and how many were already computed at each read (read-ahead used)
        self.stages: dict[str, float] = {}  # seconds per stage, summed over workers (when they time stages)
        self.healer: Any = None  # a Healer when dead workers are replaced (restarts > 0)
        self.listener: Optional[Callable[[Done, Any], None]] = None  # told of each item computed (a trace)
        self._describe: Optional[Callable[[int], str]] = None  # the owner's words for an item
        self._read: Any = None  # the sequence now read

    def name_items(self, describe: Optional[Callable[[Any, int], str]], seq: Any) -> None:
        """Name the items of ``seq`` (the sequence now read) with ``describe(seq, i)`` in messages."""
        self._describe = None if describe is None else functools.partial(describe, seq)
        self._read = seq

    def item_name(self, i: int) -> str:
        """The words for item ``i`` in a message: the owner's ``describe``, else ``"item {i}"``."""
        if self._describe is not None:
            try:
                return self._describe(i)
            except Exception as exc:  # a message must not fail: say so in it
                return f"item {i} (describe raised {type(exc).__name__}: {exc})"
        return f"item {i}"

    def counters(self) -> dict:
        """What :meth:`Prefetch.counters <seqloader.prefetcher.prefetch.Prefetch.counters>` returns."""
        workers = self.roster.counters()
        return {"workers": workers, "reads": self.reads, "ready_sum": self.ready_sum,
                "shm_bytes": self.executor.counters().get("shm_bytes", 0),
                "restarts": sum(w["restarts"] for w in workers), "stages": dict(self.stages),
                "executor": self.executor.kind}

    # -- generations -----------------------------------------------------------------------------

    def new_generation(self) -> None:
        """Queued jobs become stale, unread results are dropped (their resources released)."""
        self.gen += 1
        self.executor.new_generation(self.gen)
        drop = self.executor.drop
        for reply, _ in self.ready.values():
            drop(reply)
        self.ready.clear()

    def interrupted(self) -> None:
        """A new generation after ``KeyboardInterrupt`` cut the bookkeeping short, waiting for no
        reply sent before: one may have been received but not handled, and a worker whose jobs
        all wait for such a reply would never be sent another. Replies that still come answer no
        pending job and are dropped on arrival (:meth:`_done`)."""
        self.new_generation()
        self.roster.forget_pending()

    # -- the wait ----------------------------------------------------------------------------------

    def pump(self, wait_s: float, reading: int | None) -> bool:
        """Wait up to ``wait_s`` (at most :data:`STATUS_CHECK_INTERVAL`) and handle what came.

        Args:
            wait_s: seconds to wait for a reply or a worker's exit.
            reading: the item the reader waits for, for messages (``None``: none).

        Returns:
            Whether anything woke the wait.

        Raises:
            WorkerDied: a worker is gone and is not replaced (the workers are closed first).
            Exception: a worker's set-up failed: its own error (the workers are closed first).
        """
        events = self.executor.poll(min(wait_s, STATUS_CHECK_INTERVAL))
        for ev in events:
            if type(ev) is Done:
                self._done(ev)
            elif type(ev) is Started:
                self.roster.members[ev.worker].set_up = True
            elif type(ev) is SetupFailed:
                # a set-up of the caller's own (the loader's) may say which step of it failed, so that
                # the note does not blame a worker_init_fn the user never passed
                stage = getattr(ev.error, SETUP_STEP, None) or ev.stage
                add_note(ev.error, f"seqloader: {stage} failed in {self.executor.who(ev.worker)}")
                self.fail(f"{stage} failed in worker {ev.worker}", ev.error)
            elif type(ev) is Died:
                m = self.roster.members[ev.worker]
                if self.healer is None:
                    self.fail_dead(m, reading)
                self.healer.heal(self, m, reading)
        if self.healer is not None:
            self.healer.check_starting(self)
        return bool(events)

    def _done(self, ev: Done) -> None:
        m = self.roster.members[ev.worker]
        key = (ev.gen, ev.index)
        if key not in m.pending:
            # A job sent just before an interrupt cut its bookkeeping short: its reply answers
            # nothing we wait for.
            if ev.reply is not None:
                self.executor.drop(ev.reply)
            return
        del m.pending[key]
        if ev.reply is None:  # skipped: a newer generation was queued
            return
        m.busy_s += ev.seconds
        m.cpu_s += ev.cpu
        m.items += 1
        for name, seconds in ev.stages:
            self.stages[name] = self.stages.get(name, 0.0) + seconds
        if self.listener is not None:  # (one check per item while nobody listens)
            self.listener(ev, self._read if ev.gen == self.gen else None)
        if ev.gen != self.gen:
            self.executor.drop(ev.reply)
        else:
            self.ready[ev.index] = (ev.reply, m)

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
        """Wait until every worker has finished its set-up, bounded by ``limit`` s and liveness."""
        members = self.roster.members
        deadline = time.monotonic() + limit
        while not all(m.set_up for m in members):
            left = deadline - time.monotonic()
            if left <= 0:
                late = ", ".join(self.executor.who(m.worker_id) for m in members if not m.set_up)
                self.fail("set-up timed out", RuntimeError(
                    f"{self.label}: {late} did not finish their set-up (start method, "
                    f"worker_init_fn) within {limit:g} seconds; look at what worker_init_fn does"))
            self.pump(left, None)
        self.roster.running = True

    # -- outcomes and errors -----------------------------------------------------------------------

    def result(self, i: int, reply: Any, m: Member) -> Any:
        """The value of item ``i`` from ``reply``, or raise its own error with a note naming the
        item and the worker (and ``exc.seqloader_index = i``)."""
        try:
            ok, out = self.executor.outcome(reply)
        except Exception as exc:  # e.g. a class that exists only in the worker: the item is read
            _mark(exc, i, f"seqloader: raised while reading item {i} of {self.label} from "
                          f"{self.executor.who(m.worker_id)}")
            raise
        if ok:
            return out
        if not isinstance(out, Exception):  # SystemExit, KeyboardInterrupt, GeneratorExit from the item
            out = item_exit_error(out, self.item_name(i), self.executor.who(m.worker_id))
        _mark(out, i, f"seqloader: raised while computing item {i} of {self.label} in "
                      f"{self.executor.who(m.worker_id)}")
        raise out

    def timeout(self, seconds: float, item: int, waiting_for: str) -> ItemTimeout:
        """The error for a wait longer than ``seconds`` (the reader stays usable)."""
        m = self.roster.worker_of(self.gen, item)
        w = None if m is None else m.worker_id
        who = f" from {self.executor.who(w)}" if w is not None else ""
        return ItemTimeout(f"{self.label}: timed out after {seconds} seconds waiting for {waiting_for}"
                           f"{who}; increase timeout= or look at what the worker is doing",
                           seconds=seconds, item=item, worker_id=w,
                           pid=None if w is None else self.executor.pid(w))

    def suspects(self, m: Member) -> list[int]:
        """The items of the current generation the dead worker ``m`` was computing when it died,
        when its executor knows (several threads per worker process: every job begun and not
        answered); empty otherwise (then :meth:`Member.first_pending` is the item)."""
        running = getattr(self.executor, "running", None)
        jobs = running(m.worker_id) if running is not None and m.set_up else None
        return [] if jobs is None else [i for g, i in jobs if g == self.gen]

    def death(self, m: Member, reading: int | None) -> tuple[str, Optional[int]]:
        """How worker ``m`` died, for messages, and the item it was producing (``None``: it was
        idle, had not finished its set-up, or was computing several items: :meth:`suspects`)."""
        how, _ = self.executor.death(m.worker_id)
        running = getattr(self.executor, "running", None)
        jobs = running(m.worker_id) if running is not None and m.set_up else None
        several: list[int] = []
        if jobs is None:
            item = m.first_pending() if m.set_up else None
        else:
            several = self.suspects(m)
            item = several[0] if len(several) == 1 else None
        if not m.set_up:
            what = "while starting (before its set-up and worker_init_fn finished)"
        elif len(several) > 1:
            what = (f"while its threads were producing {', '.join(self.item_name(i) for i in several)}: one of "
                    "them (or something else in the process) ended it, and which one cannot be told; with "
                    "restarts each is computed again alone, which names the one")
        elif item is not None:
            what = f"while producing {self.item_name(item)}"
        else:
            what = "while idle" + (f" (reading item {reading})" if reading is not None else "")
        return f"seqloader {self.executor.who(m.worker_id)} {how} {what}", item

    def fail_dead(self, m: Member, reading: int | None, why_not: str = "",
                  cause: BaseException | None = None, poison: bool = False) -> NoReturn:
        """Raise :class:`WorkerDied` for a worker that is gone (``why_not``: why it is not
        replaced, appended), after closing everything."""
        msg, item = self.death(m, reading)
        msg += why_not
        w = m.worker_id
        several = self.suspects(m) if item is None else []
        exc = WorkerDied(f"{self.label}: {msg}", worker_id=w, pid=self.executor.pid(w),
                         exitcode=self.executor.death(w)[1], item=item, poison=poison,
                         suspects=tuple(several) if len(several) > 1 else ())
        exc.__cause__ = cause
        self.fail(msg, exc)

    def fail(self, why: str, exc: BaseException) -> NoReturn:
        """Close the workers (the shutdown protocol), then raise ``exc``."""
        self.abandon(why)
        raise exc

    def abandon(self, why: str) -> None:
        """Close the workers and drop what came (the caller raises): nothing is read after this."""
        self.broken = self.broken or why
        self.ready.clear()
        self.executor.close()

    # -- healing (healing.py decides; these are its verbs) -------------------------------------------

    def take_owed(self, m: Member) -> list[int]:
        """Everything dead worker ``m`` owes of the current generation, in increasing order: its
        jobs without a reply, and its replies that came but were not returned (dropped here)."""
        owed = set(m.owed(self.gen))
        mine = [i for i, (_, by) in self.ready.items() if by is m]
        for i in mine:
            self.executor.drop(self.ready.pop(i)[0])
        owed.update(mine)
        return sorted(owed)

    def replace(self, m: Member, seq: Any, owed: list[int]) -> Member:
        """Start a replacement of ``m`` reading ``seq`` and send it ``owed``, in order."""
        new = self.roster.replace(m, seq)
        for j in owed:
            self.roster.submit(new, self.gen, j)
        return new


def item_exit_error(exc: BaseException, item: str, who: str) -> RuntimeError:
    """The error an item's ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit`` becomes, the
    same on every executor: it must end neither a worker process nor the training process (a
    thread worker runs there). The original is its ``__cause__``, and its notes are copied.

    Example:
        >>> str(item_exit_error(SystemExit(3), "batch 14", "worker 0 (pid 42)")).split(";")[0]
        'seqloader: an item raised SystemExit(3) in batch 14, in worker 0 (pid 42)'
    """
    args = ", ".join(map(repr, exc.args))
    err = RuntimeError(f"seqloader: an item raised {type(exc).__name__}({args}) in {item}, in {who}; it is "
                       f"reported as this error on every executor (a {type(exc).__name__} in an item must not "
                       "end a worker or the training process); raise an Exception to fail an item")
    err.__cause__ = exc
    for note in getattr(exc, "__notes__", ()):  # where it was raised (a stage's note naming the item)
        add_note(err, note)
    return err


def _mark(exc: BaseException, i: int, note: str) -> None:
    add_note(exc, note)
    try:
        setattr(exc, INDEX_ATTR, i)
    except AttributeError:  # pragma: no cover - an exception with __slots__
        pass
