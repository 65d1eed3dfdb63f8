"""L3: the *recipe*: which dataset indices batch ``b`` of epoch ``e`` reads, as one frozen value.

A :class:`Recipe` holds what decides the data (the dataset, its length, ``batch_size``,
``drop_last``, ``shuffle``, the seed and its derivation, and the order source: the built-in
order, a :class:`~seqloader.loader.samplers.shuffle.SeekableSampler`, or a user's sampler/``batch_sampler``
read once per epoch) and nothing of how it is read (workers, pinning, progress). Everything else
is a pure function of ``(recipe, epoch, position)`` and the rank:

* :meth:`Recipe.order` -- the epoch's global order (:mod:`seqloader.orders.orders`);
* :meth:`Recipe.plan` -- that order cut into this rank's batches from a sample ``position`` on
  (:mod:`seqloader.orders.plans`);
* :meth:`Recipe.indices_at` -- the indices of one step, computed without iterating.

The recipe says which indices are read, never how: reading them (seed, fetch, collate) is
:class:`~seqloader.loader.epoch.batches.EpochBatches` over :meth:`Recipe.dataset_for` and
:meth:`Recipe.plan` (built by :func:`seqloader.loader.reading.epoch_batches`), so the recipe
does not import the fetching side.

The loader builds its recipe from its attributes when an epoch opens (torch lets users change
``collate_fn`` after construction), and a loaded state replaces the seed and derivation.
Compare Grain, which keeps its index map pure and apart from the read, and torch's iterator,
which asks its loader for one object (``loader._index_sampler``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, cast

from seqloader.errors import check_int, check_nonnegative_int
from seqloader.loader import world
from seqloader.loader.recipe.changes import RecipeChanges
from seqloader.loader.samplers.custom import CustomOrder
from seqloader.orders.holes import HoledOrder
from seqloader.orders.orders import DERIVATION, Order, RangeOrder, builtin_order
from seqloader.orders.plans import OrderPlan
from seqloader.orders.steps import BatchSizes

__all__ = ["Recipe"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Which indices each batch of each epoch reads; see the module docstring.

    Attributes:
        dataset: the map-style dataset (the recipe reads only its length and weights; fetching reads it).
        dataset_len: ``len(dataset)``.
        batch_size, drop_last, collate_fn: as in torch's ``DataLoader``.
        shuffle: the built-in order is shuffled (ignored with ``sampler`` or ``custom``).
        seed, derivation: the loader's seed and how orders and seeds derive from it.
        sampler: a seekable sampler whose ``order(epoch)`` is read directly, or ``None``.
        custom: a user's ``sampler``/``batch_sampler`` (indices read once per epoch), or ``None``.
        batch_sizes: a batch-size schedule by global step (``None``: ``batch_size`` throughout).
        changes: the run's changes: mixture weights and skipped samples
            (:class:`~seqloader.loader.recipe.changes.RecipeChanges`).

    Example:
        >>> r = Recipe(dataset=list(range(10)), dataset_len=10, batch_size=4, drop_last=False,
        ...            collate_fn=list, shuffle=False, seed=0)
        >>> r.indices_at(0, 1), r.indices_at(0, 2), r.batches_per_epoch(rank=1, world_size=2)
        ([4, 5, 6, 7], [8, 9], 2)
        >>> r.indices_at(0, 3)
        Traceback (most recent call last):
        IndexError: DataLoader.indices_at: step 3 out of range [0, 3) of epoch 0 (rank 0 of 1)
    """

    dataset: Any
    dataset_len: int
    batch_size: Optional[int]
    drop_last: bool
    collate_fn: Callable[[Any], Any]
    shuffle: bool
    seed: int
    derivation: int = DERIVATION
    sampler: Any = None
    custom: Optional[CustomOrder] = None
    batch_sizes: Optional[BatchSizes] = None
    changes: RecipeChanges = RecipeChanges()

    def replace(self, **changes: Any) -> "Recipe":
        """A copy with the given fields replaced."""
        return dataclasses.replace(self, **changes)

    def dataset_for(self, epoch: int) -> Any:
        """The dataset ``epoch`` reads: the mixture with the epoch's weight changes applied."""
        weights = self.changes.weights_in(epoch)
        return self.dataset.with_changes(weights) if weights else self.dataset

    def order(self, epoch: int) -> Order:
        """The global order of ``epoch`` (not for a custom sampler, whose indices are per epoch),
        with skipped positions backfilled from its tail."""
        if self.sampler is not None:
            order = cast(Order, self.sampler.order(epoch))
        else:
            n = len(self.dataset_for(epoch)) if self.changes.weights else self.dataset_len
            order = builtin_order(n, self.seed, epoch, self.shuffle, self.derivation)
        if self.changes.skips:
            holes = self.changes.holes(epoch, order)
            if len(holes):
                return HoledOrder(order, holes)
        return order

    def _sizes(self) -> Any:
        return self.batch_size if self.batch_sizes is None else self.batch_sizes

    def plan(self, epoch: int, position: int, rank: Optional[int] = None,
             world_size: Optional[int] = None, step: int = 0) -> Any:
        """This rank's batches of ``epoch`` from global sample ``position`` on (``step``: the global
        step of the batch at ``position``, for a batch-size schedule).

        ``rank``/``world_size`` default to ``torch.distributed``'s (``world.current_world()``). A
        custom sampler shards itself (a ``DistributedSampler``), so its plan ignores them.
        """
        if self.custom is not None:
            return self.custom.plan(epoch, position, self.seed, self.derivation, self.batch_size, self.drop_last)
        if rank is None or world_size is None:
            rank, world_size = world.current_world()
        return OrderPlan(self.order(epoch), position, self._sizes(), self.drop_last, rank, world_size, step)

    def batches_per_epoch(self, rank: Optional[int] = None, world_size: Optional[int] = None,
                          first_step: int = 0) -> int:
        """Batches of a whole epoch on this rank (``len(loader)``), without building an order."""
        if rank is None or world_size is None:
            rank, world_size = world.current_world()
        return len(OrderPlan(RangeOrder(self.dataset_len), 0, self._sizes(), self.drop_last, rank, world_size,
                             first_step))

    def position_of_step(self, step: int, at_position: int, at_step: int, world_size: int) -> int:
        """The global position where global ``step`` starts, from ``at_position`` (whose batch is
        global step ``at_step <= step``); it may lie past the epoch's end."""
        sizes = self.batch_sizes or BatchSizes(self.batch_size or 1)
        return at_position + sizes.offset(at_step, step - at_step) * world_size

    def step_plan(self, op: str, epoch: int, step: int, rank: Optional[int] = None,
                  world_size: Optional[int] = None, first_step: int = 0, *, after: bool = False) -> tuple[Any, int]:
        """``(plan, step)``: the plan of ``epoch`` on ``rank`` from its start, after checking that batch
        ``step`` exists there (``after``: that ``step`` batches can have been read, ``step <= len``).
        The one check of an ``(epoch, step, rank, world_size)`` that :meth:`indices_at` and
        ``DataLoader.state_at`` share. ``rank``/``world_size`` default, each, to ``torch.distributed``'s.

        Raises:
            TypeError: an argument is not an int.
            ValueError: ``epoch`` outside ``[0, 2**63)``, ``world_size < 1`` or ``rank`` outside
                ``[0, world_size)``.
            IndexError: ``step`` is not a batch of that epoch on that rank (``after``: more than its batches).
        """
        epoch = check_nonnegative_int(op, "epoch", epoch)
        if epoch >= 2**63:
            raise ValueError(f"{op}: epoch must be < 2**63 (got {epoch})")
        step = check_int(op, "step", step)
        current_rank, current_size = world.current_world()
        world_size = current_size if world_size is None else check_int(op, "world_size", world_size)
        if world_size < 1:
            raise ValueError(f"{op}: world_size must be >= 1 (got {world_size})")
        rank = current_rank if rank is None else check_int(op, "rank", rank)
        if not 0 <= rank < world_size:
            raise ValueError(f"{op}: rank {rank} out of range [0, {world_size}) (world_size={world_size}); a rank "
                             "is a process of the world")
        plan = self.plan(epoch, 0, rank, world_size, first_step)
        end = len(plan) + 1 if after else len(plan)
        if not 0 <= step < end:
            raise IndexError(f"{op}: step {step} out of range [0, {end}) of epoch {epoch} "
                             f"(rank {rank} of {world_size})")
        return plan, step

    def indices_at(self, epoch: int, step: int, rank: Optional[int] = None,
                   world_size: Optional[int] = None, first_step: int = 0) -> Any:
        """The dataset indices of batch ``step`` of ``epoch`` on ``rank``, computed without iterating
        (``first_step``: the global step of the epoch's first batch, for a batch-size schedule).

        Raises:
            TypeError, ValueError, IndexError: as :meth:`step_plan` (``step`` is not a batch of
                that epoch on that rank, or the rank does not exist).
        """
        plan, step = self.step_plan("DataLoader.indices_at", epoch, step, rank, world_size, first_step)
        return plan.batch(step)[1]
