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


def check_sequences(op: str, seqs: Any, what: str = "an iterable of sequences") -> tuple[tuple[Any, ...], list[int]]:
    """``(seqs, lens)``: the sequences of ``seqs`` (an iterable, not a string) as a tuple, and their
    lengths, each checked by :func:`check_sequence` as ``seqs[k]``.

    Example:
        >>> check_sequences("collate", iter([[1, 2], "ab"]))
        (([1, 2], 'ab'), [2, 2])
        >>> check_sequences("collate", 5)
        Traceback (most recent call last):
        TypeError: collate: seqs must be an iterable of sequences (got int)
    """
    if isinstance(seqs, (str, bytes)) or not hasattr(seqs, "__iter__"):
        raise TypeError(f"{op}: seqs must be {what} (got {type(seqs).__name__})")
    seqs = tuple(seqs)
    return seqs, [check_sequence(op, f"seqs[{k}]", s) for k, s in enumerate(seqs)]


def read(seq: Sequence[T], i: int) -> T:
    """Item ``i`` (``0 <= i < len(seq)``) of ``seq``, skipping the bounds check of our own ops."""
    if isinstance(seq, LazySequence):
        lazy: LazySequence[T] = seq  # isinstance narrows to LazySequence[Any]
        return lazy._item(i)
    return seq[i]
