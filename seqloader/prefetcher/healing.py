"""Healing: a dead worker replaced by a fresh one that recomputes what the reader did not get.

With ``prefetch(..., restarts=N)`` (``N > 0``) the reader's wait (:meth:`Inbox.pump
<seqloader.prefetcher.inbox.Inbox.pump>`) hands every worker it finds dead (SIGKILL from the OOM
killer or a cluster agent, a segfault in a decoder, ``os._exit``) to a :class:`Healer` instead of
failing. The rules (also the healing NOTE in :mod:`seqloader.prefetcher.processes.executor`):

* **What is recomputed.** An item returned to the caller is consumed. Everything else the dead
  worker owed of the current generation is recomputed by its replacement, in increasing order:
  its jobs without a reply, its jobs never sent (its pipe broke) *and* its results that arrived
  but were not yet returned (they are dropped). So a worker that keeps per-process state for
  its items (an iterable stream) restarts right after the last item the caller got.
* **The replacement** keeps the dead worker's ``worker_id`` and ``WorkerConfig``, so its set-up
  (``worker_init_fn``) and seeds are the same. It starts from ``respawn(worker_id)`` when the
  caller gave ``respawn`` and it returns a sequence, else from the current sequence. A layer
  above makes healing exact only through ``respawn`` (the loader rebuilds a stream from its
  recorded progress, as a resume does); the prefetcher knows nothing of what it returns.
* **The executor's part** is :meth:`~seqloader.prefetcher.executor.Executor.replace`: reap the
  dead worker and start another with the same number and set-up (for processes: its shared-memory
  slots are retired, see the healing NOTE in :mod:`seqloader.prefetcher.processes.executor`).
* **Bounds.** At most ``restarts`` replacements per sequence (the first one and each
  :meth:`~seqloader.prefetcher.prefetch.Prefetch.reset`); one more death raises
  :class:`~seqloader.prefetcher.faults.WorkerDied` as without healing. An item that kills two
  workers (the original and its replacement) is a *poison* item: ``WorkerDied`` names it (with
  ``poison=True``) and it is never computed a third time. A replacement that dies before its
  set-up finished, replacing a worker that did too, is not replaced again; a replacement whose
  set-up outlasts the start bound (300 s, or ``timeout``) raises ``RuntimeError``. An error of
  ``respawn`` raises ``WorkerDied`` naming the dead worker, with that error as ``__cause__``.
  Every error closes the ``Prefetch`` first.
* **Never silent.** Each replacement logs a WARNING on the ``seqloader`` logger naming the
  worker, its pid, how it died, the item (in the owner's words: ``prefetch(describe=)``; the
  loader names a batch and its dataset indices), and the items recomputed, and is counted in
  :meth:`~seqloader.prefetcher.prefetch.Prefetch.counters` (``"restarts"``, per worker and in
  all).
"""

from __future__ import annotations

import logging
import reprlib
import time
from typing import Any, Callable, Optional

from seqloader.prefetcher.inbox import Inbox
from seqloader.prefetcher.roster import Member

__all__ = ["Healer"]

_log = logging.getLogger("seqloader")
_short = reprlib.Repr()
_short.maxother = 160  # a sequence op's repr names it; a plain list is cut short


class Healer:
    """Replaces the dead workers of one ``Prefetch``; see the module docstring.

    Args:
        restarts: replacements allowed per sequence, ``>= 1``.
        respawn: ``respawn(worker_id) -> seq or None``, what a replacement starts from
            (``None``, or a ``None`` result: the current sequence).
        seq: the current sequence (the owner calls :meth:`sequence_changed` on ``reset``).
        start_limit: seconds a replacement may take to finish its set-up.
    """

    def __init__(self, restarts: int, respawn: Optional[Callable[[int], Any]], seq: Any, start_limit: float):
        self.restarts, self.respawn, self.start_limit = restarts, respawn, start_limit
        self.seq = seq
        self.used = 0  # replacements for the current sequence
        self._killed: dict[int, str] = {}  # item -> how it killed a worker (current sequence)

    def sequence_changed(self, seq: Any) -> None:
        """The owner reads a new sequence: a new budget, and item numbers mean other items."""
        self.seq, self.used = seq, 0
        self._killed.clear()

    def heal(self, inbox: Inbox, m: Member, reading: Optional[int]) -> None:
        """Replace the dead worker ``m`` and resubmit what it owed, or raise (closing everything)."""
        how, item = inbox.death(m, reading)
        several = inbox.suspects(m) if item is None else []
        if not m.set_up and m.replaces_starting:
            inbox.fail_dead(m, reading, "; not replaced again: it replaced a worker that also died "
                                        "before its set-up finished")
        if item is not None and item in self._killed:
            inbox.fail_dead(m, reading, f"; {inbox.item_name(item)} killed two workers (first: "
                                        f"{self._killed[item]}), so it is a poison item and is not computed again",
                            poison=True)
        if self.used >= self.restarts:
            inbox.fail_dead(m, reading, f"; not replaced: the {self.restarts} restart(s) allowed for "
                                        "this sequence (restarts=) are used")
        killer = f"{inbox.executor.who(m.worker_id)} {inbox.executor.death(m.worker_id)[0]}"
        try:
            self._replace(inbox, m, reading, how, item, killer, several)
        except BaseException:  # a half-done replacement (Ctrl-C, an error) must not be read from
            inbox.abandon(f"replacing worker {m.worker_id} failed")
            raise

    def _replace(self, inbox: Inbox, m: Member, reading: Optional[int], how: str, item: Optional[int],
                 killer: str, several: list) -> None:
        owed = inbox.take_owed(m)
        seq = self.seq
        if self.respawn is not None:
            try:
                fresh = self.respawn(m.worker_id)
            except Exception as exc:
                inbox.fail_dead(m, reading, f"; not replaced: respawn({m.worker_id}) raised "
                                            f"{type(exc).__name__}: {exc}", cause=exc)
            seq = seq if fresh is None else fresh
        new = inbox.replace(m, seq, owed)
        self.used += 1
        if item is not None:
            self._killed[item] = killer
        for i in several:  # computed at once when it died: each is recomputed alone (the executor's part)
            self._killed.setdefault(i, f"{killer}, while computing it and {len(several) - 1} other item(s) at once")
        redo = ", ".join(map(str, owed)) or "none"
        _log.warning("%s: %s; replaced by %s, restart %d of at most %d for this sequence "
                     "(%s); items computed again: %s", inbox.label, how, inbox.executor.who(new.worker_id),
                     self.used, self.restarts, _short.repr(self.seq), redo)

    def check_starting(self, inbox: Inbox) -> None:
        """Raise if a replacement has been in its set-up for longer than the start bound."""
        if not inbox.roster.running:
            return  # the first start has its own bound (Inbox.wait_started)
        now = time.monotonic()
        for m in inbox.roster.members:
            if not m.set_up and now - m.started_at > self.start_limit:
                inbox.fail(f"set-up of replacement worker {m.worker_id} timed out", RuntimeError(
                    f"{inbox.label}: replacement {inbox.executor.who(m.worker_id)} did not finish its "
                    f"set-up (worker_init_fn) within {self.start_limit:g} seconds; look at what "
                    "worker_init_fn does"))
