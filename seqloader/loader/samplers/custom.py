"""L3: a user's own ``sampler`` or ``batch_sampler``: its indices per epoch, and their resume state.

A custom sampler is iterated (indices only, the dataset is not read) once per epoch, at the
iterator's first ``next()`` (as torch's single-process loader iterates it: a ``set_epoch`` made
between ``iter()`` and the first batch, as Lightning makes it, is the epoch read; until then
``len(iterator)`` is torch's, :meth:`CustomOrder.batches`), inside :func:`~seqloader.loader.rngs.seeding.sampler_globals` so that one drawing from the
global RNGs gives the same order for the same ``(seed, epoch)``. What is saved with the loader's
position to resume that epoch:

* a Stateful sampler (``state_dict``/``load_state_dict``) that keeps its own generator: its state
  from *before* the epoch's indices were read, so that the resumed epoch reads the same order;
* a :class:`~seqloader.sampler.StatefulDistributedSampler`, whose state *is* a position in the
  epoch: ``{"yielded": position}``, the loader's own position, so the state equals torchdata's.
  Its epoch's order is read without touching its counters, and resuming is the loader's seek;
* a sampler with ``set_epoch`` (``DistributedSampler``, the one Lightning injects, or inside a
  ``batch_sampler``): its ``epoch`` when the indices were read (``"sampler_epoch"``); after
  ``load_state_dict`` the resumed epoch is read with that epoch, whether the framework calls
  ``set_epoch`` before or after ``iter()``; later epochs read whatever ``set_epoch`` said.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

import torch.utils.data

from seqloader.orders.orders import materialise_order
from seqloader.orders.plans import BatchListPlan, OrderPlan, materialise_batches
from seqloader.loader.rngs.seeding import sampler_globals
from seqloader.loader.state.state import LoaderState, is_stateful
from seqloader.sampler import StatefulDistributedSampler

__all__ = ["CustomOrder"]


@dataclasses.dataclass(frozen=True)
class _EpochIndices:
    """One epoch's indices (or batches), and what the state needs to read them again."""

    epoch: int
    items: Any
    sampler_state: Any
    sampler_epoch: Optional[int]


class CustomOrder:
    """The indices of a user's ``sampler`` or ``batch_sampler``; see the module docstring.

    Example:
        >>> order = CustomOrder(sampler=[3, 1, 2], batch_sampler=None)
        >>> plan = order.plan(epoch=0, position=1, seed=0, derivation=2, batch_size=2, drop_last=False)
        >>> plan.batch(0)
        (1, [1, 2])
    """

    def __init__(self, sampler: Any, batch_sampler: Any):
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self._indices: Optional[_EpochIndices] = None
        self._resume_epoch: Optional[int] = None  # a loaded sampler_epoch, for the next read

    @property
    def _source(self) -> Any:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    @property
    def _counts_positions(self) -> bool:
        return isinstance(self.sampler, StatefulDistributedSampler) and self.batch_sampler is None

    @property
    def stateful(self) -> Any:
        """The sampler whose state is saved, or ``None``."""
        return self._source if is_stateful(self._source) else None

    def epoch_owner(self) -> Any:
        """The sampler with ``set_epoch`` (the sampler, the batch sampler or the latter's sampler)."""
        for obj in (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if obj is not None and callable(getattr(obj, "set_epoch", None)):
                return obj
        return None

    def __len__(self) -> int:
        return len(self._source)

    def batches(self, batch_size: Optional[int], drop_last: bool) -> int:
        """torch's ``len(index_sampler)``: the epoch's batches, from the samplers' ``len`` (nothing is
        iterated); a sampler without ``len`` raises torch's ``TypeError``.

        Example:
            >>> CustomOrder(sampler=range(5), batch_sampler=None).batches(2, drop_last=False)
            3
            >>> CustomOrder(sampler=range(5), batch_sampler=None).batches(2, drop_last=True)
            2
        """
        if self.batch_sampler is not None or batch_size is None:
            return len(self._source)
        n = len(self.sampler)
        return n // batch_size if drop_last else -(-n // batch_size)

    def _read(self, epoch: int, seed: int, derivation: int) -> _EpochIndices:
        owner = self.epoch_owner()
        if owner is not None and self._resume_epoch is not None:
            owner.set_epoch(self._resume_epoch)
        self._resume_epoch = None
        stateful = self.stateful
        before = None
        if stateful is not None and not self._counts_positions:
            before = copy.deepcopy(stateful.state_dict())
        items: Any
        with sampler_globals(seed, epoch, derivation):
            if self.batch_sampler is not None:
                items = materialise_batches(self.batch_sampler)
            elif self._counts_positions:  # the epoch's order, without moving its counters
                items = materialise_order(
                    torch.utils.data.DistributedSampler.__iter__(self.sampler))
            else:
                items = materialise_order(self.sampler)
        return _EpochIndices(epoch, items, before, getattr(owner, "epoch", None))

    def plan(self, epoch: int, position: int, seed: int, derivation: int,
             batch_size: Optional[int], drop_last: bool) -> Any:
        """The plan of ``epoch`` from ``position`` (indices read once per epoch)."""
        if self._indices is None or self._indices.epoch != epoch:
            self._indices = self._read(epoch, seed, derivation)
        if self.batch_sampler is not None:
            return BatchListPlan(self._indices.items, position)
        return OrderPlan(self._indices.items, position, batch_size, drop_last)

    def forget(self) -> None:
        """Read the indices again at the next :meth:`plan` (the sampler's epoch changed)."""
        self._indices = None

    def state(self, epoch: int, position: int, started: bool) -> tuple[Any, Optional[int]]:
        """``(sampler sub-state, sampler_epoch)`` for a state saved at ``(epoch, position)``."""
        current = self._indices if (self._indices is not None and self._indices.epoch == epoch
                                    and started) else None
        owner = self.epoch_owner()
        if self._resume_epoch is not None:
            sampler_epoch: Optional[int] = self._resume_epoch
        elif current is not None:
            sampler_epoch = current.sampler_epoch
        else:
            sampler_epoch = getattr(owner, "epoch", None) if owner is not None else None
        stateful = self.stateful
        if stateful is None:
            return None, sampler_epoch
        if self._counts_positions:
            return {"yielded": position}, sampler_epoch
        return (current.sampler_state if current is not None else stateful.state_dict()), sampler_epoch

    def check(self, saved: LoaderState) -> None:
        """Raise ``ValueError`` if ``saved``'s sampler state cannot resume this sampler."""
        if self._counts_positions and saved.sampler is not None and saved.sampler != {"yielded": saved.position}:
            raise ValueError(f"load_state_dict: 'sampler' is {saved.sampler!r} in the state_dict but "
                             f"'position' is {saved.position}; a StatefulDistributedSampler's state is "
                             "the loader's position, so this state is corrupt")

    def load(self, saved: LoaderState) -> None:
        """Take ``saved``'s sampler state (after :meth:`check`)."""
        self._indices = None
        self._resume_epoch = saved.sampler_epoch if self.epoch_owner() is not None else None
        if saved.sampler is not None and not self._counts_positions:
            self.stateful.load_state_dict(copy.deepcopy(saved.sampler))
