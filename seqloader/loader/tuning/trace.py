"""L3: ``with loader.trace(path):``, a timeline of the workers and the training loop (issue 45).

While the block runs, a :class:`Trace` records a Chrome trace event file (the JSON object format,
``{"traceEvents": [...]}``), which Perfetto (ui.perfetto.dev, "Open trace file") and
``chrome://tracing`` open, and writes it when the block exits, by an exception too:

* one lane per worker (a process, a thread or a Ray actor; trace ``pid`` ``1 + w``, named
  ``"worker w"``), with a complete event (``"ph": "X"``) per batch it computed, named
  ``"batch b"`` (``b``: its number in the epoch, after a resume too; ``args``: ``batch``,
  ``index``; an ``IterableDataset``'s stream items: ``"item i"``, ``args["item"]``); with
  ``profile_stages=True``, an event per stage inside it (see below). A batch is recorded when its
  reply reaches the loader while the block runs (it may have begun just before). A worker
  computing several batches at once (``threads_per_worker``) gets one row per batch it computes
  at the same time (``tid`` 0, 1, ...). A batch computed for a read that was superseded since (a
  seek, a new recipe) is ``"superseded"``.
* the training loop's lane (``pid`` 0, ``"training loop"``): each ``next()`` as ``"wait for
  data"`` (``args``: ``next``, the count of ``next()`` calls in the trace); at ``num_workers=0`` the
  batch is computed inside that wait.
* timestamps (``ts``) and durations in microseconds of the clock ``time.perf_counter_ns()`` reads
  (CLOCK_MONOTONIC on Linux): the same for every process of a host, worker processes and Ray
  actors on the host included (an actor on another node reads its own node's clock). torch's
  profiler exports wall-clock microseconds less its ``baseTimeNanoseconds``: ``otherData`` holds
  ``unix_minus_clock_ns`` (``time.time_ns() - time.perf_counter_ns()`` when the trace began), the
  shift that puts both files on one time line (``tools/trace_view.py``'s ``merge``).

Stage events: a worker times its stages as totals per batch (``profile_stages``: the seconds of
each stage *exclusive* of the stages inside it; an ``smap`` runs once per sample). So each
stage's event is as long as the stage took in that batch, and the events are laid one after
another from the batch's start, in the order the stages first ended: their lengths are true,
their places inside the batch are not.

What it costs: the workers read the clock twice per batch, as they did for ``stats()``, and the
reply they already send carries when the batch began (:class:`~seqloader.prefetcher.executor.Done`):
no extra message. With no trace, the training thread pays one attribute check per ``next()``
(:meth:`~seqloader.loader.tuning.stats.LoaderStats.returned`) and one per batch received
(:meth:`~seqloader.prefetcher.prefetch.Prefetch.listen`). Memory is bounded: at most
``max_events`` events are kept (the first ones); the file's ``otherData`` says how many were
dropped, and a warning says so when the cap is reached.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
import weakref
from typing import Any, Optional

from seqloader._version import __version__
from seqloader.errors import add_note, check_positive_int

__all__ = ["BATCH_CAT", "DEFAULT_MAX_EVENTS", "LOOP", "LOOP_CAT", "STAGE_CAT", "Trace", "WAIT"]

#: The most events a trace keeps unless told otherwise (about 350 bytes each while recording: ~35 MB).
DEFAULT_MAX_EVENTS = 100_000
#: The training loop's lane, and the name of its events.
LOOP, WAIT = "training loop", "wait for data"
#: The events' categories (``cat``): the loop's waits, workers' batches, their stages.
LOOP_CAT, BATCH_CAT, STAGE_CAT = "loop", "batch", "stage"


class Trace:
    """A Chrome trace of one loader's workers and training loop (see the module docstring); the
    context manager ``DataLoader.trace(path)`` returns.

    Args:
        stats: the loader's :class:`~seqloader.loader.tuning.stats.LoaderStats` (its one clock).
        path: where the file is written when the block exits (created, or emptied, at entry: a
            path that cannot be written fails there, not after the run).
        max_events: the most complete events kept.

    Attributes:
        dropped: events not kept (the cap was reached).

    Example:
        >>> from seqloader.loader.tuning.stats import LoaderStats
        >>> import json, os, tempfile
        >>> stats = LoaderStats(); stats.begin(epoch=0)
        >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
        >>> with Trace(stats, path) as t:
        ...     stats.returned(stats.start())           # one next()
        >>> doc = json.load(open(path))
        >>> [(e["name"], e["args"]) for e in doc["traceEvents"] if e["ph"] == "X"]
        [('wait for data', {'next': 1})]
        >>> [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
        ['training loop']
        >>> Trace(stats, path, max_events=0)
        Traceback (most recent call last):
        ValueError: DataLoader.trace: max_events must be a positive int (got 0)
    """

    def __init__(self, stats: Any, path: Any, max_events: int = DEFAULT_MAX_EVENTS):
        self._stats, self.path = stats, os.fspath(path)
        self.max_events = check_positive_int("DataLoader.trace", "max_events", max_events)
        self.dropped = 0
        self._events: list[tuple] = []   # (pid, tid, cat, name, ts_ns, dur_ns, args)
        self._rows: dict[int, list[int]] = {}   # worker -> the end (ns) of each of its rows
        self._who: dict[int, str] = {}
        self._sources: list[weakref.ref] = []
        self._nexts = 0
        self._lock = threading.Lock()    # the reader's thread records, the block's thread writes
        self._offset_ns = 0

    # -- recording (the reader's thread) -----------------------------------------------------------

    def __enter__(self) -> "Trace":
        if self._stats.trace is not None:
            raise ValueError(f"DataLoader.trace: a trace is already recording this loader (to "
                             f"{self._stats.trace.path!r}); record one at a time")
        with open(self.path, "w"):   # fails now if the file cannot be written, not after the run
            pass
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._stats.traced(self)
        return self

    def follow(self, source: Any) -> None:
        """Record the batches ``source`` (a :class:`~seqloader.prefetcher.prefetch.Prefetch`) computes."""
        self._sources = [ref for ref in self._sources if ref() is not None and ref() is not source]
        self._sources.append(weakref.ref(source))
        who = source.executor.who
        with self._lock:
            for w in range(source.executor.num_workers):
                self._who.setdefault(w, who(w))
        source.listen(self.computed)

    def waited(self, start: float, end: float) -> None:
        """A ``next()`` from ``start`` to ``end`` (``time.perf_counter()`` seconds) on the loop's lane."""
        t0 = int(start * 1e9)
        with self._lock:
            self._nexts += 1
            full = self._add((0, 0, LOOP_CAT, WAIT, t0, int(end * 1e9) - t0, {"next": self._nexts}))
        if full:
            self._warn_full()

    def computed(self, done: Any, seq: Any) -> None:
        """A worker's batch (:class:`~seqloader.prefetcher.executor.Done`) of ``seq`` (``None``: superseded)."""
        w, began, stages = done.worker, done.began, done.stages
        if not began:  # when it began is unknown: nothing to place
            return
        dur = max(int(done.seconds * 1e9), int(sum(s for _, s in stages) * 1e9))  # (Ray: transfer follows)
        if seq is None:
            name, args = "superseded", {"index": done.index}
        elif hasattr(seq, "epoch_batch"):   # a map-style epoch's batches (opened mid-way: a resume)
            number = seq.epoch_batch(done.index)
            name, args = f"batch {number}", {"batch": number, "index": done.index}
        else:   # an IterableDataset's streams: the item's place in their round robin
            name, args = f"item {done.index}", {"item": done.index}
        full = False
        with self._lock:
            row = self._row(w, began, began + dur)
            full |= self._add((1 + w, row, BATCH_CAT, name, began, dur, args))
            at = began
            for stage, seconds in stages:
                ns = int(seconds * 1e9)
                full |= self._add((1 + w, row, STAGE_CAT, stage, at, ns, {"batch": args.get("batch")}))
                at += ns
        if full:
            self._warn_full()

    def _row(self, w: int, begin: int, end: int) -> int:
        """The first row of worker ``w`` free at ``begin`` (a worker computing batches at once: several)."""
        rows = self._rows.setdefault(w, [])
        for k, last in enumerate(rows):
            if last <= begin:
                rows[k] = end
                return k
        rows.append(end)
        return len(rows) - 1

    def _add(self, event: tuple) -> bool:
        """Keep ``event`` (the lock held) unless the cap is reached; whether this reached it."""
        if len(self._events) < self.max_events:
            self._events.append(event)
            return False
        self.dropped += 1
        return self.dropped == 1

    def _warn_full(self) -> None:
        warnings.warn(f"DataLoader.trace: {self.max_events} events recorded (max_events={self.max_events}); "
                      "later ones are dropped from the trace", UserWarning, stacklevel=3)

    # -- writing (the block's thread) --------------------------------------------------------------

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        self._stats.traced(None)
        for ref in self._sources:
            source = ref()
            if source is not None:
                source.listen(None)
        try:
            self.write()
        except OSError as err:
            if exc is None:
                raise
            add_note(exc, f"seqloader: the trace could not be written to {self.path!r} ({err})")

    def document(self) -> dict:
        """The trace as a JSON object: ``traceEvents`` (lane names, then the events by time) and
        ``otherData`` (the clock, the cap and what was dropped)."""
        with self._lock:
            events = sorted(self._events, key=lambda e: e[4])
            rows = {w: len(r) for w, r in self._rows.items()}
            dropped, workers = self.dropped, dict(self._who)
        out: list[dict] = _lane(0, 0, LOOP, LOOP)
        for w in sorted(set(rows) | set(workers)):
            for k in range(max(1, rows.get(w, 0))):
                out += _lane(1 + w, k, f"worker {w}", f"worker {w}" if k == 0 else f"worker {w} ({k + 1})")
        out += [{"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts / 1000, "dur": dur / 1000,
                 "args": args} for pid, tid, cat, name, ts, dur, args in events]
        other = {"producer": f"seqloader {__version__}", "clock": "time.perf_counter_ns() (CLOCK_MONOTONIC on Linux)",
                 "unix_minus_clock_ns": self._offset_ns, "max_events": self.max_events, "events": len(events),
                 "dropped_events": dropped, "truncated": dropped > 0,
                 "workers": {str(w): who for w, who in sorted(workers.items())}}
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}

    def write(self) -> None:
        """Write :meth:`document` to ``path`` (whole or not at all: a temporary file renamed)."""
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(self.document()))  # (json.dump encodes in Python, 5x slower)
        os.replace(tmp, self.path)


def _lane(pid: int, tid: int, process: str, thread: str) -> list[dict]:
    """The metadata events naming a lane (and ordering it: the loop first, then the workers)."""
    meta = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}}]
    if tid == 0:
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}] + meta
    return meta
