"""What an index is built from: the input's description, its items read window by window, lengths.

An index file is keyed by a description of the input pipeline: a digest of the one walk of it
(:func:`seqloader.sequences.describe.walk`), each stage answering for itself. Each object reached
adds, at its depth in the walk:

* a stage (``shuffle``, ``pack``, ``keep``, ...): its name and the parameters that decide its
  positions, and what changes its values (``smap``'s function, ``rng_map``'s seed, ``pad_id``):
  a predicate reads values, so they are part of what an index over them depends on;
* a data source (a stage that says it is one, e.g. ``seqloader.parquet``): its class, ``repr``
  and file paths (location), plus its ``fingerprint()`` (the files' sizes and contents) and its
  own pickled settings (content);
* a function (anywhere: a stage's values, a leaf) by its module and name (location), plus its
  bytecode, constants, defaults and closure (content): editing a lambda changes the content;
* an object the walk looks into (a user's Dataset class, a short list): its class;
* anything else (in-memory data: a long list of token arrays, an array) pickled as is.

A pipeline that does not pickle, or holds more than :data:`MAX_DESCRIBED` bytes of in-memory
data, has no description: its index is built in memory and not cached. What a description cannot
see: a function's globals or files it reads; change the function's name (or pass ``cache=False``)
when those change.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import pickle
import types
from typing import Any, Callable, Optional, Sequence

import numpy as np

from seqloader.errors import note_stage
from seqloader.sequences._util import fname, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Node, describe_stage, walk

__all__ = ["MAX_DESCRIBED", "callable_digest", "check_lengths", "describe", "read_items", "read_lengths"]

#: The most bytes of pickled pipeline hashed to describe an input (beyond: not cached).
MAX_DESCRIBED = 64 << 20


class _TooLarge(Exception):
    pass


class _Sink(io.RawIOBase):
    """A write-only stream that hashes what it is given and refuses more than ``limit`` bytes."""

    def __init__(self, limit: int):
        self.h, self.n, self.limit = hashlib.sha256(), 0, limit

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        m = memoryview(b).cast("B")
        self.n += m.nbytes
        if self.n > self.limit:
            raise _TooLarge
        self.h.update(m)
        return m.nbytes


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        h.update((_code_digest(c) if isinstance(c, types.CodeType) else repr(c)).encode())
    return h.hexdigest()[:32]


def callable_digest(f: Callable[..., Any]) -> str:
    """A digest of what a function computes: name, bytecode, constants, defaults and closure.

    Example:
        >>> callable_digest(lambda x: x > 1) == callable_digest(lambda x: x > 1)
        True
        >>> callable_digest(lambda x: x > 1) == callable_digest(lambda x: x > 2)
        False
        >>> callable_digest(len) == callable_digest(len) != callable_digest(abs)   # builtins: by name
        True
    """
    h = hashlib.sha256(f"{getattr(f, '__module__', '')}.{fname(f)}".encode())
    if isinstance(f, functools.partial):
        h.update(callable_digest(f.func).encode())
        h.update(_describe_any((f.args, f.keywords), True).encode())
    elif isinstance(f, types.FunctionType):
        h.update(_code_digest(f.__code__).encode())
        cells = tuple(c.cell_contents for c in f.__closure__ or ())
        h.update(_describe_any((f.__defaults__, f.__kwdefaults__, cells), True).encode())
    elif isinstance(f, types.MethodType):
        h.update(callable_digest(f.__func__).encode())
        h.update(_describe_any(f.__self__, True).encode())
    else:  # a builtin, a class, an object with __call__: its pickled form, as the root (else a
        # builtin is handed back to callable_digest by persistent_id, without end: RecursionError)
        h.update(_describe_any(f, True, root=f).encode())
    return h.hexdigest()[:32]


class _Describer(pickle.Pickler):
    def __init__(self, sink: _Sink, content: bool, root: Any, walked: bool = False):
        super().__init__(sink, protocol=5, buffer_callback=self._buffer)
        self._sink, self._content, self._root, self._walked = sink, content, root, walked

    def _buffer(self, buf: pickle.PickleBuffer) -> bool:
        self._sink.write(buf.raw())
        return False  # written: keep it out of band

    def persistent_id(self, obj: Any) -> Any:
        if obj is self._root or isinstance(obj, (int, float, str, bytes, bool, type(None), tuple, list, dict, type)):
            return None
        if isinstance(obj, _FUNCTIONS):
            return ("callable", _callable(obj, self._content))
        if self._walked and (isinstance(obj, LazySequence) or describe_stage(obj) is not None):
            return ("walked",)  # the walk describes it, in its place
        return None


_FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def _callable(f: Any, content: bool) -> str:
    return callable_digest(f) if content else f"{getattr(f, '__module__', '')}.{fname(f)}"


def _describe_any(obj: Any, content: bool, root: Any = None, sink: Optional[_Sink] = None,
                  walked: bool = False) -> str:
    sink = sink or _Sink(MAX_DESCRIBED)
    _Describer(sink, content, root, walked).dump(obj)
    return sink.h.hexdigest()[:32]


def _value(obj: Any, content: bool, sink: _Sink) -> None:
    """A leaf or a stage's value into ``sink``: a function by its digest, anything else pickled."""
    if isinstance(obj, _FUNCTIONS):
        sink.write(_callable(obj, content).encode())
    else:
        _describe_any(obj, content, root=obj if _is_callable_object(obj) else None, sink=sink)


def _is_callable_object(obj: Any) -> bool:
    return callable(obj) and not isinstance(obj, type)


def _node(node: Node, content: bool, sink: _Sink) -> None:
    stage, obj = node.stage, node.obj
    sink.write(f"|{node.depth}|".encode())
    if stage is not None and stage.source:
        paths = list(obj.paths()) if callable(getattr(obj, "paths", None)) else [f[0] for f in obj.files()]
        sink.write(json.dumps(["source", type(obj).__qualname__, repr(obj), paths if not content else
                               obj.fingerprint()], default=repr).encode())
        if content:
            _describe_any(obj, True, root=obj, sink=sink)
    elif stage is not None:
        sink.write(json.dumps([stage.name, stage.params], sort_keys=True, default=repr).encode())
        for v in stage.values:
            _value(v, content, sink)
    elif node.entered and isinstance(obj, (list, tuple, dict)):
        sink.write(f"{type(obj).__name__}:{len(obj)}".encode())
    elif node.entered:  # a user's object: its own pickled form, what the walk describes left out
        _describe_any(obj, content, root=obj, sink=sink, walked=True)
    else:
        _value(obj, content, sink)


def describe(seq: Any, content: bool) -> tuple[Optional[str], str]:
    """``(digest, "")`` describing ``seq``'s location (``content=False``) or content, or
    ``(None, why)`` when it cannot be described (see the module docstring).

    Example:
        >>> describe(range(10), content=True)[0] == describe(range(10), content=True)[0]
        True
        >>> import threading
        >>> describe([threading.Lock()], content=True)
        (None, "the input cannot be described (TypeError: cannot pickle '_thread.lock' object)")
    """
    sink = _Sink(MAX_DESCRIBED)
    try:
        for node in walk(seq):
            _node(node, content, sink)
        return sink.h.hexdigest()[:32], ""
    except _TooLarge:
        return None, f"the input holds more than {MAX_DESCRIBED >> 20} MiB of in-memory data"
    except Exception as exc:  # whatever pickling raises: the pipeline is not describable
        return None, f"the input cannot be described ({type(exc).__name__}: {exc})"


def read_items(stage: Any, seq: Any, start: int, stop: int) -> list[Any]:
    """Items ``start .. stop - 1`` of ``seq``: one ``__getitems__`` call when ``seq`` has it."""
    getitems = getattr(seq, "__getitems__", None)
    if getitems:
        items = getitems(list(range(start, stop)))
        if not isinstance(items, list) or len(items) != stop - start:
            raise TypeError(f"{stage!r}: the input's __getitems__ returned {type(items).__name__}, not a list of "
                            f"{stop - start} items (a columnar source? read it with columnar=False)")
        return items
    return [read(seq, i) for i in range(start, stop)]


def read_lengths(stage: Any, seq: Sequence[Any], window: int) -> np.ndarray:
    """``len(seq[i])`` for every item, read a window at a time (the costly way to get lengths)."""
    n = len(seq)
    out = np.empty(n, dtype=np.int64)
    for a in range(0, n, window):
        for k, item in enumerate(read_items(stage, seq, a, min(n, a + window))):
            try:
                out[a + k] = len(item)
            except TypeError as exc:
                note_stage(exc, stage, a + k)
                raise
    return out


def check_lengths(op: str, lengths: Any, n: int, window: int) -> np.ndarray:
    """``lengths`` as a read-only int32 array (int64 when a length needs it) of ``n`` entries >= 0.

    ``lengths`` is an array-like of ints, a sequence of ints (a lazy one is read a window at a
    time) or a callable ``lengths(start, stop)`` returning the lengths of items ``start .. stop - 1``.

    Raises:
        TypeError: not ints.
        ValueError: not 1-D, not ``n`` entries, or a negative entry (named).

    Example:
        >>> check_lengths("pack", [3, 0, 5], 3, 2).tolist()
        [3, 0, 5]
        >>> check_lengths("pack", lambda a, b: range(a, b), 3, 2).tolist()
        [0, 1, 2]
        >>> check_lengths("pack", [3, -1], 2, 2)
        Traceback (most recent call last):
        ValueError: pack: lengths[1] is -1; lengths must be >= 0
    """
    if callable(lengths) and not hasattr(lengths, "__len__"):
        parts = [np.asarray(lengths(a, min(n, a + window))) for a in range(0, n, window)]
        for a, p in zip(range(0, n, window), parts):
            if p.shape != (min(n, a + window) - a,):
                raise ValueError(f"{op}: lengths({a}, {min(n, a + window)}) returned shape {p.shape}; expected "
                                 f"({min(n, a + window) - a},)")
        arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    elif isinstance(lengths, (np.ndarray, list, tuple, range)):
        arr = np.asarray(lengths)
    elif hasattr(lengths, "__len__") and hasattr(lengths, "__getitem__"):
        k = len(lengths)
        arr = np.array([x for a in range(0, k, window) for x in read_items(op, lengths, a, min(k, a + window))])
    else:
        raise TypeError(f"{op}: lengths must be an array of ints, a sequence of ints or a callable (start, stop) -> "
                        f"ints (got {type(lengths).__name__})")
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{op}: lengths must be 1-D (got shape {arr.shape})")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: lengths must be ints (got dtype {arr.dtype})")
    if arr.size != n:
        raise ValueError(f"{op}: lengths has {arr.size} entries but the input has {n} items; give one length per item")
    if arr.size and arr.dtype.kind == "i" and arr.min() < 0:
        k = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"{op}: lengths[{k}] is {int(arr[k])}; lengths must be >= 0")
    big = not np.can_cast(arr.dtype, np.int32) and bool(arr.size) and int(arr.max()) >= 2**31
    out = np.ascontiguousarray(arr, dtype=np.int64 if big else np.int32)
    out.setflags(write=False)
    return out
