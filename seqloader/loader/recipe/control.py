"""L3: changing the recipe during a run: ``set_weights`` and ``skip``, placed at exact positions.

:class:`RecipeControl` owns a loader's :class:`~seqloader.loader.recipe.changes.RecipeChanges` and turns a
user's request into a change at a sample position: "now" is the *frontier* (the end of the last
batch yielded: with ``in_order=False``, past the watermark too), and ``at_step=S`` is the position
where global step ``S`` starts, computed from the progress with the batch-size schedule and the
world size (every rank gets the same position without communicating). A step beyond the current
epoch stays pending until the epoch that holds it opens (:meth:`RecipeControl.resolve`). Each
change bumps the progress's ``recipe_changes``: live iterators drop their read-ahead and read on
from the frontier with the new recipe.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from seqloader.errors import check_nonnegative_int
from seqloader.loader import world
from seqloader.loader.recipe.changes import RecipeChanges, Skip, WeightChange, check_weights, skip_ranges
from seqloader.loader.state.progress import Progress
from seqloader.loader.recipe.recipe import Recipe
from seqloader.loader.state.state import INT_LIMIT

__all__ = ["RecipeControl"]


class RecipeControl:
    """A loader's recipe changes; see the module docstring.

    Args:
        progress: the loader's progress.
    """

    def __init__(self, progress: Progress):
        self.progress = progress
        self.changes = RecipeChanges()

    @staticmethod
    def _world_size() -> int:
        return world.current_world()[1]

    # -- where -----------------------------------------------------------------------------------

    def frontier(self, recipe: Recipe) -> int:
        """The position after the last batch yielded (past the watermark when out of order)."""
        progress = self.progress
        if not progress.ahead:
            return progress.position
        plan = recipe.plan(progress.epoch, progress.position, step=progress.step)
        return max(plan.end_position(plan.batch_of(k)) for k in progress.ahead)

    def _position_of(self, recipe: Recipe, step: int) -> int:
        progress = self.progress
        return recipe.position_of_step(step, progress.position, progress.step, self._world_size())

    def _check_step(self, op: str, step: int, arg: str = "at_step") -> int:
        step = check_nonnegative_int(op, arg, step)
        if step >= INT_LIMIT:
            raise ValueError(f"{op}: {arg} must be < 2**63 (got {step})")
        if step < self.progress.step:
            raise ValueError(f"{op}: {arg}={step} was already read (the next batch is step "
                             f"{self.progress.step}); a change applies from now on")
        return step

    # -- changes ---------------------------------------------------------------------------------

    def set_weights(self, recipe: Recipe, target: Any, weights: Any, at_step: Optional[int]) -> None:
        """Record new mixture weights for ``target`` (the dataset, a mix, or a reweightable sampler)."""
        op = "DataLoader.set_weights"
        progress = self.progress
        reweight = getattr(target, "reweight", None)
        sources = getattr(target, "num_sources", None)
        values = check_weights(op, weights, sources) if reweight is None else weights
        if reweight is None and callable(getattr(target, "with_weights", None)):
            _mixture_accepts(op, target, values)
        if at_step is None:
            step, position = progress.step, self.frontier(recipe)
        else:
            step = self._check_step(op, at_step)
            position = self._position_of(recipe, step)
        epoch: Optional[int] = progress.epoch
        if position >= recipe.order(progress.epoch).n and position > self.frontier(recipe):
            epoch, pos = None, None  # beyond this epoch: resolved when its epoch opens
        else:
            pos = position
        if reweight is not None:
            if epoch is None:
                raise ValueError(f"{op}: at_step={at_step} is beyond the current epoch; a sampler's "
                                 "weights change within the epoch being read (call set_weights then)")
            reweight(values, epoch=epoch, position=pos)  # checks everything, then changes
        else:
            changes = self.changes.with_weights(WeightChange(step, epoch, pos, values))
            if epoch is not None:  # the epoch's mixture with the change in place: built now, not at next()
                _mixture_accepts(op, recipe.replace(changes=changes), epoch)
            self.changes = changes
        progress.recipe_changed()

    def skip(self, recipe: Recipe, indices: Optional[Iterable[int]], steps: Any) -> None:
        """Record skipped dataset ``indices`` and/or global ``steps`` (a ``range`` or ``(start, stop)``)."""
        op = "DataLoader.skip"
        if indices is None and steps is None:
            raise TypeError(f"{op}: give indices=, steps=, or both")
        progress, frontier = self.progress, self.frontier(recipe)
        changes = self.changes
        if indices is not None:
            if isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
                raise TypeError(f"{op}: indices must be an iterable of ints (got {type(indices).__name__})")
            values = [check_nonnegative_int(op, "every index", i) for i in indices]
            limit = index_limit(recipe, progress.epoch)
            if values and max(values) >= limit:
                raise ValueError(f"{op}: indices holds {max(values)}, outside [0, {limit}) (the dataset's indices)")
            if values:
                changes = changes.with_skip(Skip(progress.epoch, frontier, "indices", skip_ranges(values)))
        if steps is not None:
            if isinstance(steps, range):
                if steps.step != 1:
                    raise ValueError(f"{op}: steps must be a contiguous range (got step {steps.step})")
                first, stop = steps.start, steps.stop
            elif isinstance(steps, (tuple, list)) and len(steps) == 2:
                first, stop = steps
            else:
                raise TypeError(f"{op}: steps must be a range or a (start, stop) pair (got {steps!r})")
            first = self._check_step(op, first, "steps' start")
            stop = check_nonnegative_int(op, "steps' stop", stop)
            if stop > first:
                plan = recipe.plan(progress.epoch, progress.position, step=progress.step)
                last = progress.step + len(plan) - 1  # the epoch's last step (all ranks have as many)
                if stop - 1 > last:
                    raise ValueError(f"{op}: steps={steps!r} reaches past the end of epoch {progress.epoch}, whose "
                                     f"last step is {last}; skip steps of the epoch being read (a step range "
                                     "of a later epoch is given when that epoch is read)")
            end = recipe.order(progress.epoch).n
            lo, hi = (min(self._position_of(recipe, s), end) for s in (first, max(first, stop)))
            lo = max(lo, frontier)
            if hi > lo:
                changes = changes.with_skip(Skip(progress.epoch, frontier, "positions", ((lo, hi),)))
        if changes is not self.changes:
            self.changes = changes
            progress.recipe_changed()

    def resolve(self, recipe: Recipe) -> None:
        """At an epoch's opening: pending weight changes whose step falls in it get their position."""
        if not any(c.epoch is None for c in self.changes.weights):
            return
        progress = self.progress
        end = recipe.order(progress.epoch).n

        def position_of_step(step: int) -> Optional[int]:
            if step <= progress.step:
                return progress.position  # reached (or passed while nothing was read): from here on
            p = self._position_of(recipe, step)
            return p if p < end else None

        self.changes = self.changes.resolved(progress.epoch, position_of_step)

    def checked(self, saved: Any, recipe: Optional[Recipe]) -> RecipeChanges:
        """The changes of a loaded state's ``"recipe"`` entry, validated against ``recipe`` (the
        loader's, whose dataset they apply to; ``None`` for an ``IterableDataset``, which has no
        changes): every weight change is one the mixture accepts, every epoch it is placed in can
        be built, and skipped indices are indices of the dataset."""
        changes = RecipeChanges.from_state(saved)
        if recipe is None:
            if changes:
                raise ValueError("load_state_dict: 'recipe' holds changes (weights or skips) but this loader reads "
                                 "an IterableDataset, whose recipe does not change; the state is corrupt or was "
                                 "saved for a map-style dataset")
            return changes
        dataset = recipe.dataset
        sources = getattr(dataset, "num_sources", None)
        for k, c in enumerate(changes.weights):
            if not callable(getattr(dataset, "with_changes", None)):
                raise ValueError("load_state_dict: 'recipe' holds mixture weights but this loader's dataset is "
                                 f"not a mixture ({type(dataset).__name__}); build it over the same mix")
            if sources is not None and len(c.weights) != sources:
                raise ValueError(f"load_state_dict: 'recipe.weights[{k}]' has {len(c.weights)} weights but the "
                                 f"mixture has {sources} sources; build it with the sources it was saved with")
            if callable(getattr(dataset, "with_weights", None)):
                _mixture_accepts(f"load_state_dict: 'recipe.weights[{k}]'", dataset, c.weights)
        with_changes = recipe.replace(changes=changes)
        for epoch in sorted({c.epoch for c in changes.weights if c.epoch is not None}):
            _mixture_accepts("load_state_dict: 'recipe.weights'", with_changes, epoch)
        for k, s in enumerate(changes.skips):
            if s.kind == "indices":
                limit, top = index_limit(with_changes, s.epoch), max(b for _, b in s.ranges)
                if top > limit:
                    raise ValueError(f"load_state_dict: 'recipe.skips[{k}]' skips dataset index {top - 1} but the "
                                     f"dataset has {limit} items; the state is corrupt or was saved for another "
                                     "dataset")
        return changes

    def load(self, changes: RecipeChanges) -> None:
        self.changes = changes

    def __repr__(self) -> str:
        return f"RecipeControl({len(self.changes.weights)} weight changes, {len(self.changes.skips)} skips)"


def index_limit(recipe: Recipe, epoch: int) -> int:
    """One past the largest dataset index of ``epoch``: ``len(dataset)``, or more for a mixture
    whose weight changes lengthen that epoch."""
    if not recipe.changes.weights:
        return recipe.dataset_len
    return max(recipe.dataset_len, len(recipe.dataset_for(epoch)))


def _mixture_accepts(op: str, target: Any, what: Any) -> None:
    """Build, now, what a weight change will read, so that a refusal raises here (naming ``op``)
    rather than at a later ``next()``: ``target`` a mixture and ``what`` weights (the mixture
    with them from its end), or ``target`` a :class:`Recipe` and ``what`` an epoch (its mixture)."""
    try:
        if isinstance(target, Recipe):
            target.dataset_for(what)
        else:
            target.with_weights(list(what), at=len(target))
    except (TypeError, ValueError) as e:
        detail = f"{type(e).__name__}: {e}"
        refused = (f"the mixture of epoch {what} cannot be built" if isinstance(target, Recipe) else
                   f"the mixture refuses weights={list(what)}")
        raise ValueError(f"{op}: {refused} ({detail})") from e
