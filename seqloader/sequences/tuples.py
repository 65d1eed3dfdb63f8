"""Ops on tuples of items: :func:`collate` (a lazy ``zip``) and :func:`starmap` (``f(*item)``).

seqtools' names. ``collate(seqs)`` is ``smap(lambda *xs: xs, *seqs)`` and ``starmap(f, seq)`` is
``smap(lambda x: f(*x), seq)``, written as ops of their own so that they pickle (no lambda of
ours) and name themselves in errors.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Sequence, TypeVar

from seqloader.errors import annotate
from seqloader.sequences._util import check_callable, check_sequence, check_sequences, fname, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage

__all__ = ["collate", "starmap"]

R = TypeVar("R")


class _Collate(LazySequence[tuple[Any, ...]]):
    def __init__(self, seqs: Iterable[Sequence[Any]]):
        seqs, lens = check_sequences("collate", seqs)
        if not seqs:
            raise ValueError("collate: seqs must hold at least one sequence (got none)")
        if any(n != lens[0] for n in lens):
            raise ValueError(f"collate: sequences must have equal lengths (got {', '.join(map(str, lens))})")
        self._seqs = seqs
        self._len = lens[0]


    def _position_stage(self) -> Stage:
        return Stage("collate", {}, tuple(self._seqs))

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> tuple[Any, ...]:
        return tuple(read(s, i) for s in self._seqs)

    def __repr__(self) -> str:
        return f"collate({len(self._seqs)} seqs, len={self._len})"


def collate(seqs: Iterable[Sequence[Any]]) -> LazySequence[tuple[Any, ...]]:
    """Zip sequences of equal length: item ``i`` is ``tuple(s[i] for s in seqs)``.

    seqtools' ``collate`` (a lazy ``zip(*seqs)``; not torch's ``collate_fn``, which stacks the
    items of a batch: that is :func:`seqloader.batch`'s ``collate_fn``).

    Args:
        seqs: an iterable of one or more sequences, all of the same length.

    Returns:
        A lazy sequence of tuples, as long as each sequence.

    Raises:
        TypeError: ``seqs`` is not an iterable of sequences.
        ValueError: ``seqs`` is empty, or the lengths differ.

    Example:
        >>> c = collate([[1, 2, 3], "abc"])
        >>> list(c), c[-1]
        ([(1, 'a'), (2, 'b'), (3, 'c')], (3, 'c'))
        >>> collate([[1, 2], []])
        Traceback (most recent call last):
        ValueError: collate: sequences must have equal lengths (got 2, 0)
    """
    return _Collate(seqs)


class _Starmap(LazySequence[R]):
    def __init__(self, f: Callable[..., R], seq: Sequence[Any]):
        check_callable("starmap", "f", f)
        self._len = check_sequence("starmap", "seq", seq)
        if self._len > sys.maxsize:  # pragma: no cover - len() itself stops there
            raise ValueError("starmap: len(seq) must be < 2**63")
        self._f = f
        self._seq = seq


    def _position_stage(self) -> Stage:
        return Stage("starmap", {}, (self._seq,), values=(self._f,))  # the function changes values only

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> R:
        args = read(self._seq, i)
        with annotate(self, i):
            return self._f(*args)

    def __repr__(self) -> str:
        return f"starmap({fname(self._f)}, len={self._len})"


def starmap(f: Callable[..., R], seq: Sequence[Any]) -> LazySequence[R]:
    """Lazily map ``f`` over tuples of arguments: item ``i`` is ``f(*seq[i])``.

    The lazy, indexable ``itertools.starmap`` (seqtools' ``starmap``); ``starmap(f, collate(seqs))``
    is ``smap(f, *seqs)``.

    Args:
        f: a callable; for ``spawn`` workers it must be picklable (a module-level function).
        seq: a sequence whose items are argument tuples (any iterable item is unpacked).

    Returns:
        A lazy sequence of ``len(seq)`` items.

    Raises:
        TypeError: ``f`` is not callable or ``seq`` is not a sequence.

    An exception raised by ``f``, or by unpacking an item into its arguments, keeps its type and
    message and gains a note ``seqloader: raised in starmap(f, len=n) at item i``.

    Example:
        >>> s = starmap(pow, [(2, 3), (3, 2), (10, 0)])
        >>> list(s), s[-1], len(starmap(pow, []))
        ([8, 9, 1], 1, 0)
        >>> starmap(pow, [(2, 3)])[1]
        Traceback (most recent call last):
        IndexError: starmap(pow, len=1): index 1 out of range [-1, 1)
    """
    return _Starmap(f, seq)
