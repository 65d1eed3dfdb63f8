"""The wire: how items, sequences and the shared object travel from seqloader's code to a worker
and back, written once for every executor whose workers are processes (worker processes over
shared memory, :mod:`seqloader.prefetcher.processes`; Ray actors, :mod:`seqloader.prefetcher.ray_actor`).

* **Values** are pickled with protocol 5 (:func:`encode`): numpy arrays, and plain dense CPU
  tensors (:func:`is_plain_tensor`, :func:`reduce_tensor`), travel as out-of-band buffers, which
  each executor places where its reader finds them (a shared-memory slot; Ray's object store).
  Pickling and placing a result is the stage :data:`TRANSFER` when stages are timed.
* **Sequences and set-ups** are pickled with the **shared object** (typically the dataset, sent to
  each worker once, at start) referred to by a persistent id (:func:`dumps_with_shared`,
  :func:`loads_with_shared`), so a later sequence that references it costs a reference, not a copy.
* **Slot writers.** A worker calls ``seq.slot_item(index)`` (:data:`SLOT_ITEM`) instead of
  ``seq[index]`` when the sequence has it; a worker process lets the value it returns be a
  :class:`SlotWriter`, which writes its buffers straight into the job's shared-memory slot
  (the protocol: :mod:`seqloader.prefetcher.processes.payload`).
* Every shared-memory segment seqloader creates is named ``/dev/shm/<SHM_PREFIX><pid>_<random>``
  (:data:`SHM_PREFIX`; leak checks look for it).

This module imports neither torch nor ``ray``: a tensor can only exist where torch was imported,
so tensors are recognised through ``sys.modules``.
"""

from __future__ import annotations

import functools
import io
import pickle
import sys
from typing import Any, Callable, Optional, Sequence

__all__ = ["SHARED_PID", "SHM_PREFIX", "SLOT_ITEM", "TRANSFER", "SlotWriter", "dumps_with_shared", "encode",
           "is_plain_tensor", "loads_with_shared", "reduce_tensor"]

#: Every shared-memory segment seqloader creates starts with this (``tests/conftest.py`` checks for leaks).
SHM_PREFIX = "seqloader_"

#: The stage name of pickling a result and placing it for the reader (when stages are timed).
TRANSFER = "transfer"

#: The method a worker calls instead of ``seq[index]`` when the sequence has it: in a worker
#: process it may return a :class:`SlotWriter`.
SLOT_ITEM = "slot_item"

#: The persistent id of the shared object in a pickled sequence or set-up.
SHARED_PID = "seqloader.shared"


# --------------------------------------------------------------------------- values


@functools.lru_cache(maxsize=None)
def _numpy_dtype(dtype: Any) -> Any:
    """numpy's dtype of torch's ``dtype`` where ``torch.from_numpy`` maps it back, else ``None``."""
    import numpy as np
    import torch

    try:
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):   # bfloat16, the float8s, the quantized ones: no numpy dtype
        return None
    return np_dtype if torch.from_numpy(np.empty(0, np_dtype)).dtype == dtype else None


def _rebuild_tensor(buf: Any, dtype: Any, shape: tuple, requires_grad: bool) -> Any:
    import torch  # a tensor was pickled: its reader has torch

    np_dtype = _numpy_dtype(dtype)
    if len(buf) == 0:
        t = torch.empty(shape, dtype=dtype)
    elif np_dtype is not None:   # (one numpy view: a third of torch.frombuffer's .view().view())
        import numpy as np

        t = torch.from_numpy(np.frombuffer(buf, dtype=np_dtype).reshape(shape))
    else:
        t = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)
    return t.requires_grad_(requires_grad) if requires_grad else t


def is_plain_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a plain dense CPU tensor, whose storage can be an out-of-band buffer.

    Exactly ``torch.Tensor`` (no subclass: ``Parameter``, tensor wrappers), strided layout (not
    sparse), neither nested nor quantized, on the CPU, without Python attributes. Every other
    tensor is pickled by torch's own reduction, *in band* (its parts that are plain tensors, such
    as a sparse tensor's indices and values, still travel out of band).

    Example:
        >>> import torch
        >>> is_plain_tensor(torch.ones(2, 3).t()), is_plain_tensor(torch.ones(2).to_sparse())
        (True, False)
        >>> is_plain_tensor(torch.nn.Parameter(torch.ones(2))), is_plain_tensor(torch.ones(2, device="meta"))
        (False, False)
    """
    torch = sys.modules.get("torch")
    return (torch is not None and type(obj) is torch.Tensor and obj.layout is torch.strided
            and obj.device.type == "cpu" and not obj.is_nested and not obj.is_quantized and not obj.__dict__)


def reduce_tensor(obj: Any) -> Any:
    """A pickler's ``reducer_override`` for plain CPU tensors: their bytes as one out-of-band buffer
    (protocol 5); ``NotImplemented`` for anything else (the pickler's own reduction)."""
    if is_plain_tensor(obj):
        import torch

        t = obj.detach().resolve_conj().resolve_neg().contiguous()
        # (a dtype numpy has: its own numpy view, one call; else its bytes, viewed as uint8)
        raw = t.numpy() if _numpy_dtype(t.dtype) is not None else t.reshape(-1).view(torch.uint8).numpy()
        return _rebuild_tensor, (pickle.PickleBuffer(raw), t.dtype, tuple(t.shape), obj.requires_grad)
    return NotImplemented


class _TensorsOutOfBand:
    """A pickler mix-in: plain CPU tensors by :func:`reduce_tensor`, everything else as the base
    pickler reduces it."""

    def reducer_override(self, obj: Any) -> Any:
        reduced = reduce_tensor(obj)
        if reduced is NotImplemented:
            base = getattr(super(), "reducer_override", None)
            return NotImplemented if base is None else base(obj)
        return reduced


class _Pickler(_TensorsOutOfBand, pickle.Pickler):
    """Protocol-5 pickler that sends plain CPU tensors out of band (numpy arrays already are)."""


def encode(value: Any) -> tuple[memoryview, list]:
    """Pickle ``value`` (protocol 5): the in-band bytes and the raw out-of-band buffers.

    Raises:
        Exception: whatever pickling ``value`` raises (the caller reports it as the item's error).

    Example:
        >>> import numpy as np, threading
        >>> data, raws = encode({"x": np.arange(4, dtype=np.int64), "n": 3})
        >>> [r.nbytes for r in raws], pickle.loads(data, buffers=raws)["x"].tolist()
        ([32], [0, 1, 2, 3])
        >>> encode(threading.Lock())  # an edge case: not picklable
        Traceback (most recent call last):
        TypeError: cannot pickle '_thread.lock' object
    """
    buffers: list = []
    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=buffers.append).dump(value)
    return f.getbuffer(), [b.raw() for b in buffers]


# --------------------------------------------------------------------------- the shared object


@functools.lru_cache(maxsize=None)
def _shared_pickler(base: type, tensors: bool) -> type:
    """A subclass of the pickler ``base`` that refers to the shared object by :data:`SHARED_PID`
    (with ``tensors``: and reduces plain CPU tensors by :func:`reduce_tensor`)."""

    class SharedPickler(*((_TensorsOutOfBand, base) if tensors else (base,))):  # type: ignore[misc]
        def __init__(self, file: Any, shared: Any, buffers: Optional[list]):
            super().__init__(file, protocol=5, buffer_callback=None if buffers is None else buffers.append)
            self._shared = shared

        def persistent_id(self, obj: Any) -> Optional[str]:
            return SHARED_PID if obj is self._shared and obj is not None else None

    return SharedPickler


def dumps_with_shared(obj: Any, shared: Any, buffers: Optional[list] = None, *, pickler: type = pickle.Pickler,
                      tensors: bool = False) -> bytes:
    """``obj`` pickled with protocol 5, ``shared`` (sent to each worker once) referred to by id.

    Args:
        obj: a sequence, a set-up: what a worker unpickles with :func:`loads_with_shared`.
        shared: the object to refer to (``None``: none).
        buffers: where out-of-band buffers go (``None``: in band).
        pickler: the pickler class to extend (``pickle.Pickler``; Ray's ``CloudPickler``, so that
            lambdas travel, as Ray users expect).
        tensors: reduce plain CPU tensors by :func:`reduce_tensor` (else by torch's own reduction).

    Raises:
        Exception: whatever pickling ``obj`` raises.

    Example:
        >>> dataset = list(range(1000))
        >>> blob = dumps_with_shared({"data": dataset, "k": 2}, shared=dataset)
        >>> len(blob) < 100, loads_with_shared(blob, dataset)["data"] is dataset
        (True, True)
        >>> loads_with_shared(blob, shared=None)["data"] is None  # an edge case: the worker holds no shared object
        True
    """
    f = io.BytesIO()
    _shared_pickler(pickler, tensors)(f, shared, buffers).dump(obj)
    return f.getvalue()


class _SharedUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, shared: Any):
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid: Any) -> Any:
        if pid == SHARED_PID:
            return self._shared
        raise pickle.UnpicklingError(f"prefetch: unknown persistent id {pid!r}")  # pragma: no cover


def loads_with_shared(blob: bytes, shared: Any) -> Any:
    """Inverse of :func:`dumps_with_shared` in a worker holding ``shared``.

    Example:
        >>> loads_with_shared(pickle.dumps([1, 2]), shared=None)  # plain pickles load too
        [1, 2]
    """
    return _SharedUnpickler(io.BytesIO(blob), shared).load()


# --------------------------------------------------------------------------- slot writers


class SlotWriter:
    """A value that writes itself into its job's shared-memory slot (the protocol:
    :mod:`seqloader.prefetcher.processes.payload`).

    Subclasses implement :meth:`write_into_slot`; a worker process calls it right after
    ``seq.slot_item(index)`` returned the writer, in the same thread, before anything else is computed.

    Example:
        >>> class Ones(SlotWriter):
        ...     def write_into_slot(self, reserve):
        ...         (region,) = reserve([3])
        ...         region[:] = b"\\x01" * 3
        ...         return bytes(region)
        >>> Ones().write_into_slot(lambda sizes: [memoryview(bytearray(n)) for n in sizes])
        b'\\x01\\x01\\x01'
        >>> SlotWriter().write_into_slot(lambda sizes: [])  # an edge case: the base class writes nothing
        Traceback (most recent call last):
        NotImplementedError
    """

    __slots__ = ()

    def write_into_slot(self, reserve: Callable[[Sequence[int]], list[memoryview]]) -> Any:
        """Write into regions from ``reserve(sizes)`` (call it at most once); return the value to send."""
        raise NotImplementedError
