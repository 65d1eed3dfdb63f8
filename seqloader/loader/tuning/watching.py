"""L3: what the loader shows of itself while it runs: ``stats``, ``trace``, ``totals``, ``log_stats``.

:class:`Watching` is a part of :class:`seqloader.DataLoader`, built for each call from the loader's
public settings, its :class:`~seqloader.loader.tuning.stats.LoaderStats` and its tuner (it holds
nothing between calls); nothing it does changes a batch or the state. The loader's methods of the
same names call these and show their docstrings (:func:`~seqloader.loader.verbs.documented`).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from seqloader.loader.settings import Settings
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.loader.tuning.trace import DEFAULT_MAX_EVENTS, Trace

__all__ = ["Watching"]


class Watching:
    """The observing verbs of :class:`seqloader.DataLoader` (see the module docstring).

    Args:
        loader: the loader's public settings (``batch_sampler`` too: torch's attribute).
        stats: its :class:`~seqloader.loader.tuning.stats.LoaderStats`.
        tuning: its autotune part, or ``None``.
    """

    def __init__(self, loader: Settings, stats: LoaderStats, tuning: Any = None):
        self._loader, self._stats, self._tuning = loader, stats, tuning

    def stats(self) -> dict:
        """Where the time goes, for the current and the last epoch: is the loop waiting for data?

        Returns:
            ``{"current": {...} or None, "last": {...} or None, "resumes": int, "hint": str or None}``;
            an epoch entry is ``EpochStats.as_dict()`` (``loader/tuning/stats.py``: ``wait_s``, ``work_s``,
            ``input_bound``, ``startup_s``, ``workers``, ``stages``, ...). ``hint`` suggests more
            workers when the loop is input-bound, names slow start-up and the slowest stage. With
            ``autotune``, also ``"autotune"`` (its trials, choice and reason: ``docs/autotune.md``),
            and ``hint`` is that measured reason.

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(8), batch_size=4, seed=0); _ = list(loader)
            >>> s = loader.stats(); s["current"]["batches"], 0 <= s["current"]["input_bound"] <= 1
            (2, True)
        """
        loader = self._loader
        out = self._stats.report(loader.num_workers, os.cpu_count(), loader.persistent_workers, dataset=loader.dataset)
        if self._tuning is not None:  # measured, not guessed: the tuner's choice and its reason
            out["autotune"] = self._tuning.report()
            out["hint"] = out["autotune"]["reason"]
        return out

    def trace(self, path: Any, *, max_events: int = DEFAULT_MAX_EVENTS) -> Trace:
        """``with loader.trace(path):`` records a timeline of the workers and the training loop
        while the block runs, and writes it to ``path`` when it exits (by an exception too): a
        Chrome trace event file for Perfetto (ui.perfetto.dev, "Open trace file") or
        ``chrome://tracing``. One lane per worker with an event per batch it computed (``"batch
        b"``, its number in the epoch) and, with ``profile_stages=True``, per stage; a lane for the
        training loop with each wait for data; microseconds of ``time.perf_counter_ns()``'s clock.
        See ``docs/input_bound.md`` and ``loader/tuning/trace.py``.

        Args:
            path: the file to write (created at entry: an unwritable path fails there).
            max_events: the most events kept (the first ones); beyond, a warning and
                ``otherData["dropped_events"]`` in the file.

        Returns:
            The context manager (its ``dropped``: events not kept).

        Raises:
            ValueError: ``max_events`` is not positive, or a trace of this loader is already recording.
            OSError: ``path`` cannot be written.

        Example:
            >>> import json, os, tempfile
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(8), batch_size=4, seed=0)
            >>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
            >>> with loader.trace(path):
            ...     batches = list(loader)
            >>> events = json.load(open(path))["traceEvents"]
            >>> [e["name"] for e in events if e["ph"] == "X"]   # num_workers=0: no worker lane
            ['wait for data', 'wait for data']
            >>> with loader.trace(path):
            ...     loader.trace(path).__enter__()
            Traceback (most recent call last):
            ValueError: DataLoader.trace: a trace is already recording this loader (to '...'); record one at a time
        """
        return Trace(self._stats, path, max_events)

    def totals(self, count_samples: bool = False) -> dict:
        """What the training loop consumed since this loader was built: a dashboard's counters.

        Unlike :meth:`stats` (the current and the last epoch), the numbers only grow: they sum
        every epoch of this loader object (a loader resumed from a state in a new process starts at
        0: a state holds positions, not measures). :func:`seqloader.export_metrics` reads them at
        each scrape, from its own thread; reading changes no batch and no state.

        Args:
            count_samples: from now on, also count the samples in each batch delivered (the length
                of its first tensor or array along dim 0, ``len()`` of a list of other things; one
                per batch without automatic batching); ``samples`` is ``None`` until then.

        Returns:
            ``{"batches", "samples", "wait_s", "wait_buckets", "worker_restarts", "workers",
            "input_bound"}``: batches consumed (returned or raised) and the seconds the loop waited
            for them, those waits as a cumulative histogram (``((upper_bound_s, count), ...)``, 100 µs
            to 10 s, then ``inf``), dead workers replaced, per worker index ``busy_s``/``cpu_s``/
            ``items``/``restarts`` (read-ahead included), and the current epoch's input-bound
            fraction (``loader/tuning/totals.py``).

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(10), batch_size=4, seed=0)
            >>> loader.totals(count_samples=True)["samples"]
            0
            >>> _ = list(loader); _ = list(loader)
            >>> t = loader.totals(); t["batches"], t["samples"], t["wait_buckets"][-1], t["workers"]
            (6, 20, (inf, 6), [])
        """
        if count_samples:
            self._stats.totals.count_samples(one_per_batch=getattr(self._loader, "batch_sampler", None) is None)
        return self._stats.read_totals()

    def log_stats(self, every_s: Optional[float]) -> None:
        """Log a line on the ``seqloader.stats`` logger (INFO) at most every ``every_s`` seconds
        while iterating (``None``: off, the default)."""
        if every_s is not None and not every_s > 0:
            raise ValueError(f"DataLoader.log_stats: every_s must be > 0 or None (got {every_s!r})")
        self._stats.log_every_s = every_s
