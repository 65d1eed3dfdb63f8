"""L3: what a thread worker is given instead of a process's globals: its ``WorkerInfo``, its own
generators seeded per batch, and a guard that reports draws from the shared global RNGs.

Every batch of a ``seqloader.DataLoader`` is computed right after its generators are seeded from
``(seed, epoch, position)``. A worker *process* owns its global RNGs (``random``, ``numpy.random``,
torch's default generator), so seeding those is enough (:func:`~seqloader.loader.seeding.seed_globals`).
Threads share them with each other and with the training loop, so a thread worker
(``worker_method="thread"``, and each thread inside a worker process with ``threads_per_worker``)
gets generators of its own instead, in its ``WorkerInfo.rng`` (torch's ``_RNG`` container:
``random.Random``, ``torch.Generator``, numpy's ``RandomState``), seeded per batch with the very
seeds a process worker gives its globals. So ``torch.thread_safe_generator()``,
``get_worker_info().rng`` and :func:`seqloader.rng_map` draw the same numbers under every
executor.

Draws from the *global* generators inside a thread worker cannot be reproduced: another thread may
draw (or the training loop) in between. They are not seeded per batch there, and a
:class:`GlobalDrawGuard` compares their states around each batch: a batch that changed one logs a
``RuntimeWarning`` (once per loader) naming the generator and the fix. The training loop's own
draws (dropout draws from torch's generator) are told apart for torch: a change of torch's
generator counts only when the loop was waiting inside ``next()`` for the whole batch.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Optional

from seqloader.loader.global_rngs import Snapshot
from seqloader.loader.torch_compat import install_thread_worker_info, install_worker_info, thread_generators
from seqloader.rng import derive_seed
from seqloader.sequences import stage_times

__all__ = ["GlobalDrawGuard", "ThreadRNGs", "ThreadWorkerSetup", "current_thread_rngs", "use_thread_rngs"]

_local = threading.local()  # .rngs: the ThreadRNGs of a thread worker


class GlobalDrawGuard:
    """Reports, once, a batch computed in a thread worker that drew from a global generator.

    Args:
        loop_may_draw: the training loop runs in this process, at the same time as the workers
            (``worker_method="thread"``): a change of torch's generator then counts only while
            the loop waits inside ``next()`` (:meth:`loop_waits`).
    """

    def __init__(self, loop_may_draw: bool):
        self._loop_may_draw = loop_may_draw
        self._lock = threading.Lock()
        self._warned = False
        self._waiting = False  # the loop is inside next()
        self._waits = 0        # how many times it entered next()

    def loop_waits(self, waiting: bool) -> None:
        """The training loop entered (``True``) or left (``False``) the loader's ``next()``."""
        with self._lock:
            self._waiting = waiting
            self._waits += waiting

    def watch(self) -> tuple:
        """What :meth:`check` compares with: the global states, and where the loop was."""
        with self._lock:
            where = (self._waiting, self._waits)
        return Snapshot(), where

    def check(self, watched: tuple, what: Callable[[], str]) -> None:
        """Warn (once) if a global generator changed since ``watched`` (``what()`` names the batch)."""
        if self._warned:
            return
        snapshot, (waiting, waits) = watched
        changed = snapshot.changed()
        if "torch" in changed and self._loop_may_draw:
            with self._lock:
                loop_idle = waiting and self._waiting and waits == self._waits
            if not loop_idle:
                changed.remove("torch")
        if not changed:
            return
        with self._lock:
            if self._warned:
                return
            self._warned = True
        warnings.warn(
            f"seqloader.DataLoader: {what()} drew from the global {' and '.join(changed)} generator(s) in a thread "
            "worker; threads share those generators (with each other and the training loop), so these draws "
            "are not reproducible and a resume will not repeat them. Draw from seqloader.rng_map(...), "
            "torch.thread_safe_generator() or torch.utils.data.get_worker_info().rng (seeded per batch, the "
            "same under every worker_method), or use worker_method='multiprocessing' with threads_per_worker=1",
            RuntimeWarning, stacklevel=2)


class ThreadRNGs:
    """A thread worker's generators (torch's ``_RNG``: ``rng``) and its loader's guard."""

    __slots__ = ("rng", "guard")

    def __init__(self, rng: Any, guard: Optional[GlobalDrawGuard]):
        self.rng, self.guard = rng, guard


def use_thread_rngs(rngs: Optional[ThreadRNGs]) -> None:
    """Make ``rngs`` this thread's (``None``: the globals again)."""
    _local.rngs = rngs


def current_thread_rngs() -> Optional[ThreadRNGs]:
    """This thread's :class:`ThreadRNGs` if it is a thread worker, else ``None``."""
    return getattr(_local, "rngs", None)


class ThreadWorkerSetup:
    """The set-up of a thread worker: a ``prefetch(method="thread")`` ``worker_init_fn``, or (with
    ``thread``) the ``thread_init_fn`` of the threads inside a worker process.

    Worker ``w``'s ``WorkerInfo`` is torch's for worker ``w`` (``seed = base_seed + w``) with
    ``worker_method="thread"`` and the thread's own generators; a thread inside a worker process
    seeds its generators from ``(base_seed + w, thread)``. With ``stages`` the thread's stages are
    timed; ``user_fn(worker_id)`` (the loader's ``worker_init_fn``) runs last in a thread worker
    (inside a worker process it ran once, in the process's own set-up).

    Example:
        >>> import torch
        >>> from seqloader.loader.torch_compat import clear_worker_info
        >>> setup = ThreadWorkerSetup(2, base_seed=10, dataset="ds", user_fn=None)
        >>> setup(1)   # what thread worker 1 runs first; here, in this thread
        >>> info = torch.utils.data.get_worker_info()
        >>> info.id, info.seed, info.worker_method, torch.thread_safe_generator() is info.rng.torch_generator
        (1, 11, 'thread', True)
        >>> use_thread_rngs(None); clear_worker_info()
    """

    def __init__(self, num_workers: int, base_seed: int, dataset: Any, user_fn: Optional[Callable[[int], None]],
                 stages: bool = False, guard: Optional[GlobalDrawGuard] = None):
        self.num_workers, self.base_seed, self.dataset = num_workers, base_seed, dataset
        self.user_fn, self.stages, self.guard = user_fn, stages, guard

    def __call__(self, worker_id: int, thread: Optional[int] = None) -> None:
        seed = self.base_seed + worker_id
        own = seed if thread is None else derive_seed(seed, "thread_worker", thread) >> 2
        rng = thread_generators(own)
        install_thread_worker_info(worker_id, self.num_workers, seed, self.dataset, rng)
        use_thread_rngs(ThreadRNGs(rng, self.guard))
        if self.stages:
            stage_times.enable()
        if thread is None and self.user_fn is not None:
            self.user_fn(worker_id)


def process_info_for_threads(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """In a worker process whose threads compute items: its own (main) thread's info is
    thread-local too, so hiding it around a collate in one thread never hides another's."""
    install_worker_info(worker_id, num_workers, seed, dataset, thread_local=True)
