"""L3: the loader's verbs beyond torch's: ``set_epoch``, ``indices_at``, ``set_weights``, ``skip``, ``state_at``.

:class:`LoaderVerbs` is a base class of :class:`seqloader.DataLoader` (so the loader module keeps
to torch's arguments, iteration and the state): each verb checks its arguments and hands the work
to one of the loader's parts: :class:`~seqloader.loader.epoch_control.EpochControl` (epochs),
:class:`~seqloader.loader.recipe.Recipe` (what batch ``b`` reads) and
:class:`~seqloader.loader.recipe_control.RecipeControl` (changes during a run; ``docs/recipes.md``).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from seqloader.errors import check_nonnegative_int
from seqloader.loader import world
from seqloader.loader.epoch_control import EpochControl
from seqloader.loader.recipe import Recipe
from seqloader.loader.recipe_control import RecipeControl
from seqloader.loader.state import LoaderState

__all__ = ["LoaderVerbs"]


class LoaderVerbs:
    """The verbs of :class:`seqloader.DataLoader` beyond torch's (see the module docstring)."""

    # provided by DataLoader
    _epochs: EpochControl
    _control: RecipeControl
    _user_sampler: Any
    dataset: Any
    shuffle: Optional[bool]

    def _recipe(self) -> Recipe:  # pragma: no cover - DataLoader's
        raise NotImplementedError

    @property
    def _is_iterable(self) -> bool:  # pragma: no cover - DataLoader's
        raise NotImplementedError

    @property
    def _builtin_order(self) -> bool:  # pragma: no cover - DataLoader's
        raise NotImplementedError

    def state_dict(self) -> dict:  # pragma: no cover - DataLoader's
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Say which epoch the loader reads, as ``DistributedSampler.set_epoch`` does for a sampler.

        The loader counts epochs itself (every ``iter()`` is a new epoch), so a loop needs no
        ``set_epoch``; frameworks call it (the transformers ``Trainer`` on the loader, Lightning on
        ``loader.sampler``, which forwards here), and it is what makes a resume from an epoch's end
        read the next epoch's order. The epoch moves to ``epoch``'s start at once when no batch of
        the current epoch was read yet, or none is left: an iterator that has not yielded a batch
        reads ``epoch`` from its first ``next()``. Mid-epoch it applies from the next ``iter()``
        (the running epoch, and a resumed one, are read to their end as they began). A sampler
        of yours with ``set_epoch`` (a ``DistributedSampler``) is told too, as accelerate's
        loaders do.

        Args:
            epoch: a non-negative int.

        Raises:
            ValueError: ``epoch`` is negative or not an int.

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(6), batch_size=3, shuffle=True, seed=0)
            >>> it = iter(loader); loader.set_epoch(4)    # before the first batch: epoch 4 now
            >>> first = next(it); loader.state_dict()["epoch"]
            4
            >>> loader.set_epoch(7); second = next(it)     # mid-epoch: from the next iter()
            >>> loader.state_dict()["epoch"]
            4
            >>> _ = iter(loader); loader.state_dict()["epoch"]
            7
            >>> loader.set_epoch(-1)
            Traceback (most recent call last):
            ValueError: DataLoader.set_epoch: epoch must be a non-negative int (got -1)
        """
        self._epochs.set_epoch(check_nonnegative_int("DataLoader.set_epoch", "epoch", epoch))

    def indices_at(self, epoch: int, step: int, rank: Optional[int] = None,
                   world_size: Optional[int] = None) -> Any:
        """The dataset indices of batch ``step`` of ``epoch`` on ``rank``, computed without iterating.

        Works for map-style datasets: a pure function of ``(seed, epoch, step)`` and the loader's
        arguments (a custom ``sampler``/``batch_sampler`` is read for that epoch). ``rank`` and
        ``world_size`` default to ``torch.distributed``'s.

        Raises:
            TypeError: an iterable dataset (its streams decide their items).
            IndexError: ``step`` is not a batch of that epoch on that rank.

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(10), batch_size=4, shuffle=True, seed=0)
            >>> loader.indices_at(0, 0) == next(iter(loader)).tolist()
            True
            >>> sorted(sum((loader.indices_at(1, s) for s in range(3)), [])) == list(range(10))
            True
            >>> loader.indices_at(0, 3)
            Traceback (most recent call last):
            IndexError: DataLoader.indices_at: step 3 out of range [0, 3) of epoch 0 (rank 0 of 1)
        """
        if self._is_iterable:
            raise TypeError("DataLoader.indices_at: an IterableDataset's streams decide their items; "
                            "indices exist for map-style datasets only")
        return self._recipe().indices_at(epoch, step, rank, world_size)

    def set_weights(self, weights: Sequence[float], at_step: Optional[int] = None) -> None:
        """Change a mixture's weights from the next batch returned (or from global step ``at_step``).

        The dataset must be a ``seqloader.mix`` read in its own order (``shuffle=False``), or the
        sampler a :class:`~seqloader.WeightedSampler`. Read-ahead computed under the old weights is
        dropped; each source goes on from its cursor (nothing is read twice or skipped). The change
        is recorded in the state (``"recipe"``): a resume anywhere, with any ``num_workers`` or
        world size, reads what the uninterrupted run reads. Weights may be 0 (a source paused, or
        added later). See ``docs/recipes.md``.

        Raises:
            TypeError: the dataset is not a mixture (nor the sampler reweightable).
            ValueError: bad weights (naming the entry), ``shuffle=True``, or ``at_step`` already read.

        Example:
            >>> import seqloader
            >>> m = seqloader.mix([list(range(100)), list(range(100, 200))], weights=[1, 1])
            >>> loader = seqloader.DataLoader(m, batch_size=4, seed=0)
            >>> it = iter(loader); first = next(it).tolist()
            >>> loader.set_weights([0, 1]); next(it).tolist()
            [102, 103, 104, 105]
        """
        target = self._user_sampler if callable(getattr(self._user_sampler, "reweight", None)) else self.dataset
        if target is self.dataset:
            if not callable(getattr(self.dataset, "with_changes", None)):
                raise TypeError("DataLoader.set_weights: the dataset is not a mixture (seqloader.mix) and the "
                                f"sampler has no weights (got {type(self.dataset).__name__})")
            if self.shuffle or not self._builtin_order or self._user_sampler is not None:
                raise ValueError("DataLoader.set_weights: a mixture whose weights change is read in its own order; "
                                 "build the loader with shuffle=False and no sampler (mix(..., seed=) shuffles)")
        self._control.set_weights(self._recipe(), target, weights, at_step)

    def skip(self, indices: Optional[Iterable[int]] = None, steps: Any = None) -> None:
        """Skip samples from the next batch returned on: dataset ``indices`` (in this and every
        later epoch) and/or the batches of global ``steps`` (a ``range``, e.g. after a loss spike).

        Skipped positions are backfilled from the end of the epoch, so batches stay full and
        every rank has the same number; every other batch is unchanged, and the epoch ends that
        many samples earlier. The skips are part of the state (ranges, not per-sample lists).

        Raises:
            TypeError: nothing to skip, or a custom ``sampler``/``batch_sampler`` or an ``IterableDataset``.
            ValueError: a negative index, or steps already read.

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(list(range(10)), batch_size=4, seed=0)
            >>> loader.skip(indices=[1, 2]); [b.tolist() for b in loader]
            [[0, 9, 8, 3], [4, 5, 6, 7]]
        """
        if self._is_iterable or not self._builtin_order:
            raise TypeError("DataLoader.skip: skipping needs the loader's own order (a map-style dataset with "
                            "shuffle=True/False or a seekable sampler), not a custom sampler or an IterableDataset")
        self._control.skip(self._recipe(), indices, steps)

    def state_at(self, epoch: int, step: int, world_size: Optional[int] = None) -> dict:
        """The state this loader would have after ``step`` batches of ``epoch`` on every rank: what
        a rank that lost its state resumes from, knowing ``(seed, epoch, step, world size)`` alone
        (the seed and the recipe's changes are this loader's).

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(10), batch_size=2, shuffle=True, seed=5)
            >>> sd = loader.state_at(epoch=1, step=3, world_size=1); sd["epoch"], sd["position"]
            (1, 6)
        """
        if self._is_iterable or not self._builtin_order:
            raise TypeError("DataLoader.state_at: a state from (epoch, step) needs the loader's own order "
                            "(a map-style dataset, no custom sampler)")
        epoch = check_nonnegative_int("DataLoader.state_at", "epoch", epoch)
        step = check_nonnegative_int("DataLoader.state_at", "step", step)
        size = world.current_world()[1] if world_size is None else world_size
        position = min(self._recipe().position_of_step(step, 0, 0, size), self._recipe().order(epoch).n)
        return LoaderState.from_dict({**self.state_dict(), "epoch": epoch, "position": position, "ahead": [],
                                      "step": step}).to_dict()
