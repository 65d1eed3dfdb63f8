"""L3: one epoch's numbers (:class:`EpochStats`) and its per-stage account (:class:`StageAccount`).

What ``DataLoader.stats()`` reports per epoch, filled in by :class:`~seqloader.loader.tuning.stats.LoaderStats`
(the loader's one clock and the workers' counters); see that module for what each number means.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

from seqloader.loader.tuning.hint import executor_hint, load_hint, machine_busy, startup_hint, waiting
from seqloader.loader.tuning.rules import waits

__all__ = ["OTHER", "PIN", "EpochStats", "StageAccount"]

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
        the loop's wall time (:func:`~seqloader.loader.tuning.rules.waits`); ``None`` when nothing was timed."""
        table = self.table(workers, wall_s, returned)
        parts = []
        slowest = [(n, r) for n, r in table.items() if n not in (OTHER, PIN)]
        if slowest:
            name, row = slowest[0]
            where = "worker time" if workers else "the time spent computing batches"
            parts.append(f"slowest stage: {name} takes {row['share']:.0%} of {where} "
                         f"({row['per_batch_s'] * 1e3:.1f} ms per batch)")
        if PIN in table and waits(table[PIN]["share"]):
            parts.append(f"pinning takes {table[PIN]['share']:.0%} of the loop's wall time")
        return "; ".join(parts) or None


@dataclasses.dataclass
class EpochStats:
    """The numbers of one epoch (or of the part of it read so far).

    Attributes:
        epoch: the loader's epoch counter.
        batches: batches returned by ``next()`` (including ones that raised).
        wait_s: seconds spent inside ``next()``: the loop waiting for data.
        work_s: seconds between a ``next()`` returning and the following call: the loop's work.
        workers: per worker ``{"busy_s", "cpu_s", "items", "restarts"}`` (empty at
            ``num_workers=0``): wall seconds computing items, and the CPU seconds of the threads
            that computed them.
        executor: what computed the batches: ``"process"``, ``"thread"`` (``"main"`` at
            ``num_workers=0``).
        ready_mean: the mean number of batches already computed when one was read (read-ahead used).
        shm_bytes: bytes of results that came back through shared memory.
        worker_restarts: dead workers replaced during the epoch (``max_worker_restarts``).
        startup_s: seconds ``iter()`` took: starting the workers (unless persistent and already
            running) and opening the epoch; not part of ``wait_s``.
        account: the per-stage account (:class:`StageAccount`), filled with
            ``profile_stages``; ``as_dict()`` shows it as ``"stages"``.
    """

    epoch: int
    batches: int = 0
    wait_s: float = 0.0
    work_s: float = 0.0
    workers: list = dataclasses.field(default_factory=list)
    executor: str = "main"
    ready_mean: float = 0.0
    shm_bytes: int = 0
    worker_restarts: int = 0
    startup_s: float = 0.0
    account: StageAccount = dataclasses.field(default_factory=StageAccount)

    @property
    def input_bound(self) -> float:
        """The fraction of wall time the loop spent waiting for data, in ``[0, 1]``."""
        total = self.wait_s + self.work_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches per second of wall time (waiting plus work)."""
        total = self.wait_s + self.work_s
        return self.batches / total if total > 0 else 0.0

    def hint(self, num_workers: int, cores: Optional[int], persistent: bool = False,
             dataset: Any = None) -> Optional[str]:
        """One line of suggestions, each only when the numbers support it; else ``None``.

        * Input-bound (waiting >= 20% of the time, 10 batches or more): at ``num_workers=0``, how
          many workers the waiting suggests; with workers, more of them only if every worker is
          saturated (busy >= 90% of the wall time) and cores are free.
        * Worker start-up in ``iter()`` >= 20% of the epoch (not with ``persistent``).
        * Which executor fits, from the workers' CPU time against their busy time and the machine's
          load, never threads for a ``dataset`` holding open files (see :meth:`_executor_hint`).

        The first three are :mod:`~seqloader.loader.tuning.hint`'s.
        * With a per-stage account, the slowest stage.
        """
        parts = (load_hint(self, num_workers, cores), startup_hint(self, num_workers, persistent),
                 self._executor_hint(num_workers, dataset), self.account.hint(self.workers, self.wait_s + self.work_s,
                                                                       self.batches))
        return "; ".join(p for p in parts if p) or None

    def _executor_hint(self, num_workers: int, dataset: Any = None) -> Optional[str]:
        """Threads or processes (the loop waiting: :func:`~seqloader.loader.tuning.hint.waiting`),
        measured before advised: :func:`~seqloader.loader.tuning.hint.executor_hint`."""
        if num_workers == 0 or not self.workers or not waiting(self):
            return None
        return executor_hint(self.executor, num_workers, self.workers, self.wait_s + self.work_s, dataset,
                             machine_busy())

    def as_dict(self) -> dict[str, Any]:
        """JSON types, with the derived ``input_bound`` and ``batches_per_s``, and ``stages`` (the
        per-stage account's table, empty without ``profile_stages``)."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "account"}
        out["stages"] = self.account.table(self.workers, self.wait_s + self.work_s, self.batches)
        return {**out, "input_bound": self.input_bound, "batches_per_s": self.batches_per_s}
