"""``seqloader.DataLoader``: torch's ``DataLoader`` with exact, O(1) mid-epoch resume.

The loader holds its :class:`~seqloader.loader.progress.Progress` (``(epoch, position)``) and,
per epoch, composes lazy sequences instead of forking torch's iterator: the epoch's order
(``loader/sampling.py``) -> fetch + collate (``loader/fetch.py``) -> ``Prefetch`` over worker
processes (``loader/workers.py``, ``num_workers > 0``) -> pin memory (``loader/epoch.py``).
Resuming is a seek: the order is rebuilt from ``(seed, epoch)`` and read from ``position``.
``IterableDataset`` s run on torch's own machinery (``loader/iterable.py``).

Epochs: the first ``iter(loader)`` reads epoch 0. The epoch counter advances when the last batch
of an epoch is yielded (or when an iterator finds its epoch empty), and also when ``iter()`` is
called again after an unfinished epoch (like torch, every ``iter()`` is a new epoch) unless
``load_state_dict`` was called in between: then the next ``iter()`` resumes the loaded state.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from typing import Any, Optional, TypeVar

import torch
import torch.utils.data

from seqloader.loader import sampling
from seqloader.loader.epoch import MapIterator, pin_device
from seqloader.loader.fetch import EpochBatches
from seqloader.loader.iterable import IterableIterator
from seqloader.loader.progress import Progress
from seqloader.loader.state import LoaderState, check_matches, is_stateful
from seqloader.loader.workers import Workers
from seqloader.rng import check_seed

__all__ = ["DataLoader", "StatefulDataLoader"]

T_co = TypeVar("T_co", covariant=True)


@dataclasses.dataclass(frozen=True)
class _EpochIndices:
    """A custom sampler's (or batch_sampler's) indices for one epoch, and its state before them."""

    epoch: int
    items: Any
    sampler_state: Any


class DataLoader(torch.utils.data.DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` whose ``state_dict`` resumes exactly, by seeking.

    Takes torch's arguments (validated by torch, stored as attributes of the same names) and
    ``seed``. ``state_dict()`` is a small dict of JSON types; after ``load_state_dict(sd)`` the next
    ``iter(loader)`` yields exactly the batches the uninterrupted run yielded after the save, and
    the following epochs too, with any ``num_workers``. Every batch is produced right after the
    global RNGs (``random``, ``numpy.random``, torch) are seeded from ``(seed, epoch, position)``,
    so batches do not depend on ``num_workers`` or ``persistent_workers``; at ``num_workers=0`` the
    caller's RNG states are left as they were.

    Args:
        dataset: as in torch, and so are ``batch_size``, ``shuffle``, ``sampler``,
            ``batch_sampler``, ``num_workers``, ``collate_fn``, ``pin_memory``, ``drop_last``,
            ``timeout``, ``worker_init_fn``, ``multiprocessing_context``, ``generator``,
            ``prefetch_factor``, ``persistent_workers``, ``pin_memory_device`` and ``in_order``.
            ``shuffle=True`` uses a permutation derived from ``(seed, epoch)`` instead of a
            ``RandomSampler``. A custom ``sampler``/``batch_sampler`` is iterated (indices only)
            at the start of each epoch; if it has ``state_dict``/``load_state_dict`` its state
            from the start of the epoch is saved. :class:`~seqloader.BijectiveShuffleSampler` is
            read in O(1) per batch. Batches are always yielded in order (``in_order=False`` is
            accepted and changes nothing). An ``IterableDataset`` runs on torch's own workers,
            which restart every epoch (``persistent_workers`` does not keep them); it resumes
            only with the same ``num_workers``.
        seed: an int in ``[0, 2**64)``; ``None`` draws one from ``generator`` (torch's default
            generator if ``None``), so ``torch.manual_seed`` before construction reproduces runs.

    Raises:
        ValueError, TypeError: as torch for bad argument combinations; a bad ``seed``.

    Example:
        >>> loader = DataLoader(list(range(15)), batch_size=5, shuffle=True, seed=0)
        >>> it = iter(loader); first = next(it); sd = loader.state_dict()
        >>> rest = [b.tolist() for b in it]
        >>> resumed = DataLoader(list(range(15)), batch_size=5, shuffle=True, seed=0)
        >>> resumed.load_state_dict(sd)
        >>> [b.tolist() for b in resumed] == rest, sd["position"]
        (True, 5)
        >>> resumed.load_state_dict({**sd, "dataset_len": 16})
        Traceback (most recent call last):
        ValueError: load_state_dict: 'dataset_len' is 16 in the state_dict but len(dataset) is 15; this state was saved for a different dataset
    """

    def __init__(self, dataset, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None,
                 sampler=None, batch_sampler=None, num_workers: int = 0, collate_fn=None,
                 pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True, seed: Optional[int] = None):
        # Every argument by keyword: frameworks (Lightning) patch DataLoader.__init__ and map
        # positional arguments by their own signature.
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                         pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                         worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=generator,
                         prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        self.shuffle = shuffle
        self.seed = sampling.draw_seed(generator) if seed is None else check_seed("DataLoader", seed)
        # A seed is shared by all ranks when given, loaded, or drawn under an initialised world
        # (draw_seed broadcasts rank 0's). One drawn per process cannot shard a global order.
        self._seed_world = sampling.current_world()[1] if seed is None else None
        # The user's own sampler objects (torch builds defaults into .sampler / .batch_sampler).
        self._user_sampler = sampler
        self._user_batch_sampler = batch_sampler
        self._progress = Progress(max(1, num_workers) if self._is_iterable else None)
        self._indices: Optional[_EpochIndices] = None
        self._workers = Workers()  # the live Prefetch (kept across epochs if persistent)
        weakref.finalize(self, self._workers.close)

    # -- what is read --------------------------------------------------------------------------

    @property
    def _is_iterable(self) -> bool:
        return isinstance(self.dataset, torch.utils.data.IterableDataset)

    @property
    def _builtin_order(self) -> bool:
        return self._user_batch_sampler is None and (
            self._user_sampler is None or isinstance(self._user_sampler, sampling.BijectiveShuffleSampler))

    @property
    def _stateful_sampler(self) -> Any:
        obj = self._user_batch_sampler if self._user_batch_sampler is not None else self._user_sampler
        return obj if is_stateful(obj) else None

    def _order(self, epoch: int) -> Any:
        if isinstance(self._user_sampler, sampling.BijectiveShuffleSampler):
            return self._user_sampler.order(epoch)
        return sampling.builtin_order(len(self.dataset), self.seed, epoch, bool(self.shuffle))

    def _plan(self, epoch: int, position: int) -> Any:
        if self._builtin_order:
            rank, world = sampling.current_world()
            return sampling.OrderPlan(self._order(epoch), position, self.batch_size, self.drop_last,
                                      rank, world)
        if self._indices is None or self._indices.epoch != epoch:
            stateful = self._stateful_sampler
            before = copy.deepcopy(stateful.state_dict()) if stateful is not None else None
            with sampling.sampler_globals(self.seed, epoch):
                if self._user_batch_sampler is not None:
                    items = sampling.materialise_batches(self._user_batch_sampler)
                else:
                    items = sampling.materialise_order(self._user_sampler)
            self._indices = _EpochIndices(epoch, items, before)
        if self._user_batch_sampler is not None:
            return sampling.BatchListPlan(self._indices.items, position)
        return sampling.OrderPlan(self._indices.items, position, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        if self._is_iterable or not self._builtin_order:
            return super().__len__()
        rank, world = sampling.current_world()
        return len(sampling.OrderPlan(sampling._Range(len(self.dataset)), 0, self.batch_size,
                                      self.drop_last, rank, world))

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self):
        if self.timeout and self.num_workers == 0:
            raise ValueError(f"DataLoader: timeout={self.timeout} needs num_workers > 0 (got "
                             "num_workers=0); set timeout=0 or use worker processes")
        if self.num_workers > 0:
            self.check_worker_number_rationality()
        self._check_seed_is_shared()
        device = pin_device(self)
        progress = self._progress
        generation = progress.begin()
        self._workers.drop_transient()
        if self._is_iterable:
            return IterableIterator(self, progress, generation, device)
        epoch = progress.epoch
        seq = EpochBatches(self.dataset, self._plan(epoch, progress.position), self.collate_fn,
                           self.seed, epoch)
        source = seq
        if self.num_workers > 0 and len(seq) > 0:
            source = self._workers.open(self, seq, epoch)
        return MapIterator(self, progress, generation, self._workers, seq, source, device)

    def _check_seed_is_shared(self) -> None:
        world = sampling.current_world()[1]
        if (world > 1 and self._seed_world is not None and self._seed_world != world
                and not self._is_iterable and self._builtin_order):
            raise ValueError(
                f"DataLoader: seed=None was drawn when torch.distributed had world_size="
                f"{self._seed_world}, but it now has world_size={world}, so the ranks may not "
                "agree on the epoch order; build the loader after init_process_group, or pass "
                "seed=, or load a state_dict")

    def _get_iterator(self):
        """torch's hook for a new iterator: ours (never torch's single/multi-process iterators)."""
        return self.__iter__()

    # -- state ---------------------------------------------------------------------------------

    def _state(self, dataset_state: Any, sampler_state: Any) -> LoaderState:
        rank, world = sampling.current_world()
        progress = self._progress
        return LoaderState(
            seed=self.seed, epoch=progress.epoch, position=progress.position,
            dataset_len=_len_or_none(self.dataset), batch_size=self.batch_size,
            drop_last=self.drop_last, shuffle=bool(self.shuffle) and not self._is_iterable,
            sampler_len=(None if self._is_iterable or self._builtin_order else _len_or_none(
                self._user_batch_sampler if self._user_batch_sampler is not None else self._user_sampler)),
            sampler=sampler_state, dataset=dataset_state,
            iterable=None if progress.iterable is None else progress.iterable.copy(),
            saved_with={"num_workers": self.num_workers, "world_size": world})

    def state_dict(self) -> dict:
        """The resume state: valid before ``iter``, mid-epoch and at the end of an epoch.

        Returns:
            A dict of JSON types (plus the verbatim ``state_dict()`` of a Stateful sampler or
            dataset); see ``docs/design.md`` for its keys and versions.

        Example:
            >>> sd = DataLoader(range(10), batch_size=4, seed=1).state_dict()
            >>> sd["epoch"], sd["position"], sd["dataset_len"], sd["sampler"]
            (0, 0, 10, None)
        """
        sampler = self._stateful_sampler
        if sampler is None:
            sampler_state = None
        elif (self._indices is not None and self._indices.epoch == self._progress.epoch
              and self._progress.started):
            sampler_state = self._indices.sampler_state
        else:
            sampler_state = sampler.state_dict()
        dataset_state = None
        if not self._is_iterable and is_stateful(self.dataset):
            dataset_state = self.dataset.state_dict()
        return self._state(dataset_state, sampler_state).to_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next ``iter(loader)`` resume from ``state_dict`` (see :meth:`state_dict`).

        Everything is validated before anything changes; then a Stateful sampler and dataset get
        their sub-states, live iterators of this loader stop, and persistent workers restart.

        Args:
            state_dict: a dict from :meth:`state_dict` (possibly through JSON).

        Raises:
            TypeError: ``state_dict`` is not a dict.
            ValueError: unknown format or newer version, a malformed value, or a state saved for
                a different dataset, batch size, ``drop_last``, ``shuffle``, sampler kind or (for
                an ``IterableDataset``) a different ``num_workers``; the message names the key,
                the saved and the current value.

        Example:
            >>> loader = DataLoader(range(6), batch_size=2, seed=0)
            >>> sd = loader.state_dict(); loader.load_state_dict(sd)
            >>> loader.load_state_dict({**sd, "batch_size": 3})
            Traceback (most recent call last):
            ValueError: load_state_dict: 'batch_size' is 3 in the state_dict but this loader has batch_size=2; build the loader with the arguments it was saved with
        """
        saved = LoaderState.from_dict(state_dict)
        current = self._state(
            dataset_state=(self.dataset.state_dict()
                           if not self._is_iterable and is_stateful(self.dataset) else None),
            sampler_state=self._stateful_sampler.state_dict() if self._stateful_sampler else None)
        check_matches(saved, current)
        if (not self._is_iterable and self._builtin_order and saved.position
                and saved.position >= (saved.dataset_len or 0)):
            raise ValueError(f"load_state_dict: 'position' is {saved.position} in the state_dict but "
                             f"an epoch of this loader has {saved.dataset_len} samples; the state is "
                             "corrupt or was saved for a different loader")
        # validated: mutate
        self._workers.close()
        if saved.sampler is not None:
            self._stateful_sampler.load_state_dict(copy.deepcopy(saved.sampler))
        if saved.dataset is not None:
            self.dataset.load_state_dict(copy.deepcopy(saved.dataset))
        self.seed = saved.seed
        self._seed_world = None
        self._indices = None
        self._progress.load(saved.epoch, saved.position,
                            None if saved.iterable is None else saved.iterable.copy())


#: torchdata's name for the same thing.
StatefulDataLoader = DataLoader


def _len_or_none(dataset: Any) -> Optional[int]:
    try:
        return len(dataset)
    except TypeError:
        return None
