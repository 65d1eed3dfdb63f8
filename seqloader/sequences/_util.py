"""Private helpers shared by the sequence ops (argument checks, fast item reads)."""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Sequence, TypeVar

from seqloader.sequences.base import LazySequence

T = TypeVar("T")


def fname(f: Callable[..., object]) -> str:
    """A short name for a user function, used in ``repr`` and error notes."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
    return name.rsplit("<locals>.", 1)[-1]


def check_callable(op: str, arg: str, f: Any, allow_none: bool = False) -> None:
    if f is None and allow_none:
        return
    if not callable(f):
        raise TypeError(f"{op}: {arg} must be callable (got {type(f).__name__} {f!r})")


def check_bool(op: str, arg: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {arg} must be a bool (got {type(value).__name__} {value!r})")
    return value


def check_sequence(op: str, arg: str, seq: Any) -> int:
    """Return ``len(seq)``, or raise ``TypeError`` if ``seq`` is not an indexable, sized sequence."""
    if (not (hasattr(seq, "__len__") and hasattr(seq, "__getitem__"))
            or isinstance(seq, collections.abc.Mapping)):
        raise TypeError(f"{op}: {arg} must be a sequence with __len__ and __getitem__ "
                        f"(got {type(seq).__name__})")
    return len(seq)


def read(seq: Sequence[T], i: int) -> T:
    """Item ``i`` (``0 <= i < len(seq)``) of ``seq``, skipping the bounds check of our own ops."""
    if isinstance(seq, LazySequence):
        lazy: LazySequence[T] = seq  # isinstance narrows to LazySequence[Any]
        return lazy._item(i)
    return seq[i]
