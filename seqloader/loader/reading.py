"""L3: what a loader reads beyond torch's attributes: :class:`Reading`, the recipe's other inputs.

torch's attributes (``dataset``, ``batch_size``, ``drop_last``, ``collate_fn``, ``shuffle``) and
the loader's ``seed`` say most of what a batch reads. :class:`Reading` is the loader's part that
holds the rest, and builds the :class:`~seqloader.loader.recipe.recipe.Recipe` from both
(:meth:`Reading.recipe`, from the loader's public settings only):

* the order source: the user's own ``sampler``/``batch_sampler`` objects (torch builds defaults
  into ``loader.sampler``), a seekable sampler read as an order
  (:class:`~seqloader.loader.samplers.shuffle.SeekableSampler`), or a custom order read once per
  epoch (:class:`~seqloader.loader.samplers.custom.CustomOrder`);
* the batch-size schedule (:class:`~seqloader.orders.steps.BatchSizes`);
* the derivation (a loaded state brings its own) and whether the seed is shared by the ranks;
* the run's recipe changes (:class:`~seqloader.loader.recipe.control.RecipeControl`);
* the file lists of the pipeline's sources, described once for the state.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from seqloader.loader import world
from seqloader.loader.samplers.custom import CustomOrder
from seqloader.loader.epoch.batches import epoch_batches
from seqloader.loader.settings import Settings
from seqloader.loader.state.progress import Progress
from seqloader.loader.recipe.recipe import Recipe
from seqloader.loader.recipe.control import RecipeControl
from seqloader.loader.recipe.changes import RecipeChanges
from seqloader.loader.rngs.seeding import DERIVATION
from seqloader.loader.samplers.shuffle import SeekableSampler
from seqloader.loader.state.positions import record_positions
from seqloader.loader.state.source_files import describe_pipeline
from seqloader.loader.state.state import STAGE, LoaderState
from seqloader.orders.steps import schedule_of

__all__ = ["Reading", "Settings"]


class Reading:
    """What a loader reads beyond torch's attributes; see the module docstring.

    Args:
        iterable: the dataset is an ``IterableDataset`` (checked once: torch forbids assigning
            ``.dataset`` later, and an ``isinstance`` check against torch's ABC costs ~0.5 ms
            whenever an ABC registration has reset its cache).
        sampler, batch_sampler, batch_size, num_workers: the loader's arguments (the user's own
            sampler objects, before torch builds its defaults).
        schedule: ``batch_size_schedule``.
        progress: the loader's progress (the recipe changes are placed from it).
        seed_world: the world size a seed was drawn under (``None``: given, or shared).

    Example:
        >>> r = Reading(False, None, None, 4, None, 0, Progress(), None)
        >>> r.builtin, r.iterable, r.custom is None, r.derivation
        (True, False, True, 2)
    """

    def __init__(self, iterable: bool, sampler: Any, batch_sampler: Any, batch_size: Optional[int],
                 schedule: Any, num_workers: int, progress: Progress, seed_world: Optional[int]):
        self.iterable = iterable
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.seekable: Optional[SeekableSampler] = sampler if isinstance(sampler, SeekableSampler) else None
        #: the loader's own order (range, shuffle, or a seekable sampler's), read in O(1) per batch
        self.builtin = batch_sampler is None and (sampler is None or self.seekable is not None)
        self.custom = None if self.builtin else CustomOrder(sampler, batch_sampler)
        if self.seekable is not None:
            self.seekable.bind(num_workers, batch_size)
        self.batch_sizes = schedule_of(batch_size, schedule, batch_sampler=batch_sampler, iterable=self.iterable)
        self.derivation = DERIVATION  # a loaded state brings its own (see loader/rngs/seeding.py)
        # A seed is shared by all ranks when given, loaded, or drawn under an initialised world
        # (draw_seed broadcasts rank 0's). One drawn per process cannot shard a global order.
        self.seed_world = seed_world
        self.control = RecipeControl(progress)
        self._files: Optional[list] = None
        self._positions: Optional[dict] = None

    def owner(self) -> Any:
        """The sampler whose ``set_epoch`` the loader follows (a custom one's, or a seekable one), or ``None``."""
        return self.custom.epoch_owner() if self.custom is not None else self.seekable

    def recipe(self, loader: Settings) -> Recipe:
        """What the epochs read, from the loader's current settings (see ``loader/recipe/recipe.py``)."""
        dataset: Any = loader.dataset  # map-style here: sized
        return Recipe(dataset=dataset, dataset_len=len(dataset), batch_size=loader.batch_size,
                      drop_last=loader.drop_last, collate_fn=loader.collate_fn, shuffle=bool(loader.shuffle),
                      seed=loader.seed, derivation=self.derivation, sampler=self.seekable, custom=self.custom,
                      batch_sizes=self.batch_sizes, changes=self.control.changes)

    def epoch_length(self, loader: Settings, progress: Progress) -> Optional[int]:
        """``len(loader)`` for the loader's own order (``None``: torch's length applies)."""
        if self.iterable or not self.builtin:
            return None
        sizes = self.batch_sizes
        first = progress.step  # the epoch's first step (a batch-size schedule reads it)
        if sizes is not None and progress.position:
            first -= sizes.steps_before(progress.step, progress.position // world.current_world()[1])
        return self.recipe(loader).batches_per_epoch(first_step=first)

    def used_up(self, loader: Settings, progress: Progress) -> bool:
        """Whether nothing of the progress's epoch is left to read."""
        seq, skip = epoch_batches(self.recipe(loader), progress)
        return len(seq) == len(skip)

    def files(self, dataset: Any) -> list:
        """The file lists of the pipeline's sources (computed once: a source's files do not change)."""
        if self._files is None:
            self._files = describe_pipeline(dataset)
        return self._files

    def positions(self, dataset: Any) -> dict:
        """What decides which sample a position is (computed once: the pipeline does not change)."""
        if self._positions is None:
            self._positions = record_positions(dataset)
        return self._positions

    def load_sampler(self, saved: LoaderState) -> None:
        """Hand a seekable sampler its sub-state: the first change of a load, since it checks
        everything before it changes anything; a refusal is a ``ValueError`` naming ``'sampler'``.

        Example:
            >>> from seqloader import BijectiveShuffleSampler
            >>> r = Reading(False, BijectiveShuffleSampler(range(4), seed=1), None, 1, None, 0, Progress(), None)
            >>> r.load_sampler(LoaderState(seed=0, epoch=0, position=0, dataset_len=4, batch_size=1,
            ...                            drop_last=False, shuffle=False, sampler={"seed": "x"}))
            Traceback (most recent call last):
            ValueError: load_state_dict: 'sampler' cannot be loaded into BijectiveShuffleSampler(len=4, seed=1) (TypeError: BijectiveShuffleSampler.load_state_dict: seed must be an int (got str 'x'))
        """
        sampler = self.seekable
        if self.custom is not None or saved.sampler is None or sampler is None:
            return
        try:
            sampler.load_state_dict(copy.deepcopy(saved.sampler))
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{STAGE}: 'sampler' cannot be loaded into {sampler!r} ({type(e).__name__}: {e})") from e

    def load(self, saved: LoaderState, changes: RecipeChanges, dataset: Any) -> None:
        """Take a validated state: a custom sampler's sub-state, the dataset's, the derivation and
        the recipe changes (the seed is the loader's attribute, the position its progress's)."""
        if self.custom is not None:
            self.custom.load(saved)
        if saved.dataset is not None:
            dataset.load_state_dict(copy.deepcopy(saved.dataset))
        self.derivation = saved.derivation
        self.seed_world = None
        self.control.load(changes)
