"""``seqloader.DataLoader``: torch's ``DataLoader`` with exact, O(1) mid-epoch resume.

The loader is the torch-shaped shell: torch's arguments and attributes, ``iter()``,
``state_dict``/``load_state_dict``, ``stats`` and seqloader's verbs. It composes small parts, each
one concept, and holds four of them: its :class:`~seqloader.loader.reading.Reading` (what is read
beyond torch's attributes: the order source, the batch-size schedule, the derivation, the recipe
changes), its :class:`~seqloader.loader.state.progress.EpochControl` and the
:class:`~seqloader.loader.state.progress.Progress` under it (``(epoch, position)``, ``set_epoch``), its
:class:`~seqloader.loader.workers.pool.Workers` and its :class:`~seqloader.loader.tuning.stats.LoaderStats`.
It calls the others: ``iter()`` is :func:`~seqloader.loader.epoch.opening.new_iterator` (the recipe's
batches, ``loader/recipe/recipe.py`` over the ``orders/`` wing -> fetch + collate, ``loader/epoch/batches.py``
-> ``Prefetch`` over the workers, ``loader/workers/pool.py`` -> the iterator, ``loader/epoch/map_iterator.py`` or,
for an ``IterableDataset`` read as one stream per worker, ``loader/epoch/iterable_iterator.py``); the state is
built and checked in ``loader/saving.py`` (its format: ``loader/state/state.py``); ``set_epoch``,
``indices_at``, ``set_weights``, ``skip`` and ``state_at`` are :class:`~seqloader.loader.verbs.Verbs`.
Resuming is a seek: the order is rebuilt from ``(seed, epoch)`` and read from ``position``.
Iterators get what they read when they are built and never call back into the loader.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, Optional, Sequence, TypeVar

import torch
import torch.utils.data

from seqloader.loader import world
from seqloader.loader.epoch.tuned import make_tuning
from seqloader.loader.default_sampler import install_forwarding_sampler
from seqloader.loader.epoch.opening import new_iterator
from seqloader.loader.state.progress import EpochControl, Progress
from seqloader.loader.reading import Reading
from seqloader.loader.saving import check_loadable, state_of
from seqloader.loader.state.state import LoaderState
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.loader.tuning.trace import DEFAULT_MAX_EVENTS, Trace
from seqloader.loader.tuning.watching import Watching
from seqloader.loader.verbs import Verbs, documented
from seqloader.loader.workers.pool import Workers, check_worker_restarts, executor_options, method_word
from seqloader.prefetcher.options import ExecutorOptions, ProcessWorkers
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
            ``"process"`` is the same as ``"multiprocessing"``; an options object
            (``seqloader.ProcessWorkers``, ``ThreadWorkers``, ``RayWorkers``) is taken as it is. An
            argument that means nothing for the chosen executor (``multiprocessing_context`` or
            ``threads_per_worker`` with threads or Ray) raises ``ValueError`` naming it; the choice
            is the attribute ``executor``.
        threads_per_worker: with ``"multiprocessing"``, batches each worker process computes at
            once in its own threads ("threads inside processes": decoding scales inside each
            process while the training process only receives); ``1`` (default): one.
        autotune: ``True``: measure the batches as they are produced and choose the executor,
            the workers, their threads and the read-ahead, switching at batch boundaries; the
            batches, their order and the state stay those of ``autotune=False``.
            ``num_workers`` is then the most worker processes it may use (``0``: the cores);
            ``worker_method`` and ``threads_per_worker`` stay at their defaults. What it chose and
            why: ``stats()["autotune"]``; see ``docs/autotune.md``.
        memory_budget: with ``autotune``, the bytes its workers may hold (measured as PSS);
            ``None``: half the memory available when the loader is built.

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
                 worker_method: str | ExecutorOptions = "multiprocessing", threads_per_worker: int = 1,
                 autotune: Any = False, memory_budget: Optional[int] = None):
        # seqloader's own attributes come first: Lightning records what is set after torch's
        # __init__ and replays it on the loader it rebuilds (with its DistributedSampler).
        self.shuffle = shuffle
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.batch_size_schedule = batch_size_schedule
        self.seed = world.draw_seed(generator) if seed is None else check_seed("DataLoader", seed)
        #: where batches are computed: one options object, chosen here (``prefetcher/options.py``)
        self.executor = executor_options(worker_method, multiprocessing_context, threads_per_worker, num_workers)
        self.max_worker_restarts = check_worker_restarts(max_worker_restarts, num_workers, self.executor)
        self.worker_method = method_word(self.executor)
        self.threads_per_worker = getattr(self.executor, "threads", 1)
        if not isinstance(profile_stages, bool):
            raise TypeError(f"DataLoader: profile_stages must be a bool (got {type(profile_stages).__name__})")
        self.profile_stages = profile_stages
        self.autotune, self.memory_budget = autotune, memory_budget
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._tuning = make_tuning(autotune, memory_budget, num_workers, self.executor, iterable, in_order,
                                   self.max_worker_restarts)
        # The parts (one concept each): what is read beyond torch's attributes, where the loader
        # stands (and which epoch), who computes the batches, where the time goes.
        progress = Progress(max(1, num_workers), carry=persistent_workers or num_workers == 0) if iterable else Progress()
        self._reading = Reading(iterable, sampler, batch_sampler, batch_size, batch_size_schedule, num_workers, progress,
                                seed_world=world.current_world()[1] if seed is None else None)
        custom = self._reading.custom
        self._epochs = EpochControl(progress, iterable, self._reading.owner(), None if custom is None else custom.forget)
        self._workers = Workers()  # persistent workers (kept across epochs); others live in iterators
        self._stats = LoaderStats()
        self._prefetch_factor_given = prefetch_factor is not None
        # Every argument by keyword: frameworks (Lightning) patch DataLoader.__init__ and map
        # positional arguments by their own signature.
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                         pin_memory=pin_memory, drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=generator,
                         prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        if not iterable and sampler is None and batch_sampler is None:
            install_forwarding_sampler(self)  # torch's default sampler, whose set_epoch reaches this loader
        weakref.finalize(self, self._workers.close)

    @property
    def prefetch_factor_given(self) -> bool:
        """Whether ``prefetch_factor`` was passed. Left out (``None``: torch's 2 per worker), worker
        processes over a block shuffle of a columnar source read half a window ahead
        (docs/migrating.md, "worker processes read a block shuffle deeper ahead")."""
        return self._prefetch_factor_given

    def __len__(self) -> int:
        n = self._reading.epoch_length(self, self._epochs.progress)
        return super().__len__() if n is None else n

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self):
        if self.timeout and self.num_workers == 0:
            raise ValueError(f"DataLoader: timeout={self.timeout} needs num_workers > 0 (got "
                             "num_workers=0); set timeout=0 or use worker processes")
        if self.num_workers > 0:
            self.check_worker_number_rationality()
        if not self._reading.iterable and self._reading.builtin:
            world.check_seed_is_shared(self._reading.seed_world)
        if self._tuning is not None:
            return self._tuning.iterator(self, self._reading, self._epochs, self._workers, self._stats)
        return new_iterator(self, self._reading, self._epochs, self._workers, self._stats,
                            reported_len=getattr(self, "_IterableDataset_len_called", None))

    def _get_iterator(self):
        """torch's hook for a new iterator: ours (never torch's single/multi-process iterators)."""
        return self.__iter__()

    def check_worker_number_rationality(self) -> None:
        """torch's advice on the number of worker processes (threads are not counted)."""
        if isinstance(getattr(self, "executor", None), ProcessWorkers):
            super().check_worker_number_rationality()

    # -- stats ---------------------------------------------------------------------------------

    def _watching(self) -> Watching:
        return Watching(self, self._stats, self._tuning)

    @documented(Watching.stats)
    def stats(self) -> dict:
        return self._watching().stats()

    @documented(Watching.trace)
    def trace(self, path: Any, *, max_events: int = DEFAULT_MAX_EVENTS) -> Trace:
        return self._watching().trace(path, max_events=max_events)

    @documented(Watching.totals)
    def totals(self, count_samples: bool = False) -> dict:
        return self._watching().totals(count_samples)

    @documented(Watching.log_stats)
    def log_stats(self, every_s: Optional[float]) -> None:
        self._watching().log_stats(every_s)

    # -- state ---------------------------------------------------------------------------------

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
        return state_of(self, self._reading, self._epochs.progress).to_dict()

    def load_state_dict(self, state_dict: dict, *, check_files: bool = True) -> None:
        """Make the next ``iter(loader)`` resume from ``state_dict`` (see :meth:`state_dict`).

        Everything is validated before anything changes; then a Stateful sampler and dataset get
        their sub-states, live iterators of this loader stop, and persistent workers restart.

        Args:
            state_dict: a dict from :meth:`state_dict` (possibly through JSON).
            check_files: compare the state's ``files`` with the files of every source of the
                dataset (``smap(f, parquet(...))``, a ``mix`` of sources, a Dataset holding one:
                see ``docs/resume.md``) and refuse other files, and compare its ``positions`` with
                what decides the dataset's positions (each stage's parameters: ``keep``'s
                predicate, ``pack``'s method, ``shuffle``'s seed, ...) and refuse another recipe.
                ``False`` skips both: it resumes deliberately, such as on the same data copied or
                downloaded again elsewhere; the positions then mean the same items only if the
                files and the recipe do.

        Raises:
            TypeError: ``state_dict`` is not a dict.
            ValueError: unknown format or newer version, a malformed value (every int is checked
                against ``2**63`` and the loader: a position inside the epoch, indices inside the
                dataset), or a state saved for a different dataset, file list (naming the source
                and the first file that differs), recipe (naming the stage and the parameter that
                differ), ``drop_last``, ``shuffle``, sampler kind, (for a
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
        reading, progress = self._reading, self._epochs.progress
        changes = check_loadable(saved, self, reading, progress, check_files)
        # validated: mutate (a seekable sampler checks its own state before changing: first)
        reading.load_sampler(saved)
        self._workers.close()
        reading.load(saved, changes, self.dataset)
        self.seed = saved.seed
        progress.load(saved.epoch, saved.position, None if saved.iterable is None else saved.iterable.copy(),
                      saved.ahead, saved.step)

    # -- seqloader's verbs (loader/verbs.py) ---------------------------------------------------

    def _verbs(self) -> Verbs:
        return Verbs(self, self._reading, self._epochs)

    @documented(Verbs.set_epoch)
    def set_epoch(self, epoch: int) -> None:
        self._verbs().set_epoch(epoch)

    @documented(Verbs.indices_at)
    def indices_at(self, epoch: int, step: int, rank: Optional[int] = None, world_size: Optional[int] = None) -> Any:
        return self._verbs().indices_at(epoch, step, rank, world_size)

    @documented(Verbs.set_weights)
    def set_weights(self, weights: Sequence[float], at_step: Optional[int] = None) -> None:
        self._verbs().set_weights(weights, at_step)

    @documented(Verbs.skip)
    def skip(self, indices: Optional[Iterable[int]] = None, steps: Any = None) -> None:
        self._verbs().skip(indices, steps)

    @documented(Verbs.state_at)
    def state_at(self, epoch: int, step: int, world_size: Optional[int] = None) -> dict:
        return self._verbs().state_at(epoch, step, world_size)


#: torchdata's name for the same thing.
StatefulDataLoader = DataLoader
