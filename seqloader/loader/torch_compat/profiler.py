"""L3, torch_compat: the span torch's profiler shows for each ``next()`` of a loader iterator.

torch's ``DataLoader`` iterators run every ``__next__`` inside
``record_function("enumerate(DataLoader)#<iterator class>.__next__")``, the span profiling users
look for first in a trace. seqloader's iterators open the same span, named the same way, but only
while torch's profiler runs: entering a ``record_function`` costs about 2-6 µs a batch with no
profiler, and asking whether one runs (``torch.autograd._profiler_enabled()``) about 0.1 µs.

Example:
    >>> import torch
    >>> from torch.profiler import profile
    >>> with profile() as prof:
    ...     with span("enumerate(DataLoader)#MapIterator.__next__"):
    ...         pass
    >>> [e.name for e in prof.events() if e.name.startswith("enumerate")]
    ['enumerate(DataLoader)#MapIterator.__next__']
    >>> isinstance(span("outside a profiler"), contextlib.nullcontext)   # no profiler: no span
    True
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

from torch._C._autograd import _profiler_enabled   # what torch.autograd._profiler_enabled is
from torch.autograd.profiler import record_function

__all__ = ["span", "span_name"]

_NO_SPAN = contextlib.nullcontext()


def span_name(iterator: object) -> str:
    """torch's name for the span of ``iterator``'s ``__next__``.

    Example:
        >>> class MapIterator: pass
        >>> span_name(MapIterator())
        'enumerate(DataLoader)#MapIterator.__next__'
    """
    return f"enumerate(DataLoader)#{type(iterator).__name__}.__next__"


def span(name: str) -> ContextManager[object]:
    """``record_function(name)`` while torch's profiler runs; otherwise a shared no-op context."""
    if _profiler_enabled():
        return record_function(name)
    return _NO_SPAN
