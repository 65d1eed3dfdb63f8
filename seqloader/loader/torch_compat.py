"""L3: every use of torch's private data-loading pieces, in one place.

A torch release is checked here and nowhere else. What seqloader borrows from
``torch.utils.data._utils`` and why:

* the worker's ``WorkerInfo`` (what ``torch.utils.data.get_worker_info()`` returns) and the numpy
  seed of torch's worker set-up (``_generate_state``), so that a dataset sees in seqloader's
  workers exactly what torch's own workers would show it: :func:`install_worker_info`;
* hiding that info around torch's default collate functions, which stack into a fresh
  shared-memory segment per batch whenever they see one (seqloader ships results through its
  own reused slots): :func:`collate_in_plain_memory`;
* torch's generic ``collate`` and ``default_collate_fn_map``, to run ``default_collate`` with its
  tensors stacked straight into regions of a worker's slot (:func:`collate_into_slot`);
* the map-style fetch (``_MapDatasetFetcher``: ``dataset.__getitems__`` when it exists):
  :func:`fetch`; pinning (``pin_memory``): :func:`pin`;
* torch's words, which user code matches on: a dead worker, a timeout, running out of file
  descriptors, the ``pin_memory`` warnings (:func:`worker_error`, :func:`open_files_error`,
  :func:`pin_device`); a batch that killed a worker and its replacement starts with torch's
  words for the last death (:func:`poison_error`).

Checked against torch 2.13 and its development branch (2026-11): 2.13's ``WorkerInfo`` has the
fields ``rng`` and ``worker_method``, which torch's process workers leave at their defaults
(``None``, ``"multiprocessing"``); the development branch fills ``rng`` with the worker's global
generators (``_RNG(random._inst, torch.default_generator, numpy's global RandomState)``) and makes
``get_worker_info()`` look at a thread-local info (its thread workers) before the module global.
:func:`install_worker_info` follows whichever torch is installed, and the hiding clears both.

**Thread workers** (``worker_method="thread"``, and threads inside worker processes) need a
``WorkerInfo`` per thread: :func:`install_thread_worker_info` sets one with ``worker_method="thread"``
and the thread's own generators in ``rng`` (what ``torch.thread_safe_generator()`` returns), in the
thread-local storage torch's development branch reads. On a torch without it (2.13), the first call
gives ``get_worker_info`` that branch's body: its code object is replaced in place (so references
taken before, ``from torch.utils.data import get_worker_info``, see it too), reading the
thread-local info first and torch's module global otherwise. It is done once per process, only when
thread workers start, and changes nothing for a thread without an info of its own (the main
thread, torch's own workers). ``tests/loader/test_torch_compat.py`` checks both torches' ways.
``tests/loader/test_torch_compat.py`` compares the info with the one torch's own workers build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import signal
import threading
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, default_convert, get_worker_info
from torch.utils.data._utils import collate as _collate
from torch.utils.data._utils import worker as _worker
from torch.utils.data._utils.fetch import _MapDatasetFetcher
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

__all__ = ["collate_in_plain_memory", "collate_into_slot", "fetch", "install_thread_worker_info", "install_worker_info",
           "has_arrays", "is_default_collate", "numpy_worker_seed", "open_files_error", "pin", "pin_device", "poison_error",
           "thread_generators", "worker_dataset", "worker_error", "worker_info_hidden"]

#: torch's default collate functions: the ones that stack into shared memory inside a worker.
TORCH_COLLATES = (default_collate, default_convert)

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


def collate_in_plain_memory(collate_fn: Callable[[Any], Any], data: Any) -> Any:
    """``collate_fn(data)``; torch's own collate functions run with the worker info hidden.

    Inside a worker, torch's ``default_collate`` stacks tensors into a fresh shared-memory segment
    per batch (for torch's transport). seqloader's workers copy results into reused slots, so
    the same values in ordinary memory are much cheaper. A user's ``collate_fn`` sees the info.

    Example:
        >>> collate_in_plain_memory(default_collate, [1, 2]).tolist()
        [1, 2]
    """
    if collate_fn in TORCH_COLLATES and get_worker_info() is not None:
        with worker_info_hidden():
            return collate_fn(data)
    return collate_fn(data)


# --------------------------------------------------------------------------- collating into a slot

_STANDARD = {getattr(_collate, name) for name in ("collate_tensor_fn", "collate_numpy_array_fn",
                                                  "collate_numpy_scalar_fn", "collate_float_fn", "collate_int_fn",
                                                  "collate_str_fn")}
# torch's own map, as torch ships it; None if this torch's map holds something else (then no slot path).
_PRISTINE = (dict(_collate.default_collate_fn_map)
             if set(_collate.default_collate_fn_map.values()) <= _STANDARD else None)


class _Unplaceable(Exception):
    """A batch the slot path cannot place (its tensors go through ``default_collate`` instead)."""


def has_arrays(sample: Any, depth: int = 0) -> bool:
    """Whether ``sample`` holds a tensor or a numpy array (what ``default_collate`` stacks), looking
    through dicts, lists and tuples: only such batches gain from collating into the slot (a batch
    of numbers becomes one ``torch.tensor(list)`` either way, cheaper without the slot's two passes).

    Example:
        >>> has_arrays({"x": [1, np.zeros(3)]}), has_arrays((1, 2.0, "a"))
        (True, False)
    """
    if isinstance(sample, (torch.Tensor, np.ndarray)):
        return True
    if depth > 8 or isinstance(sample, (str, bytes)):
        return False
    if isinstance(sample, dict):
        return any(has_arrays(v, depth + 1) for v in sample.values())
    if isinstance(sample, (list, tuple)):
        return any(has_arrays(v, depth + 1) for v in sample)
    return False


def is_default_collate(collate_fn: Any) -> bool:
    """Whether ``collate_fn`` is torch's ``default_collate`` (the one :func:`collate_into_slot` runs).

    Example:
        >>> is_default_collate(default_collate), is_default_collate(default_convert)
        (True, False)
    """
    return collate_fn is default_collate


def _leaf(batch: Any, *, collate_fn_map: Any = None) -> None:
    return None  # numbers, strings, numpy scalars: not sized (they are not stacked into the slot)


def _size_tensors(plan: list, batch: Any, *, collate_fn_map: Any = None) -> None:
    """Sizing pass: record the stacked shape and dtype, or refuse what ``out=`` would change."""
    elem = batch[0]
    dtype = elem.dtype
    if elem.layout is not torch.strided or elem.device.type != "cpu" or elem.is_nested or elem.is_quantized:
        raise _Unplaceable  # torch's collate raises, or stacks elsewhere: its path decides
    for t in batch:  # a subclass dispatches elsewhere, dtypes would promote, out= refuses autograd
        if type(t) is not torch.Tensor or t.dtype is not dtype or t.requires_grad:
            raise _Unplaceable
    plan.append(((len(batch), *elem.shape), dtype))


def _fill_tensors(regions: Iterator[Any], batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    """Filling pass: ``torch.stack(batch, 0, out=...)`` into the next region, as sized."""
    shape, dtype, view = next(regions, (None, None, None))
    elem = batch[0]
    if view is None or shape != (len(batch), *elem.shape) or elem.dtype is not dtype:
        raise _Unplaceable  # the structure changed between the passes
    out = (torch.frombuffer(view, dtype=torch.uint8).view(dtype).view(shape) if view.nbytes
           else torch.empty(shape, dtype=dtype))
    return torch.stack(batch, 0, out=out)


def _with_tensor_fn(tensor_fn: Callable[..., Any], others: Optional[Callable[..., Any]]) -> dict:
    """torch's map, in its order, with ``tensor_fn`` for tensors (and ``others`` for numbers and strings)."""
    assert _PRISTINE is not None
    out: dict[Any, Callable[..., Any]] = {}
    for key, fn in _PRISTINE.items():
        if key is torch.Tensor:
            out[key] = tensor_fn
        elif fn is _collate.collate_numpy_array_fn or others is None:
            out[key] = fn
        else:
            out[key] = others
    return out


def collate_into_slot(data: Any, reserve: Callable[[Sequence[int]], list]) -> Any:
    """``default_collate(data)``, its stacked tensors written into regions from ``reserve(sizes)``.

    torch's own ``collate`` runs twice with torch's ``default_collate_fn_map``, changed only for
    tensors: a sizing pass records each stacked tensor's shape and dtype, ``reserve`` is called
    once with their sizes, and a filling pass stacks each into its region (``torch.stack(batch, 0,
    out=region)``). Numbers, strings and numpy scalars are collated as torch does. The result is
    ``default_collate``'s: same structure, dtypes, shapes and values. A batch the passes cannot
    place goes through ``default_collate`` in ordinary memory (:func:`collate_in_plain_memory`),
    which returns the same values or raises torch's own error: tensors that are not exactly
    ``torch.Tensor``, sparse, nested, quantized, on another device, requiring grad, or of mixed
    dtypes; a structure the sizing pass fails on or that changes between the passes; batches with
    no tensor at all; and every batch when ``default_collate_fn_map`` was changed.

    Example:
        >>> regions = lambda sizes: [memoryview(bytearray(n)) for n in sizes]
        >>> out = collate_into_slot([{"x": torch.ones(2), "y": 1}, {"x": torch.zeros(2), "y": 2}], regions)
        >>> out["x"].tolist(), out["y"].tolist()
        ([[1.0, 1.0], [0.0, 0.0]], [1, 2])
    """
    if _PRISTINE is None or _collate.default_collate_fn_map != _PRISTINE:
        return collate_in_plain_memory(default_collate, data)
    plan: list = []
    placed = True
    try:
        _collate.collate(data, collate_fn_map=_with_tensor_fn(functools.partial(_size_tensors, plan), _leaf))
    except Exception:  # (handled outside the except block: no traceback keeps anything alive)
        placed = False
    if not placed or not plan:
        return collate_in_plain_memory(default_collate, data)
    views = reserve([int(torch.Size(shape).numel()) * dtype.itemsize for shape, dtype in plan])
    regions = iter([(shape, dtype, view) for (shape, dtype), view in zip(plan, views)])
    del views
    try:
        out = _collate.collate(data, collate_fn_map=_with_tensor_fn(functools.partial(_fill_tensors, regions), None))
    except Exception:
        placed = False
    if placed:
        return out
    del regions  # the views die before today's path runs (the slot may have to grow for it)
    return collate_in_plain_memory(default_collate, data)


# --------------------------------------------------------------------------- fetch and pin


def _identity(data: Any) -> Any:
    return data


def fetch(dataset: Any, indices: Any, auto_collation: bool) -> Any:
    """What torch's map-style fetcher reads for one batch, before collate.

    ``dataset.__getitems__(indices)`` when the dataset has it, else ``[dataset[i] for i in
    indices]``; one sample ``dataset[index]`` without auto-collation (``batch_size=None``).

    Example:
        >>> fetch([10, 11, 12], [2, 0], True), fetch([10, 11, 12], 1, False)
        ([12, 10], 11)
    """
    return _MapDatasetFetcher(dataset, auto_collation, _identity, False).fetch(indices)


def pin(batch: Any, device: str) -> Any:
    """torch's ``pin_memory`` of a (nested) batch for ``device``."""
    return _pin_memory(batch, device)


def pin_device(pin_memory: bool, pin_memory_device: str) -> Optional[str]:
    """The device to pin batches for, or ``None``; warns like torch's iterator does.

    Example:
        >>> pin_device(False, "") is None
        True
    """
    if not pin_memory:
        return None
    if pin_memory_device:
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the "
                      f"device,ignore pin_memory_device='{pin_memory_device}'.", stacklevel=3)
    if not torch.accelerator.is_available():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device "
                      "pinned memory won't be used.", stacklevel=3)
        return None
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type == "mps":
        return None
    return acc.type


# --------------------------------------------------------------------------- torch's words


def worker_error(*, timed_out: bool, timeout: float, batch: str, worker_id: Optional[int],
                 pid: Optional[int], exitcode: Optional[int], doing: str, detail: str) -> RuntimeError:
    """torch's message for a timeout or a dead worker (code matches on it), then seqloader's details
    (``batch``: the batch waited for, in words).

    Example:
        >>> str(worker_error(timed_out=True, timeout=5, batch="batch 3", worker_id=1, pid=42, exitcode=None,
        ...                  doing="", detail=""))
        'DataLoader timed out after 5 seconds; seqloader: waiting for batch 3 from worker 1 (pid 42)'
        >>> str(worker_error(timed_out=False, timeout=0, batch="batch 3", worker_id=1, pid=42, exitcode=-9,
        ...                  doing="while producing batch 3", detail="...")).split(". ")[0]
        'DataLoader worker (pid 42) is killed by signal: Killed'
    """
    if timed_out:
        who = "" if worker_id is None else f" from worker {worker_id}" + (f" (pid {pid})" if pid is not None else "")
        return RuntimeError(f"DataLoader timed out after {timeout} seconds; seqloader: waiting for "
                            f"{batch}{who}")
    return RuntimeError(f"{_death_head(pid, exitcode)}seqloader: worker {worker_id} (pid {pid}) died {doing} "
                        f"({detail})")


def _death_head(pid: Optional[int], exitcode: Optional[int]) -> str:
    """torch's first sentence for a dead worker."""
    if exitcode is not None and exitcode < 0:
        name = signal.strsignal(-exitcode) or f"signal {-exitcode}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly. "


def poison_error(*, what: str, worker_id: Optional[int], pid: Optional[int], exitcode: Optional[int],
                 detail: str) -> RuntimeError:
    """A batch that killed a worker and its replacement (``max_worker_restarts``): torch's first
    sentence for the last death, then the batch (``what``: its number and dataset indices).

    Example:
        >>> e = poison_error(what="batch 3 (dataset indices [6, 7])", worker_id=1, pid=42, exitcode=-9, detail="...")
        >>> str(e).split(". seqloader: ")[1].split(";")[0]
        'batch 3 (dataset indices [6, 7]) killed worker 1 twice (the worker, then its replacement, pid 42)'
    """
    return RuntimeError(f"{_death_head(pid, exitcode)}seqloader: {what} killed worker {worker_id} twice (the "
                        f"worker, then its replacement, pid {pid}); it is a poison batch and is not computed "
                        f"again: look at what its samples do (memory use, a crashing decoder) ({detail})")


def open_files_error(exc: OSError) -> RuntimeError:
    """torch's advice for running out of file descriptors (code matches on it), made true for
    seqloader's slots.

    Example:
        >>> "ulimit -n" in str(open_files_error(OSError(24, "Too many open files")))
        True
    """
    return RuntimeError(
        "Too many open files: every batch still referenced holds a shared-memory slot (one file "
        "descriptor in the reading process and one in its worker). Please increase the limit "
        "using `ulimit -n` in the shell, or keep copies (`batch.clone()`) instead of the batches; "
        "torch's `torch.multiprocessing.set_sharing_strategy('file_system')` does not apply to "
        f"seqloader's slots ({exc})")
