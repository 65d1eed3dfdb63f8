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

Draws from the *global* generators inside a thread worker cannot be reproduced: another thread
(or the training loop) may draw or reseed in between. They are not seeded per batch there, and a
:class:`GlobalDrawProbe` watches, in the worker thread itself, the first batch each thread worker
computes in an epoch: a profile hook of that thread only (``sys.setprofile``) sees each call into C
and recognises a draw from ``random``'s global instance (exact: what other threads do is never
attributed to the worker), or a torch random function that moved torch's default generator
during the call. numpy's functions do not show in a profile (Cython): its global state is
compared before and after the batch instead. Both compares are the one draw check
(:class:`~seqloader.loader.rngs.DrawCheck`); the hook only narrows the window, and cannot go:
a compare around the whole batch blames the training loop's own draws on the worker (issue 42
measured it, ``docs/design.md``). For torch and numpy, seqloader's own settings of the global
states (a ``num_workers=0`` loader of the same process) are told apart
(:func:`~seqloader.loader.global_rngs.reseeds`), but a draw from those globals by another thread
at that moment is blamed on the worker (torch's functions release the GIL): a warning too many,
never a batch changed. The first such batch logs a ``RuntimeWarning`` (once per loader) naming
the generator and the fix; batches after the first of each epoch cost nothing.

On the plain ``probe`` route (``SEQLOADER_PLAIN_ROUTES=probe``,
:mod:`seqloader.loader.plain_routes`) the probe is off, decided when it is made: no profile hook is
set, and a draw from the global generators in a thread worker is not reported (batches are the
same). On the plain ``worker_info`` route thread workers are refused (:class:`ThreadWorkerSetup`).
"""

from __future__ import annotations

import copy
import os
import random
import sys
import threading
import warnings
from typing import Any, Callable, ContextManager, Optional

from seqloader.loader.global_rngs import Snapshot, reseeded, reseeding
from seqloader.loader.plain_routes import plain_routes
from seqloader.loader.rngs import DrawCheck
from seqloader.loader.torch_compat import (hold_thread_worker_info_for_process, install_thread_worker_info,
                                           install_worker_info, refuse_thread_workers_on_plain_route,
                                           thread_generators, thread_worker_info)
from seqloader.rng import derive_seed
from seqloader.sequences import stage_times

__all__ = ["GlobalDrawProbe", "ThreadRNGs", "ThreadWorkerSetup", "current_thread_rngs", "use_thread_rngs"]

_local = threading.local()  # .rngs: the ThreadRNGs of a thread worker
#: held while a thread worker runs the user's ``worker_init_fn`` (:meth:`ThreadWorkerSetup._run_user_fn`):
#: the global generators are the process's, so one snapshot-call-restore at a time in the process
_INIT_LOCK = threading.Lock()


def _new_init_lock() -> None:
    global _INIT_LOCK
    _INIT_LOCK = threading.Lock()   # a forked child has none of its parent's threads: none holds it


os.register_at_fork(after_in_child=_new_init_lock)


_NUMPY, _TORCH = ("numpy.random",), ("torch",)  # what the probe's checks watch

#: Names of torch's functions and tensor methods that draw from a generator.
TORCH_DRAWS = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
    "multinomial", "poisson", "dropout", "feature_dropout", "alpha_dropout", "native_dropout", "rrelu",
    "rrelu_with_noise", "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "rrelu_"})


class _Hook:
    """The profile hook of one watched batch: what it saw drawn from the global generators. It
    says *when* to compare (:class:`~seqloader.loader.rngs.DrawCheck`, the one draw check): torch's
    state around each call of this thread to a torch random function, numpy's around the batch."""

    __slots__ = ("found", "_random", "_torch", "_numpy")

    def __init__(self) -> None:
        self.found: list[str] = []
        self._random = random._inst
        self._torch: Optional[DrawCheck] = None
        self._numpy = DrawCheck(_NUMPY)

    def numpy_changed(self) -> bool:
        """numpy's global state moved during the batch, and not by seqloader's own setting."""
        return bool(self._numpy.drawn())

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            if getattr(arg, "__self__", None) is self._random:
                self.found.append("random")
            elif getattr(arg, "__name__", None) in TORCH_DRAWS:
                self._torch = DrawCheck(_TORCH)
        elif event in ("c_return", "c_exception") and self._torch is not None:
            if self._torch.drawn():
                self.found.append("torch")
            self._torch = None


class GlobalDrawProbe:
    """Reports, once per loader, a batch computed in a thread worker that drew from a global
    generator (see the module docstring). Shared by the loader's thread workers.

    ``enabled``: whether it watches at all (``None``: unless the plain ``probe`` route is in force
    now); decided once, when it is made, and carried to the copies a worker process gets.
    """

    def __init__(self, enabled: Optional[bool] = None) -> None:
        self.enabled = not plain_routes().probe if enabled is None else bool(enabled)
        self._lock = threading.Lock()
        self._warned = False
        self._init_warned = False  # worker_init_fn changed the globals (ThreadWorkerSetup): warned once

    def first_init_warning(self) -> bool:
        """Whether this is the first time the worker_init_fn warning is due (then it is given)."""
        with self._lock:
            first, self._init_warned = not self._init_warned, True
            return first

    def __reduce__(self) -> tuple:
        return GlobalDrawProbe, (self.enabled,)  # a copy (a copied loader, a worker process) watches afresh

    def watch(self, rngs: "ThreadRNGs", epoch: int) -> Optional[tuple]:
        """Start watching this thread's batch if it is its first of ``epoch``; pass the result to
        :meth:`check` (``None``: nothing watched)."""
        if not self.enabled or self._warned or rngs.probed_epoch == epoch:
            return None
        rngs.probed_epoch = epoch
        hook, previous = _Hook(), sys.getprofile()
        sys.setprofile(hook)
        return hook, previous

    def check(self, watched: tuple, what: Callable[[], str]) -> None:
        """Stop watching; warn (once) if the batch drew from a global generator."""
        hook, previous = watched
        sys.setprofile(previous)
        if hook.numpy_changed():
            hook.found.append("numpy.random")
        if not hook.found:
            return
        with self._lock:
            if self._warned:
                return
            self._warned = True
        names = " and ".join(dict.fromkeys(hook.found))
        warnings.warn(
            f"seqloader.DataLoader: {what()} drew from the global {names} generator(s) in a thread worker; "
            "threads share those generators (with each other and the training loop), so these draws are not "
            "reproducible and a resume will not repeat them. Draw from seqloader.rng_map(...) or "
            "torch.thread_safe_generator() instead (seeded per batch: the same numbers under every executor, "
            "num_workers=0 included), or use worker_method='multiprocessing' with threads_per_worker=1",
            RuntimeWarning, stacklevel=2)


class ThreadRNGs:
    """A thread worker's generators (torch's ``_RNG``: ``rng``), its loader's probe, and the last
    epoch whose first batch the probe watched in this thread."""

    __slots__ = ("rng", "probe", "probed_epoch")

    def __init__(self, rng: Any, probe: Optional[GlobalDrawProbe]):
        self.rng, self.probe, self.probed_epoch = rng, probe, -1


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
                raise TypeError(f"DataLoader(worker_method='thread'): each thread worker reads its own copy of an "
                                f"IterableDataset (as a worker process does), and copy.deepcopy of "
                                f"{type(dataset).__name__} failed ({type(exc).__name__}: {exc}); make it copyable "
                                "(__deepcopy__) or use worker_method='multiprocessing'") from exc
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


def process_info_for_threads(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """In a worker process whose threads compute items: its own (main) thread's info is
    thread-local too, so hiding it around a collate in one thread never hides another's."""
    install_worker_info(worker_id, num_workers, seed, dataset, thread_local=True)
