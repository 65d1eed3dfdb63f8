"""L3: the loader's workers: torch's worker set-up, the executor, and the pool kept across epochs.

The prefetcher (L2) knows nothing of torch's ``DataLoader``; the loader hands it a
:class:`TorchWorkerSetup` as its ``worker_init_fn``. In each worker process that does what torch's
``_worker_loop`` does before the first item: seed ``random``, ``numpy.random`` and torch from
``base_seed + worker_id`` (numpy as torch seeds it), set the ``WorkerInfo`` that
``torch.utils.data.get_worker_info()`` returns (both through :mod:`seqloader.loader.torch_compat`),
turn the per-stage timing on with ``profile_stages`` (:mod:`seqloader.sequences.stage_times`), then
call the user's ``worker_init_fn``. Thread workers (``worker_method="thread"``, and the threads of
``threads_per_worker``) get a :class:`~seqloader.loader.workers.threads.ThreadWorkerSetup`: a
``WorkerInfo`` and generators of their own. Ray actors (``worker_method="ray"`` or a
:class:`~seqloader.prefetcher.ray_options.RayWorkers`) are processes too: each gets a ``TorchWorkerSetup``.
:class:`Workers` owns the loader's live :class:`~seqloader.prefetcher.prefetch.Prefetch`: opened per
epoch, or kept and re-targeted with ``persistent_workers``; with ``max_worker_restarts`` it heals
(``prefetch(restarts=, respawn=)``: a dead worker process is replaced, with the same set-up).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from seqloader.errors import check_int
from seqloader.loader.rngs.generators import seed_generators
from seqloader.loader.rngs.probe import GlobalDrawProbe
from seqloader.loader.workers.threads import ThreadWorkerSetup
from seqloader.loader.torch_compat import install_worker_info, numpy_worker_seed
from seqloader.prefetcher.api import prefetch
from seqloader.prefetcher.decoders import BlockDecoders
from seqloader.prefetcher.prefetch import Prefetch
from seqloader.prefetcher.options import ExecutorOptions, choose_executor
from seqloader.rng import derive_seed
from seqloader.sequences import stage_times

__all__ = ["TorchWorkerSetup", "Workers", "check_worker_restarts", "executor_options", "method_word",
           "worker_base_seed"]

class TorchWorkerSetup:
    """A prefetch ``worker_init_fn`` doing torch's worker set-up; see the module docstring.

    Args:
        num_workers: the number of workers (``WorkerInfo.num_workers``).
        base_seed: worker ``w`` is seeded with ``base_seed + w``, like torch; ``< 2**63``.
        dataset: ``WorkerInfo.dataset`` (the worker's copy of the loader's dataset).
        user_fn: the user's ``worker_init_fn(worker_id)``, or ``None``.
        stages: time the worker's stages for the whole life of the process (``profile_stages``).
        threads: items the process computes at once (``threads_per_worker``): above 1, its info
            is thread-local (each thread's own is set by a ``ThreadWorkerSetup``).

    Example:
        >>> from seqloader.loader.rngs.seeding import preserved_globals
        >>> from seqloader.loader.torch_compat import clear_worker_info
        >>> setup = TorchWorkerSetup(2, base_seed=10, dataset="ds", user_fn=None)
        >>> with preserved_globals():   # what worker 1 runs first; here, in this process
        ...     setup(1)
        ...     info = torch.utils.data.get_worker_info()
        ...     clear_worker_info()
        >>> info.id, info.num_workers, info.seed, info.dataset
        (1, 2, 11, 'ds')
    """

    def __init__(self, num_workers: int, base_seed: int, dataset: Any,
                 user_fn: Optional[Callable[[int], None]], stages: bool = False, threads: int = 1):
        self.num_workers, self.base_seed = num_workers, base_seed
        self.dataset, self.user_fn, self.stages, self.threads = dataset, user_fn, stages, threads

    def __call__(self, worker_id: int) -> None:
        seed = self.base_seed + worker_id
        seed_generators(seed, numpy_worker_seed(self.base_seed, worker_id), seed, accelerators=True)  # torch's
        install_worker_info(worker_id, self.num_workers, seed, self.dataset, thread_local=self.threads > 1)
        if self.stages and self.threads == 1:
            stage_times.enable()
        if self.user_fn is not None:
            self.user_fn(worker_id)


def check_worker_restarts(value: Any, num_workers: Any, options: Optional[ExecutorOptions] = None) -> int:
    """``DataLoader(max_worker_restarts=)`` as a non-negative int; it needs worker processes
    (``options``: the loader's executor): a dead worker process is replaced alone, but a thread
    worker cannot be: a crash in it (a segfault, ``os._exit``) ends the training process it shares.

    Example:
        >>> from seqloader import ThreadWorkers
        >>> check_worker_restarts(2, num_workers=4)
        2
        >>> check_worker_restarts(1, num_workers=0)
        Traceback (most recent call last):
        ValueError: DataLoader: max_worker_restarts=1 needs num_workers > 0 (got num_workers=0): there is no worker process to replace
        >>> check_worker_restarts(3, num_workers=2, options=ThreadWorkers())
        Traceback (most recent call last):
        ValueError: DataLoader: max_worker_restarts=3 needs worker processes (got worker_method='thread'): a thread worker cannot be replaced alone, as a worker process is; a crash in it ends the training process it shares. Use worker processes (threads_per_worker=k for threads inside them), or max_worker_restarts=0
    """
    n = check_int("DataLoader", "max_worker_restarts", value)
    if n < 0:
        raise ValueError(f"DataLoader: max_worker_restarts must be >= 0 (got {n}); 0 raises torch's error when "
                         "a worker dies")
    if n and num_workers == 0:
        raise ValueError(f"DataLoader: max_worker_restarts={n} needs num_workers > 0 (got num_workers=0): "
                         "there is no worker process to replace")
    if n and options is not None and options.in_this_process:
        raise ValueError(f"DataLoader: max_worker_restarts={n} needs worker processes (got worker_method="
                         f"{options.word!r}): a thread worker cannot be replaced alone, as a worker process is; a "
                         "crash in it ends the training process it shares. Use worker processes "
                         "(threads_per_worker=k for threads inside them), or max_worker_restarts=0")
    return n


def executor_options(worker_method: Any, multiprocessing_context: Any, threads_per_worker: Any,
                     num_workers: int) -> ExecutorOptions:
    """Where a ``DataLoader``'s batches are computed, from torch's words (``worker_method=``,
    ``multiprocessing_context=``) and ``threads_per_worker=``: one options object, checked once
    (:func:`~seqloader.prefetcher.options.choose_executor`; an argument that means nothing for the
    executor raises, naming it).

    Example:
        >>> executor_options("thread", None, 1, 2), executor_options("multiprocessing", "spawn", 2, 2)
        (ThreadWorkers(), ProcessWorkers(context='spawn', threads=2))
        >>> executor_options("threads", None, 1, 2)
        Traceback (most recent call last):
        ValueError: DataLoader: worker_method must be 'process' (or 'multiprocessing'), 'thread', 'ray', or a ProcessWorkers, ThreadWorkers or RayWorkers (got 'threads')
        >>> executor_options("thread", "spawn", 1, 2)
        Traceback (most recent call last):
        ValueError: DataLoader: multiprocessing_context applies to worker processes only (got 'spawn' with worker_method='thread'); threads start no process
        >>> executor_options("ray", None, 1, 0)
        Traceback (most recent call last):
        ValueError: DataLoader: worker_method='ray' needs num_workers > 0 (got num_workers=0): num_workers is the number of Ray actors
    """
    options = choose_executor(worker_method, multiprocessing_context=multiprocessing_context,
                              threads_per_worker=threads_per_worker, stage="DataLoader", argument="worker_method")
    options.check_num_workers(num_workers, "DataLoader")
    return options


def method_word(options: ExecutorOptions) -> Any:
    """torch's ``worker_method`` for ``options`` (a ``RayWorkers`` stays itself).

    Example:
        >>> from seqloader import ProcessWorkers, ThreadWorkers
        >>> method_word(ProcessWorkers(threads=2)), method_word(ThreadWorkers())
        ('multiprocessing', 'thread')
    """
    return options.word


def worker_base_seed(seed: int, epoch: int) -> int:
    """The base seed of the workers started for ``epoch`` (a signed-64-bit-safe int, like torch's).

    Example:
        >>> 0 <= worker_base_seed(0, 3) < 2**62
        True
    """
    return derive_seed(seed, "worker", epoch) >> 2


class Workers:
    """Where a loader's worker processes come from, and the persistent ones it keeps.

    Without ``persistent_workers`` every iterator gets a new ``Prefetch`` that only the iterator
    references: it is closed at the end of the epoch, and its processes exit when the iterator is
    dropped (``break``, an exception, gc), as torch's workers do. With ``persistent_workers`` the
    loader keeps one ``Prefetch`` and re-targets it at each epoch's batches.
    """

    def __init__(self) -> None:
        self.prefetch: Optional[Prefetch] = None   # the persistent one, if any
        self.block_decoders: Optional[BlockDecoders] = None   # the persistent decode processes, if any
        self.probe = GlobalDrawProbe()  # the thread workers' (worker_method="thread")
        self._respawn: Optional[Callable[[int], Any]] = None  # its current epoch's respawn

    def open(self, loader: Any, seq: Any, epoch: int, affinity: bool = True,
             respawn: Optional[Callable[[int], Any]] = None,
             describe: Optional[Callable[[Any, int], str]] = None, depth: Optional[int] = None) -> Prefetch:
        """A ``Prefetch`` reading ``seq`` (the batches of ``epoch``) with ``loader``'s settings;
        ``affinity``: batch ``i`` on worker ``i % num_workers`` (else any free worker);
        ``respawn``: what a replacement of a dead worker reads (``None``: ``seq``), with
        ``max_worker_restarts``; ``describe``: how messages about a dead worker name batch ``i``
        of ``seq`` (the epoch's: its number and dataset indices), or ``None``: by ``i``;
        ``depth``: batches in flight per worker instead of ``loader.prefetch_factor`` (a depth
        the epoch derived). Where batches run is this room's; what they are is the epoch's."""
        self._respawn = respawn
        if self.prefetch is not None and not self.prefetch.closed:
            self.prefetch.reset(seq)
            return self.prefetch
        n, base = loader.num_workers, worker_base_seed(loader.seed, epoch)
        stages = bool(getattr(loader, "profile_stages", False))
        restarts = loader.max_worker_restarts
        if restarts and loader.persistent_workers:
            respawn = self._respawn_current  # follows reset(): each epoch brings its own
        options, dataset, user_fn = loader.executor, loader.dataset, loader.worker_init_fn
        shared: Any = None
        thread_setup: Optional[ThreadWorkerSetup] = None
        setup: Callable[[int], None]
        if options.in_this_process:  # thread workers: torch's set-up per thread, nothing sent or replaced
            # (max_worker_restarts > 0 was refused at construction: check_worker_restarts)
            setup = ThreadWorkerSetup(n, base, dataset, user_fn, stages, self.probe,
                                      copy_dataset=isinstance(dataset, torch.utils.data.IterableDataset))
        else:  # processes (worker processes, Ray actors): torch's set-up per process, the dataset sent once
            setup, shared = TorchWorkerSetup(n, base, dataset, user_fn, stages, options.threads), dataset
            if options.threads > 1:
                thread_setup = ThreadWorkerSetup(n, base, dataset, None, stages, GlobalDrawProbe())
        pf = prefetch(seq, n, method=options, prefetch_factor=depth or loader.prefetch_factor,
                      worker_init_fn=setup,
                      timeout=loader.timeout, shared=shared, affinity=affinity, restarts=restarts,
                      respawn=respawn if restarts else None, thread_init_fn=thread_setup, describe=describe)
        if loader.persistent_workers:
            self.prefetch = pf
        return pf

    def _respawn_current(self, worker_id: int) -> Any:
        return None if self._respawn is None else self._respawn(worker_id)

    def decoders(self, loader: Any, dataset: Any) -> BlockDecoders:
        """Decode processes for ``dataset`` (:mod:`seqloader.loader.epoch.read_ahead`): the loader's
        own with ``persistent_workers`` (started once, kept while they read this dataset), else new ones."""
        kept = self.block_decoders
        if kept is not None and not kept.closed and kept.source is dataset and kept.failure is None:
            return kept
        if kept is not None:
            self.block_decoders = None
            kept.close()
        made = BlockDecoders(dataset, loader.num_workers, loader.executor.context)
        if loader.persistent_workers:
            self.block_decoders = made
        return made

    def is_persistent(self, pf: Any) -> bool:
        """Whether ``pf`` is the loader's persistent ``Prefetch`` or decode processes (not an iterator's own)."""
        return pf is self.prefetch or pf is self.block_decoders

    def close(self) -> None:
        """Stop the workers, if any; idempotent."""
        if self.prefetch is not None:
            pf, self.prefetch = self.prefetch, None
            pf.close()
        if self.block_decoders is not None:
            decoders, self.block_decoders = self.block_decoders, None
            decoders.close()
