"""L3: the loader's verbs beyond torch's: ``set_epoch``, ``indices_at``, ``set_weights``, ``skip``, ``state_at``.

:class:`Verbs` is a part of :class:`seqloader.DataLoader`, built for each call from the loader's
public settings and its parts (it holds nothing between calls): each verb checks its arguments and
hands the work to a part: :class:`~seqloader.loader.state.progress.EpochControl` (epochs),
:class:`~seqloader.loader.recipe.recipe.Recipe` (what batch ``b`` reads, built by the
:class:`~seqloader.loader.reading.Reading`) and
:class:`~seqloader.loader.recipe.control.RecipeControl` (changes during a run; ``docs/recipes.md``).
The loader's methods of the same names call these and show their docstrings (:func:`documented`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

from seqloader.errors import check_nonnegative_int
from seqloader.loader import world
from seqloader.loader.state.progress import EpochControl
from seqloader.loader.reading import Reading
from seqloader.loader.settings import Settings
from seqloader.loader.saving import state_of
from seqloader.loader.state.state import LoaderState

__all__ = ["Verbs", "documented"]

F = TypeVar("F", bound=Callable[..., Any])


def documented(verb: Callable[..., Any]) -> Callable[[F], F]:
    """Give the decorated method ``verb``'s docstring (a loader method that calls a part's verb).

    Example:
        >>> @documented(Verbs.skip)
        ... def skip(self, indices=None, steps=None): ...
        >>> skip.__doc__ == Verbs.skip.__doc__, documented(lambda: None)(lambda: 0).__doc__  # none to give
        (True, None)
    """
    def apply(method: F) -> F:
        method.__doc__ = verb.__doc__
        return method
    return apply


class Verbs:
    """The verbs of :class:`seqloader.DataLoader` beyond torch's (see the module docstring).

    Args:
        loader: the loader's public settings.
        reading: its :class:`~seqloader.loader.reading.Reading`.
        epochs: its :class:`~seqloader.loader.state.progress.EpochControl` (and through it, its progress).
    """

    def __init__(self, loader: Settings, reading: Reading, epochs: EpochControl):
        self._loader, self._reading, self._epochs = loader, reading, epochs

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
            epoch: an int in ``[0, 2**63)``.

        Raises:
            TypeError: ``epoch`` is not an int.
            ValueError: ``epoch`` is negative or ``>= 2**63``.

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
        epoch = check_nonnegative_int("DataLoader.set_epoch", "epoch", epoch)
        if epoch >= 2**63:
            raise ValueError(f"DataLoader.set_epoch: epoch must be < 2**63 (got {epoch})")
        loader, reading, progress = self._loader, self._reading, self._epochs.progress
        self._epochs.set_epoch(epoch, lambda: reading.used_up(loader, progress))

    def indices_at(self, epoch: int, step: int, rank: Optional[int] = None,
                   world_size: Optional[int] = None) -> Any:
        """The dataset indices of batch ``step`` of ``epoch`` on ``rank``, computed without iterating.

        Works for map-style datasets: a pure function of ``(seed, epoch, step)`` and the loader's
        arguments (a custom ``sampler``/``batch_sampler`` is read for that epoch). ``rank`` and
        ``world_size`` default, each, to ``torch.distributed``'s.

        Args:
            epoch: an int in ``[0, 2**63)``.
            step: the batch of that epoch on that rank, from 0.
            rank, world_size: the process and the number of processes, ``0 <= rank < world_size``.

        Returns:
            The batch's dataset indices (a list; one index with ``batch_size=None``).

        Raises:
            TypeError: an iterable dataset (its streams decide their items), or an argument that is
                not an int.
            ValueError: a negative ``epoch``, ``world_size < 1``, or ``rank`` outside ``[0, world_size)``.
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
            >>> loader.indices_at(0, 1, rank=3, world_size=2)
            Traceback (most recent call last):
            ValueError: DataLoader.indices_at: rank 3 out of range [0, 2) (world_size=2); a rank is a process of the world
        """
        if self._reading.iterable:
            raise TypeError("DataLoader.indices_at: an IterableDataset's streams decide their items; "
                            "indices exist for map-style datasets only")
        return self._reading.recipe(self._loader).indices_at(epoch, step, rank, world_size)

    def set_weights(self, weights: Sequence[float], at_step: Optional[int] = None) -> None:
        """Change a mixture's weights from the next batch returned (or from global step ``at_step``).

        The dataset must be a ``seqloader.mix`` read in its own order (``shuffle=False``), or the
        sampler a :class:`~seqloader.WeightedSampler`. Read-ahead computed under the old weights is
        dropped; each source goes on from its cursor (nothing is read twice or skipped). The change
        is recorded in the state (``"recipe"``): a resume anywhere, with any ``num_workers`` or
        world size, reads what the uninterrupted run reads. Weights may be 0 (a source paused, or
        added later). See ``docs/recipes.md``. Everything is checked at the call, and a refused
        call leaves the loader as it was.

        Args:
            weights: one number ``>= 0`` per source of the mixture (per dataset index for a
                ``WeightedSampler``), at least one ``> 0``.
            at_step: the global step from which they apply (``None``: the next batch returned);
                not already read, ``< 2**63``.

        Raises:
            TypeError: the dataset is not a mixture (nor the sampler reweightable), or ``weights``
                is not a sequence of numbers.
            ValueError: bad weights (their number, or naming the entry; the mixture's own limits,
                such as the smallest share a mix block holds), ``shuffle=True``, or ``at_step``
                already read.

        Example:
            >>> import seqloader
            >>> m = seqloader.mix([list(range(100)), list(range(100, 200))], weights=[1, 1])
            >>> loader = seqloader.DataLoader(m, batch_size=4, seed=0)
            >>> it = iter(loader); first = next(it).tolist()
            >>> loader.set_weights([0, 1]); next(it).tolist()
            [102, 103, 104, 105]
            >>> loader.set_weights([1, 2, 3])
            Traceback (most recent call last):
            ValueError: DataLoader.set_weights: weights must have one entry per source (2; got 3)
            >>> next(it).tolist()
            [106, 107, 108, 109]
        """
        reading, dataset = self._reading, self._loader.dataset
        target = reading.sampler if callable(getattr(reading.sampler, "reweight", None)) else dataset
        if target is dataset:
            if not callable(getattr(dataset, "with_changes", None)):
                raise TypeError("DataLoader.set_weights: the dataset is not a mixture (seqloader.mix) and the "
                                f"sampler has no weights (got {type(dataset).__name__})")
            if self._loader.shuffle or not reading.builtin or reading.sampler is not None:
                raise ValueError("DataLoader.set_weights: a mixture whose weights change is read in its own order; "
                                 "build the loader with shuffle=False and no sampler (mix(..., seed=) shuffles)")
        reading.control.set_weights(reading.recipe(self._loader), target, weights, at_step)

    def skip(self, indices: Optional[Iterable[int]] = None, steps: Any = None) -> None:
        """Skip samples from the next batch returned on: dataset ``indices`` (in this and every
        later epoch) and/or the batches of global ``steps`` (a ``range``, e.g. after a loss spike).

        Skipped positions are backfilled from the end of the epoch, so batches stay full and
        every rank has the same number; every other batch is unchanged, and the epoch ends that
        many samples earlier. The skips are part of the state (ranges, not per-sample lists).

        Args:
            indices: dataset indices, each in ``[0, len(dataset))``.
            steps: a ``range`` of global steps (step 1), or a ``(start, stop)`` pair: steps of the
                epoch being read, not already read.

        Raises:
            TypeError: nothing to skip, arguments of the wrong type, or a custom
                ``sampler``/``batch_sampler`` or an ``IterableDataset``.
            ValueError: an index outside the dataset, steps already read, or steps past the end of
                the epoch being read (nothing of theirs would be skipped).

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(list(range(10)), batch_size=4, seed=0)
            >>> loader.skip(indices=[1, 2]); [b.tolist() for b in loader]
            [[0, 9, 8, 3], [4, 5, 6, 7]]
            >>> loader.skip(indices=[10])
            Traceback (most recent call last):
            ValueError: DataLoader.skip: indices holds 10, outside [0, 10) (the dataset's indices)
        """
        if self._reading.iterable or not self._reading.builtin:
            raise TypeError("DataLoader.skip: skipping needs the loader's own order (a map-style dataset with "
                            "shuffle=True/False or a seekable sampler), not a custom sampler or an IterableDataset")
        self._reading.control.skip(self._reading.recipe(self._loader), indices, steps)

    def state_at(self, epoch: int, step: int, world_size: Optional[int] = None) -> dict:
        """The state this loader would have after ``step`` batches of ``epoch`` on every rank: what
        a rank that lost its state resumes from, knowing ``(seed, epoch, step, world size)`` alone
        (the seed and the recipe's changes are this loader's). It checks its arguments as
        :meth:`indices_at` does, except that ``step`` may be the epoch's number of batches (the
        state after its last batch).

        Args:
            epoch: an int in ``[0, 2**63)``.
            step: batches read of that epoch, from 0 to the epoch's number of batches per rank.
            world_size: the number of processes (``None``: ``torch.distributed``'s).

        Returns:
            A state dict for :meth:`load_state_dict`.

        Raises:
            TypeError: an iterable dataset or a custom sampler, or an argument that is not an int.
            ValueError: a negative ``epoch`` or ``world_size < 1``.
            IndexError: ``step`` is more than the epoch's batches.

        Example:
            >>> import seqloader
            >>> loader = seqloader.DataLoader(range(10), batch_size=2, shuffle=True, seed=5)
            >>> sd = loader.state_at(epoch=1, step=3, world_size=1); sd["epoch"], sd["position"]
            (1, 6)
            >>> loader.state_at(epoch=1, step=6, world_size=1)
            Traceback (most recent call last):
            IndexError: DataLoader.state_at: step 6 out of range [0, 6) of epoch 1 (rank 0 of 1)
        """
        if self._reading.iterable or not self._reading.builtin:
            raise TypeError("DataLoader.state_at: a state from (epoch, step) needs the loader's own order "
                            "(a map-style dataset, no custom sampler)")
        recipe = self._reading.recipe(self._loader)
        size = world.current_world()[1] if world_size is None else world_size
        _, step = recipe.step_plan("DataLoader.state_at", epoch, step, 0, size, after=True)
        position = min(recipe.position_of_step(step, 0, 0, size), recipe.order(epoch).n)
        now = state_of(self._loader, self._reading, self._epochs.progress).to_dict()
        return LoaderState.from_dict({**now, "epoch": epoch, "position": position, "ahead": [],
                                      "step": step}).to_dict()
