"""L3: what a thread worker is given instead of a process's globals: its ``WorkerInfo``, its own
generators seeded per batch (:class:`~seqloader.loader.rngs.probe.ThreadRNGs`), a probe of its draws
from the shared global RNGs (:class:`~seqloader.loader.rngs.probe.GlobalDrawProbe`), and the user's
``worker_init_fn``, run one at a time in the process.

Every batch of a ``seqloader.DataLoader`` is computed right after its generators are seeded from
``(seed, epoch, position)``. A worker *process* owns its global RNGs (``random``, ``numpy.random``,
torch's default generator), so seeding those is enough (:func:`~seqloader.loader.rngs.seeding.seed_globals`).
Threads share them with each other and with the training loop, so a thread worker
(``worker_method="thread"``, and each thread inside a worker process with ``threads_per_worker``)
gets generators of its own instead, in its ``WorkerInfo.rng`` (torch's ``_RNG`` container:
``random.Random``, ``torch.Generator``, numpy's ``RandomState``), seeded per batch with the very
seeds a process worker gives its globals. So ``torch.thread_safe_generator()``,
``get_worker_info().rng`` and :func:`seqloader.rng_map` draw the same numbers under every
executor. Draws from the *global* generators cannot be reproduced there; the probe reports them
(:mod:`seqloader.loader.rngs.probe`). On the plain ``worker_info`` route thread workers are
refused (:class:`ThreadWorkerSetup`).
"""

from __future__ import annotations

import copy
import os
import threading
import warnings
from typing import Any, Callable, ContextManager, Optional

from seqloader.loader.rngs.snapshots import Snapshot, reseeded, reseeding
from seqloader.loader.rngs.generators import DrawCheck
from seqloader.loader.rngs.probe import GlobalDrawProbe, ThreadRNGs, use_thread_rngs
from seqloader.loader.torch_compat import (hold_thread_worker_info_for_process, install_thread_worker_info,
                                           refuse_thread_workers_on_plain_route,
                                           thread_generators, thread_worker_info)
from seqloader.prefetcher.faults import SETUP_STEP
from seqloader.rng import derive_seed
from seqloader.sequences import stage_times

__all__ = ["ThreadWorkerSetup"]

#: held while a thread worker runs the user's ``worker_init_fn`` (:meth:`ThreadWorkerSetup._run_user_fn`):
#: the global generators are the process's, so one snapshot-call-restore at a time in the process
_INIT_LOCK = threading.Lock()


def _new_init_lock() -> None:
    global _INIT_LOCK
    _INIT_LOCK = threading.Lock()   # a forked child has none of its parent's threads: none holds it


os.register_at_fork(after_in_child=_new_init_lock)


class ThreadWorkerSetup:
    """The set-up of a thread worker: a ``prefetch(method="thread")`` ``worker_init_fn``, or (with
    ``thread``) the ``thread_init_fn`` of the threads inside a worker process.

    Worker ``w``'s ``WorkerInfo`` is torch's for worker ``w`` (``seed = base_seed + w``) with
    ``worker_method="thread"`` and the thread's own generators; a thread inside a worker process
    seeds its generators from ``(base_seed + w, thread)``. Its ``dataset`` is the loader's (one
    object for every thread: what threads save), or with ``copy_dataset`` (an
    ``IterableDataset``, whose streams keep state in it) a copy of the thread's own, as a worker
    process has. With ``stages`` the thread's stages are
    timed; ``user_fn(worker_id)`` (the loader's ``worker_init_fn``) runs last in a thread worker
    (inside a worker process it ran once, in the process's own set-up).

    The info of a thread needs torch's ``get_worker_info`` made thread-aware (on a torch without a
    thread-local info): the thread executor holds :meth:`while_workers_live` from its first
    thread's start until its last thread has ended; inside a worker process (``thread`` given) the
    set-up holds it for the process's life (see :mod:`seqloader.loader.torch_compat`). On the plain
    ``worker_info`` route, which replaces nothing of torch's, making one raises
    :class:`~seqloader.loader.plain_routes.PlainRouteRefused` (a ``ValueError``): the loader makes it
    when it opens its workers, before any thread starts.

    Example:
        >>> import torch
        >>> from seqloader.loader.torch_compat import clear_worker_info
        >>> setup = ThreadWorkerSetup(2, base_seed=10, dataset="ds", user_fn=None)
        >>> with setup.while_workers_live():   # what the thread executor holds
        ...     setup(1)   # what thread worker 1 runs first; here, in this thread
        ...     info = torch.utils.data.get_worker_info()
        ...     info.id, info.seed, info.worker_method, torch.thread_safe_generator() is info.rng.torch_generator
        ...     use_thread_rngs(None); clear_worker_info()
        (1, 11, 'thread', True)
        >>> torch.utils.data.get_worker_info() is None
        True
    """

    def __init__(self, num_workers: int, base_seed: int, dataset: Any, user_fn: Optional[Callable[[int], None]],
                 stages: bool = False, probe: Optional[GlobalDrawProbe] = None, copy_dataset: bool = False):
        refuse_thread_workers_on_plain_route()
        self.num_workers, self.base_seed, self.dataset = num_workers, base_seed, dataset
        self.user_fn, self.stages, self.probe, self.copy_dataset = user_fn, stages, probe, copy_dataset

    def while_workers_live(self) -> ContextManager[None]:
        """What the thread executor holds while its threads live (a neutral protocol: the
        prefetcher knows nothing of torch)."""
        return thread_worker_info()

    def __call__(self, worker_id: int, thread: Optional[int] = None) -> None:
        if thread is not None:  # a thread of a worker process: seqloader's own process, held for its life
            hold_thread_worker_info_for_process()
        seed = self.base_seed + worker_id
        own = seed if thread is None else derive_seed(seed, "thread_worker", thread) >> 2
        rng = thread_generators(own)
        dataset = self.dataset
        if self.copy_dataset:
            try:
                dataset = copy.deepcopy(dataset)
            except Exception as exc:
                error = TypeError(f"DataLoader(worker_method='thread'): each thread worker reads its own copy of an "
                                  f"IterableDataset (as a worker process does), and copy.deepcopy of "
                                  f"{type(dataset).__name__} failed ({type(exc).__name__}: {exc}); make it copyable "
                                  "(__deepcopy__) or use worker_method='multiprocessing'")
                setattr(error, SETUP_STEP, "copying the IterableDataset for the thread worker")  # not worker_init_fn
                raise error from exc
        install_thread_worker_info(worker_id, self.num_workers, seed, dataset, rng)
        use_thread_rngs(ThreadRNGs(rng, self.probe))
        if self.stages:
            stage_times.enable()
        if thread is None and self.user_fn is not None:
            self._run_user_fn(worker_id)

    def _run_user_fn(self, worker_id: int) -> None:
        """``worker_init_fn(worker_id)`` in a thread worker, leaving the training process's global
        generators as they were: torch's idiom ``np.random.seed(worker_id)`` seeds a worker
        *process*'s own globals, but here they are the training loop's. The thread workers of this
        process run their ``worker_init_fn`` one at a time (:data:`_INIT_LOCK`), each between a
        snapshot of the three states and its restore (bracketed as seqloader's own setting, so the
        probe does not blame it): one at a time, so that no thread takes its snapshot while another
        thread's function has changed the states and not yet put them back (the race of issue 42).
        A change is warned about once per loader, since it has no effect on items."""
        user_fn = self.user_fn
        assert user_fn is not None  # (the caller checked)
        with _INIT_LOCK:
            reseeding()
            try:
                snapshot, check = Snapshot(), DrawCheck()
                try:
                    user_fn(worker_id)
                finally:
                    changed = bool(check.moved())
                    snapshot.restore()
            finally:
                reseeded()
        if changed and self.probe is not None and self.probe.first_init_warning():
            warnings.warn(
                "seqloader.DataLoader(worker_method='thread'): worker_init_fn changed the global random, "
                "numpy.random or torch generator; thread workers share those with the training loop, so "
                "seqloader put them back as they were and the change has no effect on items. Seed per worker "
                "from torch.utils.data.get_worker_info().seed, or draw in items from torch.thread_safe_generator() "
                "(the same under every executor)", RuntimeWarning, stacklevel=2)

    def thread_ended(self, worker_id: int) -> None:
        """Undo, in a thread worker that ends, what its set-up switched on in this thread (stage
        timing: the count of collecting threads is process-wide)."""
        if self.stages:
            stage_times.disable()
        use_thread_rngs(None)
