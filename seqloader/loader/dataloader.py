"""``seqloader.DataLoader``: torch's ``DataLoader`` with exact, O(1) mid-epoch resume.

The loader is the torch-shaped shell: arguments, ``set_epoch``, ``state_dict``, ``stats``. It holds
its :class:`~seqloader.loader.progress.Progress` (``(epoch, position)``) and, per epoch, composes
lazy sequences instead of forking torch's iterator: the :class:`~seqloader.loader.recipe.Recipe`
(which indices each batch reads: ``loader/recipe.py``, ``orders.py``, ``plans.py``) -> fetch +
collate (``loader/fetch.py``) -> ``Prefetch`` over worker processes (``loader/workers.py``,
``num_workers > 0``) -> the iterator (``loader/epoch.py``, pinning in ``loader/iterator.py``).
Resuming is a seek: the order is rebuilt from ``(seed, epoch)`` and read from ``position``.
An ``IterableDataset`` is read as one stream per worker, round-robin, on the same workers
(``loader/streams.py``, ``loader/iterable.py``). Iterators get what they read when they are built
and never call back into the loader.

Epochs (when the counter moves, and ``set_epoch``): see :mod:`seqloader.loader.epoch_control`.
"""

from __future__ import annotations

import copy
import functools
import os
import weakref
from typing import Any, Iterable, Optional, Sequence, TypeVar, cast

import torch
import torch.utils.data

from seqloader.errors import check_nonnegative_int
from seqloader.loader import world
from seqloader.loader.custom_order import CustomOrder
from seqloader.loader.default_sampler import forwarding_sampler
from seqloader.loader.epoch import MapIterator
from seqloader.loader.epoch_control import EpochControl, Watch
from seqloader.loader.iterable import IterableIterator
from seqloader.loader.iterator import Opened, read_window
from seqloader.loader.opening import epoch_batches, open_map_epoch, open_stream_epoch
from seqloader.loader.progress import Progress
from seqloader.loader.recipe import Recipe
from seqloader.loader.recipe_control import RecipeControl
from seqloader.loader.verbs import LoaderVerbs
from seqloader.loader.seeding import DERIVATION
from seqloader.loader.state import LoaderState, is_stateful
from seqloader.loader.source_files import check_pipeline_files, describe_pipeline
from seqloader.loader.state_checks import (check_against_recipe, check_ahead, check_matches, len_or_none,
                                           load_seekable_sampler)
from seqloader.loader.stats import LoaderStats
from seqloader.loader.steps import schedule_of
from seqloader.loader.torch_compat import pin_device
from seqloader.loader.workers import Workers, check_threads_per_worker, check_worker_method, check_worker_restarts
from seqloader.prefetcher.ray_options import RayWorkers
from seqloader.rng import check_seed
from seqloader.shuffle_sampler import SeekableSampler

__all__ = ["DataLoader", "StatefulDataLoader"]

T_co = TypeVar("T_co", covariant=True)


class DataLoader(LoaderVerbs, torch.utils.data.DataLoader[T_co]):
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
            from each stream's state, with the same number of streams (``max(1, num_workers)``) only.
        snapshot_every_n_steps: accepted for torchdata compatibility and kept as an attribute;
            it changes nothing, since every ``state_dict()`` is exact at no per-step cost.
        seed: an int in ``[0, 2**64)``; ``None`` draws one from ``generator`` (torch's default
            generator if ``None``), so ``torch.manual_seed`` before construction reproduces runs.
        max_worker_restarts: ``0``: a dead worker raises torch's ``RuntimeError``. ``N > 0``
            (with workers): up to ``N`` times per epoch a fresh worker replaces it and recomputes
            its batches exactly (logged, counted in ``stats()``); a batch that kills two workers
            raises, naming its indices; an ``IterableDataset`` needs stream states. See
            ``docs/multiprocessing.md``, "When a worker dies".
        batch_size_schedule: ``[(step, batch_size), ...]``: from each global step on, batches of
            that size (a ramp-up; ``batch_size`` before the first); resumable anywhere.
        profile_stages: time each stage (``smap``/``rng_map`` functions, fetch, collate, the
            transfer, pinning) for ``stats()["current"]["stages"]`` and the hint; off by default.
            Workers read it when they start. See ``docs/input_bound.md``.
        worker_method: torch's keyword. ``"multiprocessing"`` (default): ``num_workers`` worker
            processes, batches through shared memory. ``"thread"``: ``num_workers`` threads of this
            process, batches handed over by reference (no copy, one dataset object); for decoders
            that release the GIL. ``"ray"`` or a :class:`~seqloader.RayWorkers`: ``num_workers`` Ray
            actors on the nodes of a cluster (``docs/ray.md``). Batches and states are the same
            every way (a state saved under one resumes under another); see ``docs/threads.md``.
        threads_per_worker: with ``"multiprocessing"``, batches each worker process computes at
            once in its own threads ("threads inside processes": decoding scales inside each
            process while the training process only receives); ``1`` (default): one.

    Raises:
        ValueError, TypeError: as torch for bad argument combinations; a bad ``seed`` or restarts.

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
                 pin_memory_device: str = "", in_order: bool = True, snapshot_every_n_steps: Optional[int] = 1,
                 seed: Optional[int] = None, max_worker_restarts: int = 0,
                 batch_size_schedule: Optional[Sequence[Any]] = None, profile_stages: bool = False,
                 worker_method: str | RayWorkers = "multiprocessing", threads_per_worker: int = 1):
        # seqloader's own attributes come first: Lightning records what is set after torch's
        # __init__ and replays it on the loader it rebuilds (with its DistributedSampler).
        self.shuffle = shuffle
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.batch_size_schedule = batch_size_schedule
        self.seed = world.draw_seed(generator) if seed is None else check_seed("DataLoader", seed)
        self.max_worker_restarts = check_worker_restarts(max_worker_restarts, num_workers)
        self.worker_method = check_worker_method(worker_method, num_workers)
        self.threads_per_worker = check_threads_per_worker(threads_per_worker, self.worker_method, num_workers)
        if not isinstance(profile_stages, bool):
            raise TypeError(f"DataLoader: profile_stages must be a bool (got {type(profile_stages).__name__})")
        self.profile_stages = profile_stages
        # A seed is shared by all ranks when given, loaded, or drawn under an initialised world
        # (draw_seed broadcasts rank 0's). One drawn per process cannot shard a global order.
        self._seed_world = world.current_world()[1] if seed is None else None
        # The user's own sampler objects (torch builds defaults into .sampler / .batch_sampler).
        self._user_sampler = sampler
        self._user_batch_sampler = batch_sampler
        self._custom = None if self._builtin_order else CustomOrder(sampler, batch_sampler)
        if isinstance(sampler, SeekableSampler):
            sampler.bind(num_workers, batch_size)
        self._derivation = DERIVATION  # a loaded state brings its own (see loader/seeding.py)
        self._batch_sizes = schedule_of(batch_size, batch_size_schedule, batch_sampler=batch_sampler,
                                        iterable=isinstance(dataset, torch.utils.data.IterableDataset))
        iterable = self._iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._progress = (Progress(max(1, num_workers), carry=persistent_workers or num_workers == 0)
                          if iterable else Progress())
        self._workers = Workers()  # persistent workers (kept across epochs); others live in iterators
        owner = self._custom.epoch_owner() if self._custom is not None else (
            sampler if isinstance(sampler, SeekableSampler) else None)
        self._epochs = EpochControl(self._progress, iterable, owner,
                                    None if self._custom is None else self._custom.forget, self._used_up)
        self._stats = LoaderStats()
        self._control = RecipeControl(self._progress)
        self._files_state: Optional[list] = None
        # Every argument by keyword: frameworks (Lightning) patch DataLoader.__init__ and map
        # positional arguments by their own signature.
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                         pin_memory=pin_memory, drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
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
                self.batch_sampler.sampler = default  # type: ignore[attr-defined]  # torch's BatchSampler
        weakref.finalize(self, self._workers.close)

    # -- what is read --------------------------------------------------------------------------

    @property
    def _is_iterable(self) -> bool:
        # set at construction: torch forbids assigning .dataset later, and an isinstance check
        # against torch's ABC costs ~0.5 ms whenever an ABC registration has reset its cache
        return self._iterable

    @property
    def _builtin_order(self) -> bool:
        return self._user_batch_sampler is None and (
            self._user_sampler is None or isinstance(self._user_sampler, SeekableSampler))

    def _recipe(self) -> Recipe:
        """What the epochs read, from the loader's current attributes (see ``loader/recipe.py``)."""
        seekable = self._user_sampler if isinstance(self._user_sampler, SeekableSampler) else None
        dataset: Any = self.dataset  # map-style here: sized
        return Recipe(dataset=dataset, dataset_len=len(dataset), batch_size=self.batch_size,
                      drop_last=self.drop_last, collate_fn=self.collate_fn, shuffle=bool(self.shuffle),
                      seed=self.seed, derivation=self._derivation, sampler=seekable, custom=self._custom,
                      batch_sizes=self._batch_sizes, changes=self._control.changes)

    def __len__(self) -> int:
        if self._is_iterable or not self._builtin_order:
            return super().__len__()
        progress, sizes = self._progress, self._batch_sizes
        first = progress.step  # the epoch's first step (a batch-size schedule reads it)
        if sizes is not None and progress.position:
            first -= sizes.steps_before(progress.step, progress.position // world.current_world()[1])
        return self._recipe().batches_per_epoch(first_step=first)

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self):
        if self.timeout and self.num_workers == 0:
            raise ValueError(f"DataLoader: timeout={self.timeout} needs num_workers > 0 (got "
                             "num_workers=0); set timeout=0 or use worker processes")
        if self.num_workers > 0:
            self.check_worker_number_rationality()
        if not self._is_iterable and self._builtin_order:
            world.check_seed_is_shared(self._seed_world)
        device = pin_device(self.pin_memory, self.pin_memory_device)
        progress = self._progress
        generation = progress.begin()
        self._stats.begin(progress.epoch, progress.resumed, profile=self.profile_stages)
        window = read_window(self.num_workers, self.prefetch_factor)
        if self._is_iterable:
            opened = open_stream_epoch(self, self._derivation, progress, self._workers, self._stats)
            it: Any = IterableIterator(opened, progress, generation, self._stats, device, self.timeout, window,
                                       owner=self)
        else:
            watch = self._epochs.watch()
            it = MapIterator(self._open_epoch(), progress, generation, self._stats, device, self.timeout, window,
                             reopen=functools.partial(self._reopen, watch), owner=self)
        self._stats.opened()  # what iter() took (worker start-up) is its own line: startup_s
        return it

    def _open_epoch(self) -> Opened:
        self._control.resolve(self._recipe())
        return open_map_epoch(self, self._recipe(), self._progress, self._workers, self._stats)

    def _reopen(self, watch: Watch, current: Opened, used_up: bool, settle: bool) -> Optional[Opened]:
        """The epoch to read instead of ``current``: at an iterator's first ``next()`` if a ``set_epoch``
        since ``iter()`` changed it (``settle``; ``watch``: the sampler the loader follows), or after a
        recipe change (the same workers read on from the frontier)."""
        progress = self._progress
        stale = self._epochs.settle(watch, used_up) if settle else False
        if not stale and (progress.epoch, progress.position, progress.ahead, progress.recipe_changes) == (
                current.epoch, current.start, current.ahead, current.recipe_changes):
            return None
        reuse = None
        if current.owned and not current.source.closed:
            if current.epoch == progress.epoch and not stale:
                reuse = current.source
            else:  # its workers (seeded for its epoch) go before new ones start
                self._stats.refresh()
                current.source.close()
        self._control.resolve(self._recipe())
        opened = open_map_epoch(self, self._recipe(), progress, self._workers, self._stats, reuse)
        self._stats.reading(progress.epoch)
        return opened

    # -- epochs --------------------------------------------------------------------------------

    def _used_up(self) -> bool:
        seq, skip = epoch_batches(self._recipe(), self._progress)
        return len(seq) == len(skip)

    def stats(self) -> dict:
        """Where the time goes, for the current and the last epoch: is the loop waiting for data?

        Returns:
            ``{"current": {...} or None, "last": {...} or None, "resumes": int, "hint": str or None}``;
            an epoch entry is ``EpochStats.as_dict()`` (``loader/stats.py``: ``wait_s``, ``work_s``,
            ``input_bound``, ``startup_s``, ``workers``, ``stages``, ...). ``hint`` suggests more
            workers when the loop is input-bound, names slow start-up and the slowest stage.

        Example:
            >>> loader = DataLoader(range(8), batch_size=4, seed=0); _ = list(loader)
            >>> s = loader.stats(); s["current"]["batches"], 0 <= s["current"]["input_bound"] <= 1
            (2, True)
        """
        return self._stats.report(self.num_workers, os.cpu_count(), self.persistent_workers)

    def log_stats(self, every_s: Optional[float]) -> None:
        """Log a line on the ``seqloader.stats`` logger (INFO) at most every ``every_s`` seconds
        while iterating (``None``: off, the default)."""
        if every_s is not None and not every_s > 0:
            raise ValueError(f"DataLoader.log_stats: every_s must be > 0 or None (got {every_s!r})")
        self._stats.log_every_s = every_s

    def check_worker_number_rationality(self) -> None:
        """torch's advice on the number of worker processes (threads are not counted)."""
        if getattr(self, "worker_method", "multiprocessing") == "multiprocessing":
            super().check_worker_number_rationality()

    def _get_iterator(self):
        """torch's hook for a new iterator: ours (never torch's single/multi-process iterators)."""
        return self.__iter__()

    # -- state ---------------------------------------------------------------------------------

    def _state(self) -> LoaderState:
        size = world.current_world()[1]
        progress = self._progress
        sampler_state, sampler_epoch = None, None
        if self._custom is not None:
            sampler_state, sampler_epoch = self._custom.state(progress.epoch, progress.position,
                                                              progress.started)
        elif isinstance(self._user_sampler, SeekableSampler):
            sampler_state = self._user_sampler.state_dict()  # its seed; the loader keeps the epoch
        iterable, dataset = self._is_iterable, cast(Any, self.dataset)
        dataset_state = dataset.state_dict() if not iterable and is_stateful(dataset) else None
        return LoaderState(
            seed=self.seed, epoch=progress.epoch, position=progress.position, ahead=progress.ahead,
            step=progress.step, recipe=self._control.changes.to_state(), files=self._files(),
            dataset_len=len_or_none(self.dataset), batch_size=self.batch_size, drop_last=self.drop_last,
            shuffle=bool(self.shuffle) and not iterable, derivation=self._derivation,
            sampler_len=None if iterable or self._custom is None else len_or_none(self._custom),
            sampler_epoch=sampler_epoch, sampler=sampler_state, dataset=dataset_state,
            iterable=None if progress.iterable is None else progress.iterable.copy(),
            saved_with={"num_workers": self.num_workers, "world_size": size})

    def _files(self) -> list:
        """The file lists of the pipeline's sources (computed once: a source's files do not change)."""
        if self._files_state is None:
            self._files_state = describe_pipeline(self.dataset)
        return self._files_state

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

    def load_state_dict(self, state_dict: dict, *, check_files: bool = True) -> None:
        """Make the next ``iter(loader)`` resume from ``state_dict`` (see :meth:`state_dict`).

        Everything is validated before anything changes; then a Stateful sampler and dataset get
        their sub-states, live iterators of this loader stop, and persistent workers restart.

        Args:
            state_dict: a dict from :meth:`state_dict` (possibly through JSON).
            check_files: compare the state's ``files`` with the files of every source of the
                dataset (``smap(f, parquet(...))``, a ``mix`` of sources, a Dataset holding one:
                see ``docs/resume.md``) and refuse other files. ``False`` resumes on other files
                deliberately, such as the same data copied or downloaded again elsewhere: the
                positions then mean the same items only if the files hold the same items.

        Raises:
            TypeError: ``state_dict`` is not a dict.
            ValueError: unknown format or newer version, a malformed value (every int is checked
                against ``2**63`` and the loader: a position inside the epoch, indices inside the
                dataset), or a state saved for a different dataset, file list (naming the source
                and the first file that differs), ``drop_last``, ``shuffle``, sampler kind, (for a
                custom ``batch_sampler`` or an ``IterableDataset``) batch size, or (for an
                ``IterableDataset``) number of streams; the message names the key, the saved and
                the current value. Another ``batch_size`` or world size resumes from the first
                unread sample (the state counts samples).

        Example:
            >>> loader = DataLoader(range(6), batch_size=2, seed=0)
            >>> sd = loader.state_dict(); loader.load_state_dict(sd)
            >>> loader.load_state_dict({**sd, "drop_last": True})
            Traceback (most recent call last):
            ValueError: load_state_dict: 'drop_last' is True in the state_dict but this loader has drop_last=False; build the loader with the arguments it was saved with
        """
        saved = LoaderState.from_dict(state_dict)
        check_matches(saved, self._state(), not self._is_iterable and self._user_batch_sampler is None)
        check_ahead(saved, world.current_world()[1])
        check_pipeline_files(saved.files, self.dataset, check_files)
        changes = self._control.checked(saved.recipe, None if self._is_iterable else self._recipe())
        if self._custom is not None:
            self._custom.check(saved)
        elif not self._is_iterable:
            check_against_recipe(saved, self._recipe().replace(changes=changes))
        # validated: mutate (a seekable sampler checks its own state before changing: first)
        if self._custom is None and saved.sampler is not None:  # a seekable sampler's seed (and geometry)
            load_seekable_sampler(self._user_sampler, saved.sampler)
        self._workers.close()
        if self._custom is not None:
            self._custom.load(saved)
        if saved.dataset is not None:
            cast(Any, self.dataset).load_state_dict(copy.deepcopy(saved.dataset))
        self.seed = saved.seed
        self._derivation = saved.derivation
        self._seed_world = None
        self._control.load(changes)
        self._progress.load(saved.epoch, saved.position,
                            None if saved.iterable is None else saved.iterable.copy(), saved.ahead, saved.step)


#: torchdata's name for the same thing.
StatefulDataLoader = DataLoader

