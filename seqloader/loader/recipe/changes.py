"""L3: the recipe's changes during a run: mixture weights and skipped samples, as a small log.

A change never rewrites the past. Each is recorded with the place it takes effect, so the recipe
of any epoch is a pure function of ``(seed, epoch, position)`` and this log, and the loader's state
holds the log as JSON, O(number of changes):

* **Weights** ``[step, epoch, position, weights]``: from global step ``step`` on, a mixture reads
  with ``weights``. ``epoch``/``position`` say where that step starts; they are ``None`` while the
  step lies beyond the current epoch (every rank resolves it the same way when it gets there, with
  its own geometry: no communication). An epoch starts with the weights of the last change before
  it and applies the changes that fall inside it at their positions
  (``mix(...).with_changes``: each source goes on from its cursor).
* **Skips** ``[epoch, position, kind, ranges]``: from ``(epoch, position)`` on, the samples of
  ``ranges`` are skipped. ``kind`` is ``"indices"`` (dataset indices; also skipped in every later
  epoch) or ``"positions"`` (positions of that epoch's order: the batches of a step range). Skipped
  positions become holes backfilled from the epoch's tail (:mod:`seqloader.orders.holes`); a hole
  is only added where nothing was read yet.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Optional, Sequence

import numpy as np

from seqloader.orders.holes import HoledOrder, Intervals
from seqloader.orders.orders import Order, positions_of
from seqloader.loader.state.state import check_value, is_int_in

__all__ = ["RecipeChanges", "Skip", "WeightChange", "check_weights"]

KINDS = ("indices", "positions")


def check_weights(op: str, weights: Any, sources: Optional[int]) -> tuple[Any, ...]:
    """``weights`` as a tuple of finite numbers >= 0, not all 0 (``sources``: the length it must have).

    Example:
        >>> check_weights("set_weights", [0.7, 0.3, 0], 3)
        (0.7, 0.3, 0)
        >>> check_weights("set_weights", [1, -1], 2)
        Traceback (most recent call last):
        ValueError: set_weights: weights[1] must be a finite number >= 0 (got -1)
    """
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
        raise TypeError(f"{op}: weights must be a sequence of numbers (got {type(weights).__name__})")
    values = tuple(weights)
    if sources is not None and len(values) != sources:
        raise ValueError(f"{op}: weights must have one entry per source ({sources}; got {len(values)})")
    for i, w in enumerate(values):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(float(w)) or w < 0:
            raise ValueError(f"{op}: weights[{i}] must be a finite number >= 0 (got {w!r})")
    if not any(values):
        raise ValueError(f"{op}: at least one weight must be > 0 (got {list(values)})")
    return tuple(int(w) if isinstance(w, numbers.Integral) else float(w) for w in values)


@dataclasses.dataclass(frozen=True)
class WeightChange:
    """From global ``step`` on, read with ``weights``; it starts at ``(epoch, position)`` once known."""

    step: int
    epoch: Optional[int]
    position: Optional[int]
    weights: tuple[Any, ...]

    def to_json(self) -> list[Any]:
        return [self.step, self.epoch, self.position, list(self.weights)]


@dataclasses.dataclass(frozen=True)
class Skip:
    """From ``(epoch, position)`` on, skip the ``kind`` (indices or positions) in ``ranges``."""

    epoch: int
    position: int
    kind: str
    ranges: tuple[tuple[int, int], ...]

    def to_json(self) -> list[Any]:
        return [self.epoch, self.position, self.kind, [list(r) for r in self.ranges]]


@dataclasses.dataclass(frozen=True)
class RecipeChanges:
    """The log of a run's recipe changes (see the module docstring); immutable.

    Example:
        >>> c = RecipeChanges().with_weights(WeightChange(10, 0, 80, (1, 1)))
        >>> c = c.with_skip(Skip(0, 80, "indices", ((5, 7),)))
        >>> RecipeChanges.from_state(c.to_state()) == c, c.to_state()
        (True, {'weights': [[10, 0, 80, [1, 1]]], 'skips': [[0, 80, 'indices', [[5, 7]]]]})
    """

    weights: tuple[WeightChange, ...] = ()
    skips: tuple[Skip, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.weights or self.skips)

    # -- state -----------------------------------------------------------------------------------

    def to_state(self) -> Optional[dict[str, Any]]:
        """The ``"recipe"`` entry of the loader's state: ``None`` while nothing changed."""
        if not self:
            return None
        out: dict[str, Any] = {}
        if self.weights:
            out["weights"] = [c.to_json() for c in self.weights]
        if self.skips:
            out["skips"] = [s.to_json() for s in self.skips]
        return out

    @classmethod
    def from_state(cls, d: Any) -> "RecipeChanges":
        """Validate and read a ``"recipe"`` entry (``ValueError`` naming the entry at fault)."""
        if d is None:
            return cls()
        weights, skips = [], []
        for name in ("weights", "skips"):
            check_value(isinstance(d.get(name, []), list), f"recipe.{name}", d.get(name), "a list")
        for k, c in enumerate(d.get("weights", [])):
            check_value(isinstance(c, list) and len(c) == 4 and is_int_in(c[0])
                        and (c[1] is None) == (c[2] is None) and (c[1] is None or is_int_in(c[1]) and is_int_in(c[2]))
                        and isinstance(c[3], list), f"recipe.weights[{k}]", c,
                        "[step, epoch or None, position or None, [weights]], ints in [0, 2**63)")
            try:
                values = check_weights("load_state_dict", c[3], None)
            except (TypeError, ValueError) as e:
                raise ValueError(f"load_state_dict: 'recipe.weights[{k}]' holds bad weights: {e}") from None
            weights.append(WeightChange(c[0], c[1], c[2], values))
        steps = [c.step for c in weights]
        check_value(steps == sorted(set(steps)), "recipe.weights", d.get("weights"),
                    "changes in increasing order of step")
        for k, s in enumerate(d.get("skips", [])):
            check_value(isinstance(s, list) and len(s) == 4 and is_int_in(s[0]) and is_int_in(s[1]) and s[2] in KINDS
                        and isinstance(s[3], list) and len(s[3]) > 0
                        and all(isinstance(r, list) and len(r) == 2 and is_int_in(r[0]) and is_int_in(r[1])
                                and r[0] < r[1] for r in s[3]),
                        f"recipe.skips[{k}]", s, "[epoch, position, 'indices' or 'positions', [[start, stop], ...]] "
                        "(at least one range, start < stop), ints in [0, 2**63)")
            skips.append(Skip(s[0], s[1], s[2], tuple((r[0], r[1]) for r in s[3])))
        return cls(tuple(weights), tuple(skips))

    # -- changes ---------------------------------------------------------------------------------

    def with_weights(self, change: WeightChange) -> "RecipeChanges":
        """A new log with ``change`` (a change at the step of a later one replaces it)."""
        kept = tuple(c for c in self.weights if c.step != change.step)
        return dataclasses.replace(self, weights=tuple(sorted(kept + (change,), key=lambda c: c.step)))

    def with_skip(self, skip: Skip) -> "RecipeChanges":
        return dataclasses.replace(self, skips=self.skips + (skip,))

    def resolved(self, epoch: int, position_of_step: Any) -> "RecipeChanges":
        """Pending weight changes whose step ``position_of_step(step)`` places in ``epoch`` (a
        position, or ``None`` beyond it) get their ``(epoch, position)``."""
        out = []
        for c in self.weights:
            if c.epoch is None:
                p = position_of_step(c.step)
                if p is not None:
                    c = dataclasses.replace(c, epoch=epoch, position=p)
            out.append(c)
        return dataclasses.replace(self, weights=tuple(out))

    # -- what an epoch reads ---------------------------------------------------------------------

    def weights_in(self, epoch: int) -> list[tuple[int, tuple[Any, ...]]]:
        """``[(position, weights), ...]`` of ``epoch``: the weights in force at its start (at 0),
        then its own changes, in position order."""
        before = [c for c in self.weights if c.epoch is not None and c.epoch < epoch]
        inside = sorted((c for c in self.weights if c.epoch == epoch), key=lambda c: (c.position, c.step))
        out = [(0, before[-1].weights)] if before else []
        for c in inside:
            if out and out[-1][0] == c.position:
                out[-1] = (c.position or 0, c.weights)
            else:
                out.append((c.position or 0, c.weights))
        return out

    def holes(self, epoch: int, order: Order) -> Intervals:
        """The positions of ``order`` (epoch ``epoch``) that the skips make holes."""
        holes = Intervals()
        entries = [s for s in self.skips if s.kind == "indices" and s.epoch < epoch]
        entries = [dataclasses.replace(s, position=0) for s in entries]
        entries += sorted((s for s in self.skips if s.epoch == epoch), key=lambda s: s.position)
        for s in entries:
            if s.kind == "indices":
                wanted = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in s.ranges])
                candidates = Intervals.of_points(positions_of(order, wanted))
            else:
                candidates = Intervals(s.ranges)
            candidates = candidates.clip(s.position, order.n).minus(holes)
            consumed = int(holes.count_below(np.array([s.position]))[0])  # holes already read (backfilled)
            if consumed:  # their backfill came from the top of the tail: those samples were read
                top = HoledOrder(_Length(order.n), holes)._kth_from_end(np.array([consumed - 1]))
                candidates = candidates.clip(0, int(top[0]))
            holes = holes.union(candidates)
        return holes


class _Length:
    """An order of ``n`` positions (for :class:`HoledOrder`'s arithmetic only)."""

    def __init__(self, n: int):
        self.n = n

    def lookup(self, pos: Any) -> Any:  # pragma: no cover - never read
        raise NotImplementedError

    def run(self, first: int, count: int, stride: int) -> Any:  # pragma: no cover - never read
        raise NotImplementedError


def skip_ranges(values: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Sorted ints as compact ``(start, stop)`` ranges.

    Example:
        >>> skip_ranges([5, 3, 4, 9])
        ((3, 6), (9, 10))
    """
    return tuple((a, b) for a, b in Intervals.of_points(list(values)).ranges())
