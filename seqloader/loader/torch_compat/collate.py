"""L3, torch_compat: torch's collate functions run in plain memory or straight into a worker's
slot, and torch's map-style fetch (the package docstring says why)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, default_convert, get_worker_info
from torch.utils.data._utils import collate as _collate
from torch.utils.data._utils.fetch import _MapDatasetFetcher
from seqloader.loader.torch_compat.worker_info import worker_info_hidden

#: torch's default collate functions: the ones that stack into shared memory inside a worker.
TORCH_COLLATES = (default_collate, default_convert)



def collate_in_plain_memory(collate_fn: Callable[[Any], Any], data: Any) -> Any:
    """``collate_fn(data)``; torch's own collate functions run with the worker info hidden.

    Inside a worker, torch's ``default_collate`` stacks tensors into a fresh shared-memory segment
    per batch (for torch's transport). seqloader's workers copy results into reused slots, so
    the same values in ordinary memory are much cheaper. A user's ``collate_fn`` sees the info.
    ``default_convert`` of a dict of numeric numpy arrays (a columnar source's batch) is computed
    directly: the same dict of ``torch.as_tensor`` views, without its recursion per value.

    Example:
        >>> collate_in_plain_memory(default_collate, [1, 2]).tolist()
        [1, 2]
        >>> collate_in_plain_memory(default_convert, {"x": np.arange(3), "s": np.array(["a"])})
        {'x': tensor([0, 1, 2]), 's': array(['a'], dtype='<U1')}
    """
    if collate_fn is default_convert and type(data) is dict and all(
            type(v) is np.ndarray and v.dtype.kind not in "SUO" for v in data.values()):
        return {k: torch.as_tensor(v) for k, v in data.items()}   # (default_convert's result, its checks once)
    if collate_fn is default_collate and type(data) is list and data and type(data[0]) in _NUMBER_DTYPES:
        out = _numbers(data)
        if out is not None:
            return out
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


def _map_changed() -> bool:
    """Whether ``default_collate_fn_map`` is not torch's own (then only torch's collate runs)."""
    return _PRISTINE is None or _collate.default_collate_fn_map != _PRISTINE


#: the dtype numpy gives a list of Python ints or floats that torch's ``default_collate`` gives too
_NUMBER_DTYPES = {int: np.dtype(np.int64), float: np.dtype(np.float64)}


def _numbers(data: list) -> Optional[torch.Tensor]:
    """``default_collate`` of a batch whose first sample is a Python ``int`` or ``float``: torch's
    ``torch.tensor(data)`` (``dtype=torch.float64`` for floats) through one ``numpy.array`` (8.9 µs
    rather than 36 µs for 256 ints); ``None`` where numpy's array would not be torch's tensor (a
    mix numpy promotes otherwise, an int past int64, nested lists, a changed collate map).

    Example:
        >>> _numbers([3, True, 2]), _numbers([1.5, 2]), _numbers([1, 2.5]), _numbers([1, 2**63])
        (tensor([3, 1, 2]), tensor([1.5000, 2.0000], dtype=torch.float64), None, None)
    """
    if _map_changed():
        return None
    try:
        array = np.array(data)
    except (ValueError, TypeError, OverflowError):
        return None   # (torch's own collate raises its error)
    if array.dtype != _NUMBER_DTYPES[type(data[0])] or array.shape != (len(data),):
        return None
    return torch.tensor(array)   # a copy: a tensor of its own resizable storage, as torch.tensor(list)


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
    if _map_changed():
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


def fetcher(dataset: Any, auto_collation: bool) -> Callable[[Any], Any]:
    """:func:`fetch` of ``dataset`` as one callable of the indices, made once for many batches
    (torch's fetcher object is then built once, not per batch: ~1.5 µs a batch).

    Example:
        >>> read = fetcher([10, 11, 12], True)
        >>> read([2, 0]), read([1])
        ([12, 10], [11])
    """
    return _MapDatasetFetcher(dataset, auto_collation, _identity, False).fetch
