"""``seqloader.DataLoader``: torch's ``DataLoader`` with exact, O(1) mid-epoch resume.

The loader holds its :class:`~seqloader.loader.progress.Progress` (``(epoch, position)``) and,
per epoch, composes lazy sequences instead of forking torch's iterator: the epoch's order
(``loader/sampling.py``) -> fetch + collate (``loader/fetch.py``) -> ``Prefetch`` over worker
processes (``loader/workers.py``, ``num_workers > 0``) -> pin memory (``loader/epoch.py``).
Resuming is a seek: the order is rebuilt from ``(seed, epoch)`` and read from ``position``.
An ``IterableDataset`` is read as one stream per worker, round-robin, on the same workers
(``loader/iterable.py``).

Epochs: the first ``iter(loader)`` reads epoch 0. The epoch counter advances when the last batch
of an epoch is yielded (or when an iterator finds its epoch empty), and also when ``iter()`` is
called again after an unfinished epoch (like torch, every ``iter()`` is a new epoch) unless
``load_state_dict`` was called in between: then the next ``iter()`` resumes the loaded state.
``set_epoch(e)`` (on the loader, on ``loader.sampler``, or a sampler's own ``set_epoch``) sets the
counter the way frameworks expect; an iterator settles its epoch's order at its first ``next()``,
so a ``set_epoch`` made between ``iter()`` and the first batch is read (Lightning does that).
"""

from __future__ import annotations

import copy
import os
import weakref
from typing import Any, Optional, TypeVar

import torch
import torch.utils.data

from seqloader.loader import sampling
from seqloader.errors import check_nonnegative_int
from seqloader.loader.custom_order import CustomOrder
from seqloader.loader.default_sampler import forwarding_sampler
from seqloader.loader.epoch import MapIterator, pin_device
from seqloader.loader.fetch import EpochBatches
from seqloader.loader.iterable import IterableIterator
from seqloader.loader.progress import Progress
from seqloader.loader.seeding import DERIVATION
from seqloader.loader.state import LoaderState, check_matches, is_stateful
from seqloader.loader.stats import LoaderStats
from seqloader.loader.workers import Workers
from seqloader.rng import check_seed

__all__ = ["DataLoader", "StatefulDataLoader"]

T_co = TypeVar("T_co", covariant=True)


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
            read in O(1) per batch. ``in_order=False`` (with workers) yields batches as they
            complete; the state then records the in-order watermark and the few batches
            yielded past it, so a resume yields each remaining batch once. An
            ``IterableDataset`` is read as one stream per worker, round-robin like torch, on
            seqloader's workers (kept across epochs with ``persistent_workers``); it resumes
            from each stream's state, with the same ``num_workers`` only.
        snapshot_every_n_steps: accepted for torchdata compatibility and kept as an attribute;
            it changes nothing, since every ``state_dict()`` is exact at no per-step cost.
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
                 pin_memory_device: str = "", in_order: bool = True,
                 snapshot_every_n_steps: Optional[int] = 1, seed: Optional[int] = None):
        # seqloader's own attributes come first: Lightning records what is set after torch's
        # __init__ and replays it on the loader it rebuilds (with its DistributedSampler).
        self.shuffle = shuffle
        # torchdata's knob: how often its workers snapshot their state. Every state_dict() here is
        # exact at no per-step cost, so it changes nothing; kept for drop-in compatibility.
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.seed = sampling.draw_seed(generator) if seed is None else check_seed("DataLoader", seed)
        # A seed is shared by all ranks when given, loaded, or drawn under an initialised world
        # (draw_seed broadcasts rank 0's). One drawn per process cannot shard a global order.
        self._seed_world = sampling.current_world()[1] if seed is None else None
        # The user's own sampler objects (torch builds defaults into .sampler / .batch_sampler).
        self._user_sampler = sampler
        self._user_batch_sampler = batch_sampler
        self._custom = None if self._builtin_order else CustomOrder(sampler, batch_sampler)
        self._derivation = DERIVATION  # a loaded state brings its own (see loader/seeding.py)
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._progress = (Progress(max(1, num_workers), carry=persistent_workers or num_workers == 0)
                          if iterable else Progress())
        self._workers = Workers()  # persistent workers (kept across epochs); others live in iterators
        self._stats = LoaderStats()
        # Every argument by keyword: frameworks (Lightning) patch DataLoader.__init__ and map
        # positional arguments by their own signature.
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                         pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                         worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=generator,
                         prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        if not iterable and sampler is None and batch_sampler is None:
            # torch's default sampler, whose set_epoch reaches this loader (Lightning calls it
            # there); torch forbids assigning .sampler after __init__, and the copy is the same
            # sampler, so it is set underneath, in both places torch keeps it
            default = forwarding_sampler(self.sampler, self)
            object.__setattr__(self, "sampler", default)
            if self.batch_sampler is not None:  # batch_size=None has none
                self.batch_sampler.sampler = default
        weakref.finalize(self, self._workers.close)

    # -- what is read --------------------------------------------------------------------------

    @property
    def _is_iterable(self) -> bool:
        return isinstance(self.dataset, torch.utils.data.IterableDataset)

    @property
    def _builtin_order(self) -> bool:
        return self._user_batch_sampler is None and (
            self._user_sampler is None or isinstance(self._user_sampler, sampling.BijectiveShuffleSampler))

    def _order(self, epoch: int) -> Any:
        if isinstance(self._user_sampler, sampling.BijectiveShuffleSampler):
            return self._user_sampler.order(epoch)
        return sampling.builtin_order(len(self.dataset), self.seed, epoch, bool(self.shuffle),
                                      self._derivation)

    def _plan(self, epoch: int, position: int) -> Any:
        if self._builtin_order:
            rank, world = sampling.current_world()
            return sampling.OrderPlan(self._order(epoch), position, self.batch_size, self.drop_last,
                                      rank, world)
        return self._custom.plan(epoch, position, self.seed, self._derivation, self.batch_size,
                                 self.drop_last)

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
        self._stats.begin(progress.epoch, progress.resumed)
        if self._is_iterable:
            return IterableIterator(self, progress, generation, device)
        seq, source, skip = self._open_epoch()
        return MapIterator(self, progress, generation, seq, source, device, skip)

    def _epoch_batches(self) -> tuple[EpochBatches, frozenset]:
        """The batches of the progress's epoch from its position, and those to skip (``ahead``)."""
        progress = self._progress
        epoch = progress.epoch
        seq = EpochBatches(self.dataset, self._plan(epoch, progress.position), self.collate_fn,
                           self.seed, epoch, self._derivation)
        skip = frozenset(seq.batch_of(k) for k in progress.ahead)
        if None in skip:
            raise ValueError(f"DataLoader: the loaded state's 'ahead' keys {list(progress.ahead)} are not all "
                             f"batches of epoch {epoch} from position {progress.position}; the state is "
                             "corrupt or was saved for a different loader")
        return seq, skip

    def _open_epoch(self) -> tuple[EpochBatches, Any, frozenset]:
        """``(batches, source, skip)``: the source is the batches, or the workers' Prefetch over them."""
        seq, skip = self._epoch_batches()
        source: Any = seq
        if self.num_workers > 0 and len(seq) > 0:
            source = self._workers.open(self, seq, self._progress.epoch, affinity=self.in_order)
            source.start()  # like torch: a failing worker_init_fn raises here, at iter()
            self._stats.attach(source)
        return seq, source, skip

    # -- epochs --------------------------------------------------------------------------------

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
            >>> loader = DataLoader(range(6), batch_size=3, shuffle=True, seed=0)
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
        watch = self._epoch_watch()
        if watch is not None:
            watch[0].set_epoch(epoch)
        self._set_epoch(epoch, used_up=None)

    def _set_epoch(self, epoch: int, used_up: Optional[bool]) -> None:
        progress = self._progress
        if self._is_iterable:  # a stream's iterator is opened at iter(): it keeps its epoch
            now = not progress.begun and not progress.started
        else:
            now = not progress.begun or (self._used_up() if used_up is None else used_up)
        progress.set_epoch(epoch, now)

    def _used_up(self) -> bool:
        seq, skip = self._epoch_batches()
        return len(seq) == len(skip)

    def _epoch_watch(self) -> Optional[tuple[Any, Any]]:
        """A sampler whose own ``set_epoch`` the loader follows, with its epoch now (or ``None``)."""
        owner = self._custom.epoch_owner() if self._custom is not None else None
        if isinstance(self._user_sampler, sampling.BijectiveShuffleSampler):
            owner = self._user_sampler
        return None if owner is None else (owner, getattr(owner, "epoch", None))

    def _settle(self, watch: Optional[tuple[Any, Any]], used_up: bool) -> bool:
        """At an iterator's first ``next()``: follow a sampler's ``set_epoch`` made since ``iter()``
        (``watch``). Returns whether the order must be read again although the loader's epoch and
        position did not change (the sampler's new epoch changes its indices)."""
        if watch is None:
            return False
        owner, seen = watch
        now = getattr(owner, "epoch", None)
        if now == seen or not isinstance(now, int):
            return False
        self._set_epoch(now, used_up)
        if self._progress.begun:  # mid-epoch (a resumed one): read on as it began
            return False
        if self._custom is not None:
            self._custom.forget()
        return True

    def _check_seed_is_shared(self) -> None:
        world = sampling.current_world()[1]
        if (world > 1 and self._seed_world is not None and self._seed_world != world
                and not self._is_iterable and self._builtin_order):
            raise ValueError(
                f"DataLoader: seed=None was drawn when torch.distributed had world_size="
                f"{self._seed_world}, but it now has world_size={world}, so the ranks may not "
                "agree on the epoch order; build the loader after init_process_group, or pass "
                "seed=, or load a state_dict")

    def stats(self) -> dict:
        """Where the time goes, for the current and the last epoch: is the loop waiting for data?

        Returns:
            ``{"current": {...} or None, "last": {...} or None, "resumes": int, "hint": str or
            None}``. Each epoch entry has ``epoch``, ``batches``, ``wait_s`` (time inside
            ``next()``), ``work_s`` (time between ``next()`` calls), ``input_bound`` (their
            ratio: the fraction of wall time spent waiting), ``batches_per_s``, and, with
            workers, ``workers`` (per worker ``busy_s`` and ``items``), ``ready_mean`` (batches
            already computed when one was read) and ``shm_bytes``. ``hint`` suggests more
            workers only when the loop is input-bound and every worker is busy.

        Example:
            >>> loader = DataLoader(range(8), batch_size=4, seed=0)
            >>> _ = list(loader)
            >>> s = loader.stats(); s["current"]["batches"], 0 <= s["current"]["input_bound"] <= 1
            (2, True)
        """
        stats = self._stats
        stats.refresh()
        cur = stats.current
        hint = None if cur is None else cur.hint(self.num_workers, os.cpu_count())
        return {"current": None if cur is None else cur.as_dict(),
                "last": None if stats.last is None else stats.last.as_dict(),
                "resumes": stats.resumes, "hint": hint}

    def log_stats(self, every_s: Optional[float]) -> None:
        """Log a line on the ``seqloader.stats`` logger (INFO) at most every ``every_s`` seconds
        while iterating (``None``: off, the default).

        Example:
            >>> loader = DataLoader(range(8), batch_size=4, seed=0); loader.log_stats(30.0)
        """
        if every_s is not None and not every_s > 0:
            raise ValueError(f"DataLoader.log_stats: every_s must be > 0 or None (got {every_s!r})")
        self._stats.log_every_s = every_s

    def _get_iterator(self):
        """torch's hook for a new iterator: ours (never torch's single/multi-process iterators)."""
        return self.__iter__()

    # -- state ---------------------------------------------------------------------------------

    def _state(self) -> LoaderState:
        rank, world = sampling.current_world()
        progress = self._progress
        sampler_state, sampler_epoch = None, None
        if self._custom is not None:
            sampler_state, sampler_epoch = self._custom.state(progress.epoch, progress.position,
                                                              progress.started)
        elif isinstance(self._user_sampler, sampling.BijectiveShuffleSampler):
            sampler_state = self._user_sampler.state_dict()  # its seed; the loader keeps the epoch
        dataset_state = None
        if not self._is_iterable and is_stateful(self.dataset):
            dataset_state = self.dataset.state_dict()
        return LoaderState(
            seed=self.seed, epoch=progress.epoch, position=progress.position, ahead=progress.ahead,
            dataset_len=_len_or_none(self.dataset), batch_size=self.batch_size,
            drop_last=self.drop_last, shuffle=bool(self.shuffle) and not self._is_iterable,
            derivation=self._derivation,
            sampler_len=(None if self._is_iterable or self._custom is None
                         else _len_or_none(self._custom)),
            sampler_epoch=sampler_epoch, sampler=sampler_state, dataset=dataset_state,
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
        return self._state().to_dict()

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
        check_matches(saved, self._state())
        _check_ahead(saved)
        if self._custom is not None:
            self._custom.check(saved)
        elif not self._is_iterable:
            _check_position(saved)
        # validated: mutate
        self._workers.close()
        if self._custom is not None:
            self._custom.load(saved)
        elif saved.sampler is not None:  # a BijectiveShuffleSampler's seed
            self._user_sampler.load_state_dict(copy.deepcopy(saved.sampler))
        if saved.dataset is not None:
            self.dataset.load_state_dict(copy.deepcopy(saved.dataset))
        self.seed = saved.seed
        self._derivation = saved.derivation
        self._seed_world = None
        self._progress.load(saved.epoch, saved.position,
                            None if saved.iterable is None else saved.iterable.copy(), saved.ahead)


#: torchdata's name for the same thing.
StatefulDataLoader = DataLoader


def _check_position(saved: LoaderState) -> None:
    """A built-in order's position is at most the end of an epoch: ``dataset_len``, or less than
    ``dataset_len + world_size`` when the last round of a distributed epoch was padded."""
    n = saved.dataset_len or 0
    world = saved.saved_with.get("world_size", 1)
    limit = n + max(world if isinstance(world, int) and world > 0 else 1, 1) - 1 if n else 0
    if saved.position > limit:
        raise ValueError(f"load_state_dict: 'position' is {saved.position} in the state_dict but an "
                         f"epoch of this loader has {n} samples; the state is corrupt or was saved "
                         "for a different loader")


def _check_ahead(saved: LoaderState) -> None:
    """Batches yielded out of order past the watermark are known for one rank only: such a state
    resumes exactly only in a world of one."""
    worlds = (saved.saved_with.get("world_size", 1), sampling.current_world()[1])
    if saved.ahead and max(w if isinstance(w, int) else 1 for w in worlds) > 1:
        raise ValueError(f"load_state_dict: 'ahead' lists {len(saved.ahead)} batch(es) yielded out of order "
                         f"(in_order=False) past 'position', under torch.distributed (world sizes "
                         f"{worlds[0]} saved, {worlds[1]} now): each rank yielded other batches, so one "
                         "rank's state cannot resume the others exactly; use in_order=True with ranks")


def _len_or_none(dataset: Any) -> Optional[int]:
    try:
        return len(dataset)
    except TypeError:
        return None
