"""Ops that reorder or combine items: :func:`gather`, :func:`shuffle`, :func:`concatenate`, :func:`repeat`.

``gather``, ``shuffle`` and ``repeat`` only remap positions, so they are :class:`IndexMap` s with a
vectorised ``_source_indices``; ``concatenate`` has several parents and finds an item's part by
bisection over their cumulative lengths.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import sys
from typing import Any, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from seqloader.errors import check_nonnegative_int
from seqloader.orders.permutation import FeistelPermutation
from seqloader.rng import check_seed
from seqloader.sequences._util import check_sequence, check_sequences, read
from seqloader.sequences.base import IndexMap, LazySequence, Positions
from seqloader.sequences.describe import Stage, digest

__all__ = ["gather", "shuffle", "concatenate", "repeat"]

T = TypeVar("T")


def _as_indices(indices: Any, n: int) -> Positions:
    """Validate ``indices`` against a parent of length ``n``; return them normalised, as int64."""
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__len__") and not isinstance(indices, np.ndarray):
        raise TypeError(f"gather: indices must be a 1-D array-like of ints (got {type(indices).__name__})")
    a = np.asarray(indices)
    if a.ndim != 1:
        raise ValueError(f"gather: indices must be 1-D (got shape {a.shape})")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind == "O":  # e.g. Python ints beyond int64: check one by one
        for k, v in enumerate(a.tolist()):
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TypeError(f"gather: indices must be ints (indices[{k}] is {type(v).__name__} {v!r})")
            v = operator.index(v)
            if not -n <= v < n:
                raise IndexError(f"gather: indices[{k}] = {v} out of range [-{n}, {n}) of the input")
        a = np.array([operator.index(v) for v in a.tolist()], dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"gather: indices must be ints (got dtype {a.dtype})")
    bad = np.flatnonzero((a < -n) | (a >= n)) if a.dtype.kind == "i" else np.flatnonzero(a >= n)
    if bad.size:
        k = int(bad[0])
        raise IndexError(f"gather: indices[{k}] = {a[k]} out of range [-{n}, {n}) of the input")
    a = a.astype(np.int64)
    return np.where(a < 0, a + n, a)


class _Gather(IndexMap[T]):
    _indices: Positions  # read-only int64 positions of the parent

    def __init__(self, seq: Sequence[T], indices: Any):
        n = check_sequence("gather", "seq", seq)
        idx = _as_indices(indices, n)
        if isinstance(seq, _Gather):  # gather of gather folds into one
            idx = seq._indices[idx]
            seq = seq._parent
        idx.setflags(write=False)
        self._parent = seq
        self._indices = idx


    def _position_stage(self) -> Stage:
        return Stage("gather", {"len": len(self._indices), "indices": digest(self._indices.tobytes(), 12)},
                     (self._parent,))

    def __len__(self) -> int:
        return len(self._indices)

    def _source_index(self, i: int) -> int:
        return int(self._indices[i])

    def _source_indices(self, idx: Positions) -> Positions:
        return self._indices[idx]

    def __repr__(self) -> str:
        return f"gather(len={len(self._indices)})"


def gather(seq: Sequence[T], indices: Any) -> LazySequence[T]:
    """The items of ``seq`` at ``indices``, in that order: item ``k`` is ``seq[indices[k]]``.

    Indices are checked once, here; negative ones count from the end, as for lists. A gather of
    a gather folds into one.

    Args:
        seq: the input sequence.
        indices: a 1-D array-like of ints in ``[-len(seq), len(seq))``; repeats are allowed.

    Returns:
        A lazy sequence of ``len(indices)`` items.

    Raises:
        TypeError: ``seq`` is not a sequence or ``indices`` are not ints.
        ValueError: ``indices`` is not 1-D.
        IndexError: an index is out of range; the message names its position in ``indices``.

    Example:
        >>> g = gather(list("abcde"), [4, 0, -1])
        >>> list(g), g[1]
        (['e', 'a', 'e'], 'a')
        >>> gather(range(3), [0, 3])
        Traceback (most recent call last):
        IndexError: gather: indices[1] = 3 out of range [-3, 3) of the input
    """
    return _Gather(seq, indices)


class _Shuffle(IndexMap[T]):
    def __init__(self, seq: Sequence[T], seed: int):
        n = check_sequence("shuffle", "seq", seq)
        self._seed = check_seed("shuffle", seed)
        self._parent = seq
        self._perm = FeistelPermutation(n, self._seed)


    def _position_stage(self) -> Stage:
        return Stage("shuffle", {"seed": self._seed}, (self._parent,))

    def __len__(self) -> int:
        return len(self._perm)

    def _source_index(self, i: int) -> int:
        return self._perm.index(i)

    def _source_indices(self, idx: Positions) -> Positions:
        return self._perm(idx).view(np.int64)

    def __repr__(self) -> str:
        return f"shuffle(len={len(self._perm)}, seed={self._seed})"


def shuffle(seq: Sequence[T], seed: int) -> LazySequence[T]:
    """A pseudo-random permutation of ``seq`` determined by ``(len(seq), seed)``, in O(1) memory.

    Item ``i`` is ``seq[p(i)]`` with ``p`` a keyed Feistel permutation
    (:class:`seqloader.orders.permutation.FeistelPermutation`); any item of any epoch is computed directly,
    so ``shuffle(range(10**9), seed)[i]`` allocates nothing. The loader passes
    ``derive_seed(user_seed, "shuffle", epoch)`` as ``seed``.

    Args:
        seq: the input sequence.
        seed: an int in ``[0, 2**64)``.

    Returns:
        A lazy sequence of ``len(seq)`` items.

    Raises:
        TypeError: ``seq`` is not a sequence or ``seed`` is not an int.
        ValueError: ``seed`` is outside ``[0, 2**64)``.

    Example:
        >>> s = shuffle(range(10), seed=0)
        >>> sorted(s) == list(range(10))
        True
        >>> list(shuffle([], seed=0))
        []
        >>> shuffle(range(10), seed=0)[10]
        Traceback (most recent call last):
        IndexError: shuffle(len=10, seed=0): index 10 out of range [-10, 10)
    """
    return _Shuffle(seq, seed)


class _Concatenate(LazySequence[T]):
    def __init__(self, seqs: Iterable[Sequence[T]]):
        parts, lens = check_sequences("concatenate", seqs)
        total = sum(lens)
        if total > sys.maxsize:
            raise ValueError(f"concatenate: the total length must be < 2**63 (got {total})")
        self._seqs: tuple[Sequence[T], ...] = parts
        self._ends = list(itertools.accumulate(len(s) for s in self._seqs))  # end of each part
        self._len = total


    def _position_stage(self) -> Stage:
        return Stage("concatenate", {"lengths": [len(s) for s in self._seqs]}, self._seqs)

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> T:
        k = bisect.bisect_right(self._ends, i)       # the first part ending after i
        start = self._ends[k - 1] if k else 0
        return read(self._seqs[k], i - start)

    def __iter__(self) -> Iterator[T]:
        for s in self._seqs:
            yield from s

    def __repr__(self) -> str:
        return f"concatenate({len(self._seqs)} seqs, len={self._len})"


def concatenate(seqs: Iterable[Sequence[T]]) -> LazySequence[T]:
    """The items of each sequence in ``seqs``, one sequence after the other.

    Args:
        seqs: an iterable of sequences (possibly empty, possibly containing empty sequences).

    Returns:
        A lazy sequence of ``sum(len(s) for s in seqs)`` items.

    Raises:
        TypeError: ``seqs`` is not an iterable or one of its elements is not a sequence.
        ValueError: the total length is ``2**63`` or more.

    Example:
        >>> c = concatenate([[0, 1], [], range(2, 5)])
        >>> len(c), c[2], c[-1], list(c[::2])
        (5, 2, 4, [0, 2, 4])
        >>> len(concatenate([]))
        0
    """
    return _Concatenate(seqs)


class _Repeat(IndexMap[T]):
    def __init__(self, seq: Sequence[T], times: int):
        n = check_sequence("repeat", "seq", seq)
        self._times = check_nonnegative_int("repeat", "times", times)
        if n * self._times > sys.maxsize:
            raise ValueError(f"repeat: len(seq) * times must be < 2**63 (got {n} * {self._times})")
        self._parent = seq
        self._n = n
        self._len = n * self._times


    def _position_stage(self) -> Stage:
        return Stage("repeat", {"times": self._times, "of": self._n}, (self._parent,))

    def __len__(self) -> int:
        return self._len

    def _source_index(self, i: int) -> int:
        return i % self._n

    def _source_indices(self, idx: Positions) -> Positions:
        return np.asarray(idx, dtype=np.int64) % self._n

    def __repr__(self) -> str:
        return f"repeat(times={self._times}, len={self._len})"


def repeat(seq: Sequence[T], times: int) -> LazySequence[T]:
    """``seq`` repeated ``times`` times, like ``list(seq) * times`` but lazy.

    Args:
        seq: the input sequence.
        times: a non-negative int.

    Returns:
        A lazy sequence of ``len(seq) * times`` items; item ``i`` is ``seq[i % len(seq)]``.

    Raises:
        TypeError: ``seq`` is not a sequence or ``times`` is not an int.
        ValueError: ``times`` is negative, or the result would have ``2**63`` items or more.

    Example:
        >>> list(repeat(["a", "b"], 3))
        ['a', 'b', 'a', 'b', 'a', 'b']
        >>> len(repeat([1, 2], 0))
        0
        >>> repeat([1, 2], -1)
        Traceback (most recent call last):
        ValueError: repeat: times must be a non-negative int (got -1)
    """
    return _Repeat(seq, times)
