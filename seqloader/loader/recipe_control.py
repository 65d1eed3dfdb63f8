"""L3: changing the recipe during a run: ``set_weights`` and ``skip``, placed at exact positions.

:class:`RecipeControl` owns a loader's :class:`~seqloader.loader.changes.RecipeChanges` and turns a
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
from seqloader.loader.changes import RecipeChanges, Skip, WeightChange, check_weights, skip_ranges
from seqloader.loader.progress import Progress
from seqloader.loader.recipe import Recipe

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

    def _check_step(self, op: str, step: int) -> int:
        step = check_nonnegative_int(op, "at_step", step)
        if step < self.progress.step:
            raise ValueError(f"{op}: at_step={step} was already read (the next batch is step "
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
            reweight(values, epoch=epoch, position=pos)
        else:
            self.changes = self.changes.with_weights(WeightChange(step, epoch, pos, values))
        progress.recipe_changed()

    def skip(self, recipe: Recipe, indices: Optional[Iterable[int]], steps: Any) -> None:
        """Record skipped dataset ``indices`` and/or global ``steps`` (a ``range`` or ``(start, stop)``)."""
        op = "DataLoader.skip"
        if indices is None and steps is None:
            raise TypeError(f"{op}: give indices=, steps=, or both")
        progress, frontier = self.progress, self.frontier(recipe)
        changes = self.changes
        if indices is not None:
            values = [check_nonnegative_int(op, "every index", i) for i in indices]
            if values:
                changes = changes.with_skip(Skip(progress.epoch, frontier, "indices", skip_ranges(values)))
        if steps is not None:
            first, stop = (steps.start, steps.stop) if isinstance(steps, range) else tuple(steps)
            if isinstance(steps, range) and steps.step != 1:
                raise ValueError(f"{op}: steps must be a contiguous range (got step {steps.step})")
            first = self._check_step(op, first)
            stop = check_nonnegative_int(op, "steps' stop", stop)
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

    def checked(self, saved: Any, dataset: Any) -> RecipeChanges:
        """The changes of a loaded state's ``"recipe"`` entry, validated against ``dataset``."""
        changes = RecipeChanges.from_state(saved)
        sources = getattr(dataset, "num_sources", None)
        for k, c in enumerate(changes.weights):
            if not callable(getattr(dataset, "with_changes", None)):
                raise ValueError("load_state_dict: 'recipe' holds mixture weights but this loader's dataset is "
                                 f"not a mixture ({type(dataset).__name__}); build it over the same mix")
            if sources is not None and len(c.weights) != sources:
                raise ValueError(f"load_state_dict: 'recipe.weights[{k}]' has {len(c.weights)} weights but the "
                                 f"mixture has {sources} sources; build it with the sources it was saved with")
        return changes

    def load(self, changes: RecipeChanges) -> None:
        self.changes = changes

    def __repr__(self) -> str:
        return f"RecipeControl({len(self.changes.weights)} weight changes, {len(self.changes.skips)} skips)"

