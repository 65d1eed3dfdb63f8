"""The entry of each worker stream of an ``IterableDataset`` in a loader state (``iterable``).

Part of the state's format (:mod:`seqloader.loader.state.state`, which re-exports :class:`IterableState`);
formerly ``stream_state.py``, then a part of ``state.py`` (now ``state/state.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from seqloader.loader.state.values import check_int_in, check_value

__all__ = ["IterableState"]

@dataclasses.dataclass
class IterableState:
    """Where each worker stream of an ``IterableDataset`` stands (mutable: iterators update it).

    Batch ``i`` of an epoch is read from stream ``i % len(workers)`` (torch's round-robin); the
    loader's ``position`` is the next ``i``. Each stream's ``state`` is
    ``{"dataset": <dataset.state_dict()>, "iterator": <iter(dataset).state_dict()>}`` (either may
    be ``None``; the iterator's when ``__iter__`` returns ``self``) taken after its latest batch,
    or ``None`` when neither has a ``state_dict``.

    Attributes:
        workers: one dict per stream (one stream at ``num_workers=0``), each
            ``{"batches": int, "state": dict or None, "exhausted": bool}``.

    Example:
        >>> s = IterableState.fresh(2); s.record(0, batches=1, state={"dataset": {"i": 4}, "iterator": None})
        >>> s.to_dict()["workers"][0]
        {'batches': 1, 'state': {'dataset': {'i': 4}, 'iterator': None}, 'exhausted': False}
        >>> IterableState.from_dict(s.to_dict()) == s, s.started
        (True, True)
    """

    workers: list[dict[str, Any]]

    @classmethod
    def fresh(cls, streams: int) -> "IterableState":
        """The state before any batch of ``streams`` worker streams."""
        return cls([{"batches": 0, "state": None, "exhausted": False} for _ in range(streams)])

    @property
    def started(self) -> bool:
        """Whether any stream has yielded a batch or ended."""
        return any(w["batches"] or w["exhausted"] for w in self.workers)

    def record(self, worker: int, batches: int, state: Any) -> None:
        """Stream ``worker`` has yielded ``batches`` batches, after which its state is ``state``."""
        w = self.workers[worker]
        w["batches"], w["state"] = batches, state

    def mark_exhausted(self, worker: int, state: Any) -> None:
        """Stream ``worker`` has ended, its final state being ``state``."""
        w = self.workers[worker]
        w["exhausted"], w["state"] = True, state

    def carried(self) -> "IterableState":
        """The next epoch's start when the same dataset objects go on (persistent workers, or
        ``num_workers=0``): no batch yet, each stream's latest state kept for a resume."""
        return IterableState([{"batches": 0, "state": copy.deepcopy(w["state"]), "exhausted": False}
                              for w in self.workers])

    def copy(self) -> "IterableState":
        """An independent copy (sub-states deep-copied)."""
        return IterableState(copy.deepcopy(self.workers))

    def to_dict(self) -> dict[str, Any]:
        return {"workers": [dict(w) for w in self.workers]}

    @classmethod
    def from_dict(cls, d: Any) -> "IterableState":
        check_value(isinstance(d, dict) and set(d) == {"workers"}, "iterable", d,
                    "None or a dict with the key 'workers'")
        workers = d["workers"]
        check_value(isinstance(workers, list) and len(workers) > 0, "iterable.workers", workers,
                    "a non-empty list")
        for w in workers:
            check_value(isinstance(w, dict) and set(w) == {"batches", "state", "exhausted"},
                        "iterable.workers[]", w, "a dict with keys 'batches', 'state', 'exhausted'")
            check_int_in("iterable.workers[].batches", w["batches"])
            check_value(isinstance(w["exhausted"], bool), "iterable.workers[].exhausted", w["exhausted"],
                        "a bool")
            check_value(w["state"] is None or isinstance(w["state"], dict) and set(w["state"]) == {"dataset", "iterator"},
                        "iterable.workers[].state", w["state"], "None or a dict with keys 'dataset', 'iterator'")
        return cls(copy.deepcopy(workers))


