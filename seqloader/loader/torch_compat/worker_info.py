"""L3, torch_compat: torch's ``WorkerInfo`` in seqloader's workers (process and thread workers),
the numpy seed of torch's worker set-up, and hiding the info around torch's collate functions
(the package docstring says why and what is checked against which torch)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import threading
from typing import Any, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import worker as _worker

from seqloader.loader.plain_routes import ENV, PlainRouteRefused, plain_routes
from seqloader.loader.rngs.generators import seed_generators

_FIELDS = {f.name for f in dataclasses.fields(_worker.WorkerInfo)}
# The development branch's process workers record their global generators in the info's ``rng``
# (its worker loop is ``_process_worker_loop``); 2.13 defines ``_RNG`` but leaves ``rng`` unset.
_RNG = getattr(_worker, "_RNG", None) if hasattr(_worker, "_process_worker_loop") else None


def _thread_aware_get_worker_info() -> Any:  # pragma: no cover - runs as torch's get_worker_info
    # The body torch's development branch gives get_worker_info (the thread's own info first, else
    # the module global); its names are looked up in the module whose function takes this code.
    # ``globals().get``: a call under way when the patch is undone finds the thread-local gone.
    info = getattr(globals().get("_thread_local_worker_info"), "worker_info", None)
    return info if info is not None else _worker_info  # type: ignore[name-defined]  # noqa: F821


def _thread_aware_initial_seed() -> int:  # pragma: no cover - runs as torch.random.initial_seed
    # The seed of the calling thread worker's own torch generator (seeded per batch with the seed a
    # process worker gives torch's default generator), else of the default generator. Its names
    # are looked up in torch.random, whose function takes this code.
    import sys as _sys
    info = _sys.modules["torch.utils.data._utils.worker"].get_worker_info()
    own = getattr(getattr(info, "rng", None), "torch_generator", None) if info is not None else None
    return (own if own is not None else default_generator).initial_seed()  # type: ignore[name-defined]  # noqa: F821


#: Whether thread workers make ``torch.initial_seed()`` answer from the calling thread worker's
#: own generator while they live (see the package docstring). ``False``: ``torch.initial_seed()``
#: in a thread worker is the training process's seed (``get_worker_info`` is still patched). The
#: plain ``worker_info`` route (:mod:`seqloader.loader.plain_routes`) replaces neither.
THREAD_INITIAL_SEED = True


def refuse_thread_workers_on_plain_route() -> None:
    """Raise :class:`~seqloader.loader.plain_routes.PlainRouteRefused` (a ``ValueError``) on the
    plain ``worker_info`` route: thread workers need torch's code replaced, which that route does
    not do, and torch's module-global ``WorkerInfo`` would show one thread's info to every thread.

    Example:
        >>> from seqloader.loader.plain_routes import using_plain_routes
        >>> with using_plain_routes("worker_info"):
        ...     refuse_thread_workers_on_plain_route()
        Traceback (most recent call last):
        ...
        seqloader.loader.plain_routes.PlainRouteRefused: DataLoader(worker_method='thread') and threads_per_worker > 1 ...
        >>> with using_plain_routes(""):   # the default route: thread workers are fine
        ...     refuse_thread_workers_on_plain_route()
    """
    if plain_routes().worker_info:
        raise PlainRouteRefused(
            f"DataLoader(worker_method='thread') and threads_per_worker > 1 are refused on the plain worker_info "
            f"route ({ENV}={plain_routes()}): each thread worker needs its own WorkerInfo from "
            "torch.utils.data.get_worker_info() and its own torch.initial_seed(), which on this torch means "
            "replacing those functions' code while thread workers live; the plain route replaces nothing of "
            "torch's, and torch's one module-global WorkerInfo would show one thread's info to every thread. Use "
            f"worker_method='multiprocessing' with threads_per_worker=1, or take worker_info out of {ENV}")


class _ThreadAwarePatch:
    """``module.get_worker_info`` made thread-aware while held (the package docstring says why).

    Each holder calls :meth:`acquire` once and :meth:`release` once; the first acquire puts a
    ``threading.local`` in ``module._thread_local_worker_info`` and gives ``get_worker_info`` the
    body of :func:`_thread_aware_get_worker_info` (its code object is replaced in place, so
    references taken before see it too); the last release restores the original code and removes
    the attribute. A torch with its own thread-local info (the development branch) is left alone:
    :meth:`local` is torch's, and nothing is patched. An ``RLock``: a finalizer run by the garbage
    collector inside one holder's acquire or release may release another holder in the same thread
    (the count changes before the patching, so a nested release never sees a half-made patch).
    """

    def __init__(self, module: Any):
        self._module, self._function = module, module.get_worker_info
        self._original = self._function.__code__
        self._torchs = getattr(module, "_thread_local_worker_info", None)
        self._lock = threading.RLock()
        self._holders = 0
        self._ours: Optional[threading.local] = None  # the thread-local seqloader put there, while held
        self._for_process = False

    def local(self) -> Optional[threading.local]:
        """The thread-local ``get_worker_info`` reads: torch's own, seqloader's while held, else ``None``."""
        return self._torchs if self._torchs is not None else self._ours

    @property
    def holders(self) -> int:
        return self._holders

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                refuse_thread_workers_on_plain_route()  # (a loader refused already, when it opened them)
            self._holders += 1
            if self._holders > 1:
                return
            if THREAD_INITIAL_SEED:
                _initial_seed.__code__ = _thread_aware_initial_seed.__code__
            if self._torchs is not None:
                return
            try:
                local = threading.local()
                self._module._thread_local_worker_info = local
                self._function.__code__ = _thread_aware_get_worker_info.__code__
                self._ours = local
            except BaseException:
                self._holders -= 1
                self._undo()
                raise

    def release(self) -> None:
        with self._lock:
            if self._holders <= 0:
                raise RuntimeError("seqloader: the thread-aware get_worker_info was released more often than "
                                   "acquired (a holder let go twice)")
            self._holders -= 1
            if self._holders == 0:
                self._undo()

    def hold_for_process(self) -> None:
        """Hold for the rest of this process's life (a worker process whose threads compute items:
        seqloader's own process); idempotent."""
        with self._lock:
            if not self._for_process:
                self.acquire()
                self._for_process = True

    def _undo(self) -> None:
        _initial_seed.__code__ = _INITIAL_SEED_CODE
        if self._torchs is not None:
            return
        self._function.__code__ = self._original
        if self._module.__dict__.get("_thread_local_worker_info", None) is self._ours is not None:
            del self._module._thread_local_worker_info
        self._ours = None

    def before_fork(self) -> None:
        self._lock.acquire()

    def after_fork_in_parent(self) -> None:
        self._lock.release()

    def after_fork_in_child(self) -> None:
        """A forked child has none of its parent's thread workers: it starts unpatched and unheld."""
        self._lock = threading.RLock()
        self._holders, self._for_process = 0, False
        self._undo()


_initial_seed = torch.random.initial_seed  # torch.initial_seed is the same function
_INITIAL_SEED_CODE = _initial_seed.__code__
_PATCH = _ThreadAwarePatch(_worker)
os.register_at_fork(before=_PATCH.before_fork, after_in_parent=_PATCH.after_fork_in_parent,
                    after_in_child=_PATCH.after_fork_in_child)


@contextlib.contextmanager
def thread_worker_info() -> Iterator[None]:
    """Make ``get_worker_info`` thread-aware inside the block (see the package docstring): what the
    thread executor holds from its first thread's start until its last thread has ended.

    Example:
        >>> original = torch.utils.data._utils.worker.get_worker_info.__code__
        >>> with thread_worker_info():
        ...     with thread_worker_info():   # held twice: the patch stays until both let go
        ...         pass
        ...     torch.utils.data._utils.worker.get_worker_info.__code__ is original
        False
        >>> torch.utils.data._utils.worker.get_worker_info.__code__ is original, get_worker_info()
        (True, None)
    """
    _PATCH.acquire()
    try:
        yield
    finally:
        _PATCH.release()


def hold_thread_worker_info_for_process() -> None:
    """Make ``get_worker_info`` thread-aware for the rest of this process's life: in a worker process
    whose threads compute items (seqloader's own process, which ends with its loader); idempotent."""
    _PATCH.hold_for_process()


def thread_worker_info_holders() -> int:
    """How many hold :func:`thread_worker_info` now (for tests: ``0`` once every thread worker ended)."""
    return _PATCH.holders


def _thread_local(what: str) -> threading.local:
    local = _PATCH.local()
    if local is None:
        raise RuntimeError(f"seqloader: {what} needs a thread-aware torch.utils.data.get_worker_info, and none is "
                           "held; hold one while the thread workers live (with thread_worker_info(): ..., as the "
                           "thread executor does)")
    return local


# --------------------------------------------------------------------------- worker info and seeds


def numpy_worker_seed(base_seed: int, worker_id: int) -> list[int]:
    """The ``numpy.random.seed`` torch's worker ``worker_id`` uses for ``base_seed``.

    Example:
        >>> len(numpy_worker_seed(10, 1)), numpy_worker_seed(10, 1) == numpy_worker_seed(10, 1)
        (4, True)
    """
    return list(_worker._generate_state(base_seed, worker_id))


def install_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any, thread_local: bool = False) -> Any:
    """Make ``get_worker_info()`` return what torch's process worker ``worker_id`` would.

    Called in a worker process after the global RNGs were seeded as torch seeds them (the
    development branch records those generators in the info's ``rng``). ``thread_local``: for this
    thread only (a worker process whose threads compute items keeps every info thread-local); on a
    torch without a thread-local info it makes ``get_worker_info`` thread-aware for the rest of the
    process's life (:func:`thread_worker_info`), so it is for seqloader's worker processes only.

    Returns:
        The installed ``WorkerInfo``.

    Example:
        >>> info = install_worker_info(1, 2, seed=11, dataset="ds")
        >>> (info.id, info.num_workers, info.seed, info.dataset) == (1, 2, 11, "ds"), get_worker_info() is info
        (True, True)
        >>> clear_worker_info(); get_worker_info() is None
        True
    """
    extra: dict[str, Any] = {}
    if "worker_method" in _FIELDS:
        extra["worker_method"] = "multiprocessing"
    if _RNG is not None and "rng" in _FIELDS:
        extra["rng"] = _RNG(random_generator=random._inst,
                            torch_generator=torch.default_generator,
                            numpy_generator=np.random.mtrand._rand)
    info = _worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset, **extra)
    if thread_local:  # for the rest of the process's life: a worker process is seqloader's own
        hold_thread_worker_info_for_process()
        _thread_local("install_worker_info").worker_info = info
    else:
        _worker._worker_info = info
    return info


def clear_worker_info() -> None:
    """Forget the installed info (``get_worker_info()`` returns ``None`` again); for tests and docs."""
    _worker._worker_info = None
    local = _PATCH.local()
    if local is not None:
        local.worker_info = None


def worker_dataset(default: Any) -> Any:
    """The dataset object of the worker this runs in (``WorkerInfo.dataset``: a process's copy, a
    thread worker's own copy of an ``IterableDataset``), or ``default`` outside workers."""
    info = get_worker_info()
    return default if info is None else info.dataset


def thread_generators(seed: int) -> Any:
    """Generators of a thread worker's own, seeded with ``seed``, in torch's ``_RNG`` container:
    ``random.Random``, ``torch.Generator`` and numpy's legacy ``RandomState`` (what the global
    ``random``, torch and ``numpy.random`` are to a process worker).

    Example:
        >>> rng = thread_generators(11)
        >>> rng.random_generator.random() == random.Random(11).random(), rng.torch_generator.initial_seed()
        (True, 11)
    """
    rng_type = getattr(_worker, "_RNG", None)
    if rng_type is None:  # pragma: no cover - a torch without the container
        return None
    rng = rng_type(random_generator=random.Random(), torch_generator=torch.Generator(),
                   numpy_generator=np.random.RandomState())
    seed_generators(seed, numpy_worker_seed(seed, 0), seed, rng=rng)
    return rng


def install_thread_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any, rng: Any) -> Any:
    """Make ``get_worker_info()`` return, in this thread only, the info of thread worker ``worker_id``
    (``worker_method="thread"``, ``rng``: the thread's generators, see :func:`thread_generators`).

    Returns:
        The installed ``WorkerInfo``.

    Raises:
        RuntimeError: no :func:`thread_worker_info` is held (on a torch without a thread-local info).

    Example:
        >>> import threading
        >>> def in_a_thread(out):
        ...     install_thread_worker_info(1, 2, seed=11, dataset="ds", rng=thread_generators(11))
        ...     out.append(get_worker_info())
        >>> got = []; t = threading.Thread(target=in_a_thread, args=(got,))
        >>> with thread_worker_info():   # what the thread executor holds while its threads live
        ...     t.start(); t.join()
        >>> got[0].id, got[0].worker_method, get_worker_info() is None   # the main thread has none
        (1, 'thread', True)
    """
    extra: dict[str, Any] = {}
    if "worker_method" in _FIELDS:
        extra["worker_method"] = "thread"
    if "rng" in _FIELDS:
        extra["rng"] = rng
    info = _worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset, **extra)
    _thread_local("install_thread_worker_info").worker_info = info
    return info


@contextlib.contextmanager
def worker_info_hidden() -> Iterator[None]:
    """Make ``torch.utils.data.get_worker_info()`` return ``None`` inside the block.

    Example:
        >>> _ = install_worker_info(0, 1, seed=0, dataset=None)
        >>> with worker_info_hidden():
        ...     get_worker_info() is None
        True
        >>> get_worker_info() is not None
        True
        >>> clear_worker_info()
    """
    local = _PATCH.local()
    own = getattr(local, "worker_info", None)
    if local is not None and own is not None:  # a thread worker: its own info only (the global is others' too)
        local.worker_info = None
        try:
            yield
        finally:
            local.worker_info = own
        return
    saved = _worker._worker_info
    _worker._worker_info = None
    try:
        yield
    finally:
        _worker._worker_info = saved
