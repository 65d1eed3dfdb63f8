"""L3, torch_compat: torch's ``WorkerInfo`` in seqloader's workers (process and thread workers),
the numpy seed of torch's worker set-up, and hiding the info around torch's collate functions
(the package docstring says why and what is checked against which torch)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import worker as _worker

_FIELDS = {f.name for f in dataclasses.fields(_worker.WorkerInfo)}
# The development branch's process workers record their global generators in the info's ``rng``
# (its worker loop is ``_process_worker_loop``); 2.13 defines ``_RNG`` but leaves ``rng`` unset.
_RNG = getattr(_worker, "_RNG", None) if hasattr(_worker, "_process_worker_loop") else None
_LOCAL = getattr(_worker, "_thread_local_worker_info", None)  # ... and its thread-local info
_LOCAL_LOCK = threading.Lock()



def _thread_aware_get_worker_info() -> Any:  # pragma: no cover - runs as torch's get_worker_info
    # The body torch's development branch gives get_worker_info; its names are looked up in
    # torch.utils.data._utils.worker, the module whose function takes this code.
    info = getattr(_thread_local_worker_info, "worker_info", None)  # type: ignore[name-defined]  # noqa: F821
    return info if info is not None else _worker_info  # type: ignore[name-defined]  # noqa: F821


def _thread_local() -> Any:
    """torch's thread-local worker info, made thread-aware on a torch without one (module docstring)."""
    global _LOCAL
    with _LOCAL_LOCK:
        if _LOCAL is None:
            local = threading.local()
            _worker._thread_local_worker_info = local  # type: ignore[attr-defined]
            _worker.get_worker_info.__code__ = _thread_aware_get_worker_info.__code__
            _LOCAL = local
        return _LOCAL


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
    thread only (a worker process whose threads compute items keeps every info thread-local).

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
    if thread_local:
        _thread_local().worker_info = info
    else:
        _worker._worker_info = info
    return info


def clear_worker_info() -> None:
    """Forget the installed info (``get_worker_info()`` returns ``None`` again); for tests and docs."""
    _worker._worker_info = None
    if _LOCAL is not None:
        _LOCAL.worker_info = None


def worker_dataset(default: Any) -> Any:
    """The dataset object of the worker this runs in (``WorkerInfo.dataset``: a process's copy, a
    thread worker's own copy of an ``IterableDataset``), or ``default`` outside workers."""
    info = get_worker_info()
    return default if info is None else info.dataset


def thread_generators(seed: int) -> Any:
    """Generators of a thread worker's own, seeded with ``seed``, in torch's ``_RNG`` container:
    ``random.Random``, ``torch.Generator`` and numpy's legacy ``RandomState`` (what the global
    ``random``, torch and ``numpy.random`` are to a process worker)."""
    torch_generator = torch.Generator()
    torch_generator.manual_seed(seed)
    rs = np.random.RandomState(numpy_worker_seed(seed, 0))
    rng_type = getattr(_worker, "_RNG", None)
    if rng_type is None:  # pragma: no cover - a torch without the container
        return None
    return rng_type(random_generator=random.Random(seed), torch_generator=torch_generator, numpy_generator=rs)


def install_thread_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any, rng: Any) -> Any:
    """Make ``get_worker_info()`` return, in this thread only, the info of thread worker ``worker_id``
    (``worker_method="thread"``, ``rng``: the thread's generators, see :func:`thread_generators`).

    Returns:
        The installed ``WorkerInfo``.

    Example:
        >>> import threading
        >>> def in_a_thread(out):
        ...     install_thread_worker_info(1, 2, seed=11, dataset="ds", rng=thread_generators(11))
        ...     out.append(get_worker_info())
        >>> got = []; t = threading.Thread(target=in_a_thread, args=(got,)); t.start(); t.join()
        >>> got[0].id, got[0].worker_method, get_worker_info() is None   # the main thread has none
        (1, 'thread', True)
    """
    extra: dict[str, Any] = {}
    if "worker_method" in _FIELDS:
        extra["worker_method"] = "thread"
    if "rng" in _FIELDS:
        extra["rng"] = rng
    info = _worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset, **extra)
    _thread_local().worker_info = info
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
    local = getattr(_LOCAL, "worker_info", None) if _LOCAL is not None else None
    if local is not None:  # a thread worker: its own info only (the module global is another thread's too)
        _LOCAL.worker_info = None  # type: ignore[union-attr]
        try:
            yield
        finally:
            _LOCAL.worker_info = local  # type: ignore[union-attr]
        return
    saved = _worker._worker_info
    _worker._worker_info = None
    try:
        yield
    finally:
        _worker._worker_info = saved
