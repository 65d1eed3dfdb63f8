"""L3: the loader's worker processes: torch's worker set-up, and the pool kept across epochs.

The prefetcher (L2) knows nothing of torch's ``DataLoader``; the loader hands it a
:class:`TorchWorkerSetup` as its ``worker_init_fn``. In each worker that does what torch's
``_worker_loop`` does before the first item: seed ``random``, ``numpy.random`` and torch from
``base_seed + worker_id`` (numpy as torch seeds it), set the ``WorkerInfo`` that
``torch.utils.data.get_worker_info()`` returns (both through :mod:`seqloader.loader.torch_compat`),
turn the per-stage timing on with ``profile_stages`` (:mod:`seqloader.sequences.stage_times`), then
call the user's ``worker_init_fn``.
:class:`Workers` owns the loader's live :class:`~seqloader.prefetcher.prefetch.Prefetch`: opened per
epoch, or kept and re-targeted with ``persistent_workers``; with ``max_worker_restarts`` it heals
(``prefetch(restarts=, respawn=)``: a dead worker is replaced, with the same ``TorchWorkerSetup``);
messages about a dead worker name the batch and its dataset indices (``prefetch(describe=)``).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Optional

import numpy as np
import torch

from seqloader.errors import check_int
from seqloader.loader.iterator import describe_batch
from seqloader.loader.torch_compat import install_worker_info, numpy_worker_seed
from seqloader.prefetcher.api import prefetch
from seqloader.prefetcher.prefetch import Prefetch
from seqloader.rng import derive_seed
from seqloader.sequences import stage_times

__all__ = ["TorchWorkerSetup", "Workers", "check_worker_restarts", "worker_base_seed"]


class TorchWorkerSetup:
    """A prefetch ``worker_init_fn`` doing torch's worker set-up; see the module docstring.

    Args:
        num_workers: the number of workers (``WorkerInfo.num_workers``).
        base_seed: worker ``w`` is seeded with ``base_seed + w``, like torch; ``< 2**63``.
        dataset: ``WorkerInfo.dataset`` (the worker's copy of the loader's dataset).
        user_fn: the user's ``worker_init_fn(worker_id)``, or ``None``.
        stages: time the worker's stages for the whole life of the process (``profile_stages``).

    Example:
        >>> from seqloader.loader.seeding import preserved_globals
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
                 user_fn: Optional[Callable[[int], None]], stages: bool = False):
        self.num_workers, self.base_seed = num_workers, base_seed
        self.dataset, self.user_fn, self.stages = dataset, user_fn, stages

    def __call__(self, worker_id: int) -> None:
        seed = self.base_seed + worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        np.random.seed(numpy_worker_seed(self.base_seed, worker_id))
        install_worker_info(worker_id, self.num_workers, seed, self.dataset)
        if self.stages:
            stage_times.enable()
        if self.user_fn is not None:
            self.user_fn(worker_id)


def check_worker_restarts(value: Any, num_workers: Any) -> int:
    """``DataLoader(max_worker_restarts=)`` as a non-negative int; it needs worker processes.

    Example:
        >>> check_worker_restarts(2, num_workers=4)
        2
        >>> check_worker_restarts(1, num_workers=0)
        Traceback (most recent call last):
        ValueError: DataLoader: max_worker_restarts=1 needs num_workers > 0 (got num_workers=0): there is no worker process to replace
    """
    n = check_int("DataLoader", "max_worker_restarts", value)
    if n < 0:
        raise ValueError(f"DataLoader: max_worker_restarts must be >= 0 (got {n}); 0 raises torch's error when "
                         "a worker dies")
    if n and num_workers == 0:
        raise ValueError(f"DataLoader: max_worker_restarts={n} needs num_workers > 0 (got num_workers=0): "
                         "there is no worker process to replace")
    return n


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
        self._respawn: Optional[Callable[[int], Any]] = None  # its current epoch's respawn

    def open(self, loader: Any, seq: Any, epoch: int, affinity: bool = True,
             respawn: Optional[Callable[[int], Any]] = None) -> Prefetch:
        """A ``Prefetch`` reading ``seq`` (the batches of ``epoch``) with ``loader``'s settings;
        ``affinity``: batch ``i`` on worker ``i % num_workers`` (else any free worker);
        ``respawn``: what a replacement of a dead worker reads (``None``: ``seq``), with
        ``max_worker_restarts``."""
        self._respawn = respawn
        if self.prefetch is not None and not self.prefetch.closed:
            self.prefetch.reset(seq)
            return self.prefetch
        setup = TorchWorkerSetup(loader.num_workers, worker_base_seed(loader.seed, epoch), loader.dataset,
                                 loader.worker_init_fn, stages=bool(getattr(loader, "profile_stages", False)))
        restarts = loader.max_worker_restarts
        if restarts and loader.persistent_workers:
            respawn = self._respawn_current  # follows reset(): each epoch brings its own
        pf = prefetch(seq, loader.num_workers, prefetch_factor=loader.prefetch_factor,
                      multiprocessing_context=loader.multiprocessing_context, worker_init_fn=setup,
                      timeout=loader.timeout, shared=loader.dataset, affinity=affinity, restarts=restarts,
                      respawn=respawn if restarts else None, describe=describe_batch)
        if loader.persistent_workers:
            self.prefetch = pf
        return pf

    def _respawn_current(self, worker_id: int) -> Any:
        return None if self._respawn is None else self._respawn(worker_id)

    def is_persistent(self, pf: Any) -> bool:
        """Whether ``pf`` is the loader's persistent ``Prefetch`` (not an iterator's own)."""
        return pf is self.prefetch

    def close(self) -> None:
        """Stop the workers, if any; idempotent."""
        if self.prefetch is not None:
            pf, self.prefetch = self.prefetch, None
            pf.close()
