"""L3: what the training loop consumed since the loader was built: the numbers a dashboard counts.

:class:`~seqloader.loader.tuning.stats.LoaderStats` keeps the current and the last epoch; a
scraper (:func:`seqloader.export_metrics`) wants counters that only grow over the loader's life.
:class:`Totals` holds them: batches and their waits as a histogram (:data:`BOUNDS`, from 100 µs
to 10 s), the samples in those batches (counted once :meth:`Totals.count_samples` was called) and
the worker numbers of the epochs that are over (:meth:`Totals.retire`); the current epoch's are
added when read (:meth:`Totals.read`).

Per delivered batch :meth:`Totals.add` costs one ``bisect`` into a fixed tuple of 16 bounds, one
list increment and one float add (~0.13 µs; the samples, when counted, 0.15-0.35 µs more).
Nothing here imports ``prometheus_client``, and nothing here changes a batch or the state.

**What counts.** Batches the loop consumed (returned by ``next()``, or raised their own error),
not the read-ahead the workers computed; a batch's wait is the time its ``next()`` took (the
loader's one clock, :class:`~seqloader.loader.tuning.stats.BatchClock`). A loader built in a new
process and resumed from a state starts at 0 (the counts are this loader's consumption, not in
the state: a state records positions, never measures); Prometheus reads a counter going back to 0
as a restart (``rate``, ``increase``). The workers' busy seconds count every batch they computed,
read-ahead included (that time was spent).
"""

from __future__ import annotations

import bisect
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["BOUNDS", "RAISED", "Totals", "samples_in", "worker_deltas"]

#: Upper bounds (seconds, inclusive) of the histogram of per-batch waits; one more bucket: +Inf.
BOUNDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: :meth:`Totals.add`'s ``batch`` for a ``next()`` that raised (a batch may be ``None``: it is not the mark).
RAISED = object()

_DEPTH = 4
_ARRAYS = (torch.Tensor, np.ndarray)
_bisect = bisect.bisect_left   # (one lookup less per batch)


def samples_in(batch: Any, depth: int = _DEPTH) -> int:
    """The samples in a collated batch: the length of its first tensor or array along dim 0 (torch's
    ``default_collate`` stacks along it), found through dicts, lists and tuples; ``len()`` of a list
    or tuple of anything else (strings, ints); 0 when neither can be read (an object of a custom
    ``collate_fn`` without a length).

    Example:
        >>> samples_in({"x": torch.zeros(8, 3), "y": [b"a"] * 8}), samples_in([torch.zeros(4), torch.ones(4)])
        (8, 4)
        >>> samples_in(["a", "b", "c"]), samples_in(np.zeros((5, 2))), samples_in(object())
        (3, 5, 0)
    """
    if isinstance(batch, _ARRAYS):
        shape = batch.shape   # (torch.Size and numpy's shape hold ints)
        return shape[0] if shape else 1
    if depth > 0:
        if isinstance(batch, dict):
            for value in batch.values():
                return samples_in(value, depth - 1)
            return 0
        if isinstance(batch, (list, tuple)):
            if batch and isinstance(batch[0], (*_ARRAYS, dict, list, tuple)):
                return samples_in(batch[0], depth - 1)
            return len(batch)
    try:
        return len(batch)
    except TypeError:
        return 0


class Totals:
    """The loader's numbers since it was built (see the module docstring).

    Attributes:
        counts: batches per bucket of :data:`BOUNDS` (the last one: above 10 s), not cumulative.
        wait_s: seconds the loop waited, over every batch counted.
        samples: samples in the batches delivered since :meth:`count_samples`; ``None`` before.
        one_per_batch: each batch is one sample (``batch_size=None``, no ``batch_sampler``).
        gone: ``(workers, restarts, epoch)`` of the epochs that are over: per worker index ``{"busy_s",
            "cpu_s", "items", "restarts"}``, dead workers replaced, and the latest epoch retired (one
            value, replaced whole: a reader in another thread sees all of a retirement or none).

    Example:
        >>> t = Totals()
        >>> t.add(0.003); t.add(20.0)
        >>> r = t.read(t.gone, [], 0, None); r["batches"], r["wait_buckets"][6], r["wait_buckets"][-1], r["samples"]
        (2, (0.01, 1), (inf, 2), None)
        >>> t.count_samples(one_per_batch=False); t.add(0.001, torch.zeros(4, 2)); t.add(0.001)  # the second raised
        >>> t.read(t.gone, [], 0, None)["samples"]
        4
    """

    __slots__ = ("counts", "wait_s", "samples", "one_per_batch", "gone")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.wait_s = 0.0
        self.samples: Optional[int] = None
        self.one_per_batch = False
        self.gone: tuple[list, int, Any] = ([], 0, None)

    def add(self, wait_s: float, batch: Any = RAISED) -> None:
        """One batch consumed after ``wait_s`` seconds in ``next()`` (``batch``: what it returned;
        :data:`RAISED` for one that raised its own error: its samples are not counted)."""
        self.counts[_bisect(BOUNDS, wait_s)] += 1
        self.wait_s += wait_s
        if self.samples is not None and batch is not RAISED:
            self.samples += 1 if self.one_per_batch else samples_in(batch)

    def count_samples(self, one_per_batch: bool) -> None:
        """Count the samples of each batch delivered from now on (idempotent): ``one_per_batch``
        for a loader without automatic batching."""
        self.one_per_batch = one_per_batch
        if self.samples is None:
            self.samples = 0

    def retire(self, epoch: Any) -> None:
        """An epoch is over (an :class:`~seqloader.loader.tuning.stats.EpochStats`, refreshed):
        keep its worker numbers."""
        workers, restarts, _ = self.gone
        self.gone = (_summed(workers, epoch.workers), restarts + epoch.worker_restarts, epoch)

    def read(self, gone: tuple, workers: list, restarts: int, current: Any) -> dict:
        """The totals: ``gone`` (:attr:`gone`, read first) plus the live epoch's ``workers`` and
        ``restarts``; ``current``: the current :class:`~seqloader.loader.tuning.stats.EpochStats` or ``None``.

        Returns:
            ``{"batches", "wait_s", "wait_buckets": ((bound, cumulative count), ..., (inf, batches)),
            "samples" (None until counted), "worker_restarts", "workers": [{"busy_s", "cpu_s",
            "items", "restarts"}, ...], "input_bound" (the current epoch's, 0.0 before one)}``.
        """
        running, cumulative = 0, []
        for bound, n in zip((*BOUNDS, float("inf")), list(self.counts)):
            running += n
            cumulative.append((bound, running))
        return {"batches": running, "wait_s": self.wait_s, "wait_buckets": tuple(cumulative),
                "samples": self.samples, "worker_restarts": gone[1] + restarts,
                "workers": _summed(gone[0], workers),
                "input_bound": 0.0 if current is None else current.input_bound}


_KEYS = ("busy_s", "cpu_s", "items", "restarts")


def worker_deltas(now: dict, base: dict) -> list:
    """Per worker, ``Prefetch.counters()`` ``now`` less ``base`` (its counters when the epoch attached it).

    Example:
        >>> w = lambda s: {"workers": [{"busy_s": s, "cpu_s": s, "items": 2, "restarts": 0}]}
        >>> worker_deltas(w(3.0), w(1.0))
        [{'busy_s': 2.0, 'cpu_s': 2.0, 'items': 0, 'restarts': 0}]
    """
    return [{k: w[k] - b[k] for k in _KEYS} for w, b in zip(now["workers"], base["workers"])]


def _summed(kept: list, more: list) -> list:
    """Per worker index, ``kept`` plus ``more`` (either may list more workers: autotune changes them)."""
    zero = dict.fromkeys(_KEYS, 0)
    return [{k: a.get(k, 0) + b.get(k, 0) for k in _KEYS}
            for a, b in ((kept[i] if i < len(kept) else zero, more[i] if i < len(more) else zero)
                         for i in range(max(len(kept), len(more))))]
