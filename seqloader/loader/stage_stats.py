"""L3: the per-stage account of an epoch (``DataLoader(profile_stages=True)``): which stage is slow.

``loader.stats()`` says whether the training loop waits for data; this says where the batches'
time goes. The stages are timed where they run, exclusive of the stages nested in them
(:mod:`seqloader.sequences.stage_times`):

* in the worker processes (or in this process at ``num_workers=0``): each ``smap(f)`` and
  ``rng_map(f)`` (the calls of ``f``), ``"fetch"`` (the dataset's ``__getitem__``/``__getitems__``,
  or reading an ``IterableDataset``, less the ``smap``s inside it), ``"collate"`` (``collate_fn``,
  or ``default_collate`` stacking into the shared-memory slot) and ``"transfer"`` (pickling the
  batch and writing it into shared memory; workers only); ``"other"`` is the rest of the time
  spent computing batches (seeding the global RNGs, the sampler's indices, ...);
* in this process: ``"pin"`` (``pin_memory``).

Workers send their totals with each batch (``Result.stages``), summed by the prefetcher
(``Prefetch.counters()["stages"]``). A stage's ``share`` is its part of the time spent computing
batches (the workers' busy time, or this process's at ``num_workers=0``); ``pin``'s is its part of
the loop's wall time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

__all__ = ["OTHER", "PIN", "StageAccount"]

#: The rest of the time spent computing batches, and pinning in this process.
OTHER, PIN = "other", "pin"


@dataclasses.dataclass
class StageAccount:
    """Seconds per stage for one epoch; see the module docstring.

    Attributes:
        seconds: stage name -> seconds spent computing batches, summed over the workers (or in this
            process at ``num_workers=0``).
        busy_s, batches: at ``num_workers=0``, the seconds this process spent computing batches and
            how many (with workers, their own counts are used).
        pin_s: seconds spent pinning batches in this process.

    Example:
        >>> a = StageAccount({"fetch": 1.0, "collate": 3.0}, busy_s=5.0, batches=10)
        >>> t = a.table(workers=[], wall_s=8.0, returned=10)
        >>> list(t), t["collate"]["share"], t["other"]["per_batch_s"]
        (['collate', 'fetch', 'other'], 0.6, 0.1)
        >>> a.hint(workers=[], wall_s=8.0, returned=10)
        'slowest stage: collate takes 60% of the time spent computing batches (300.0 ms per batch)'
    """

    seconds: dict = dataclasses.field(default_factory=dict)
    busy_s: float = 0.0
    batches: int = 0
    pin_s: float = 0.0

    def add(self, seconds: dict) -> None:
        """Add stage totals (``{name: seconds}``)."""
        for name, s in seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + s

    def table(self, workers: list, wall_s: float, returned: int) -> dict[str, dict[str, Any]]:
        """``{name: {"where", "seconds", "per_batch_s", "share"}}``, the largest share first.

        Args:
            workers: the epoch's per-worker ``{"busy_s", "items", ...}`` (empty at ``num_workers=0``).
            wall_s: the loop's wall time (waiting plus work), for ``pin``'s share.
            returned: batches returned to the loop, for ``pin``'s time per batch.
        """
        rows: dict[str, dict[str, Any]] = {}
        if self.seconds:
            busy = sum(w["busy_s"] for w in workers) if workers else self.busy_s
            computed = sum(w["items"] for w in workers) if workers else self.batches
            where = "workers" if workers else "main"
            spent = dict(self.seconds)
            rest = busy - sum(spent.values())
            if rest > 0:
                spent[OTHER] = rest
            for name, s in spent.items():
                rows[name] = {"where": where, "seconds": s, "per_batch_s": s / computed if computed else 0.0,
                              "share": s / busy if busy > 0 else 0.0}
        if self.pin_s:
            rows[PIN] = {"where": "main", "seconds": self.pin_s,
                         "per_batch_s": self.pin_s / returned if returned else 0.0,
                         "share": self.pin_s / wall_s if wall_s > 0 else 0.0}
        return dict(sorted(rows.items(), key=lambda kv: -kv[1]["share"]))

    def hint(self, workers: list, wall_s: float, returned: int) -> Optional[str]:
        """The slowest stage computing batches (``other`` aside), and pinning when it takes >= 20% of
        the loop's wall time; ``None`` when nothing was timed."""
        table = self.table(workers, wall_s, returned)
        parts = []
        slowest = [(n, r) for n, r in table.items() if n not in (OTHER, PIN)]
        if slowest:
            name, row = slowest[0]
            where = "worker time" if workers else "the time spent computing batches"
            parts.append(f"slowest stage: {name} takes {row['share']:.0%} of {where} "
                         f"({row['per_batch_s'] * 1e3:.1f} ms per batch)")
        if PIN in table and table[PIN]["share"] >= 0.2:
            parts.append(f"pinning takes {table[PIN]['share']:.0%} of the loop's wall time")
        return "; ".join(parts) or None
