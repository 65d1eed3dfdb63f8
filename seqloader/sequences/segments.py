"""Variable-length segments of a sequence: :func:`split` (seqtools' ``split``).

The usual way to cut recordings and token streams into examples. Segments are given by a number
of equal cuts, by boundaries, or by ``(start, stop)`` pairs, checked once at construction and
stored as two int64 arrays. Segment ``k`` is the parent's own slice ``seq[start:stop]`` where that
is known to be a subsequence (a lazy view for seqloader's sequences, which ``source_indices``
peels; a view for arrays; a copy for lists), else a lazy :class:`~seqloader.sequences.base.SliceView`.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence, TypeVar

import numpy as np

from seqloader.errors import check_nonnegative_int
from seqloader.sequences._util import check_sequence
from seqloader.sequences.base import LazySequence, Positions, SliceView
from seqloader.sequences.describe import Stage, digest

__all__ = ["split"]

T = TypeVar("T")

#: Types whose ``seq[a:b]`` is the subsequence of items ``a .. b - 1`` (plus anything implementing
#: DLPack: numpy arrays, torch tensors). Any other sequence gets a SliceView: a torch ``Dataset``'s
#: ``__getitem__`` may not take a slice, or may take it to mean something else.
_NATIVE_SLICES = (LazySequence, list, tuple, range, str, bytes, bytearray, memoryview)

_EDGES_TYPE = "an int, a 1-D list of boundaries or a list of (start, stop) pairs"


def _as_int_array(edges: Any) -> np.ndarray:
    if isinstance(edges, (str, bytes)) or not (hasattr(edges, "__len__") or isinstance(edges, np.ndarray)):
        raise TypeError(f"split: edges must be {_EDGES_TYPE} (got {type(edges).__name__})")
    try:
        a = np.asarray(edges)
    except ValueError:  # ragged
        raise TypeError(f"split: edges must be {_EDGES_TYPE} (got a ragged {type(edges).__name__})") from None
    if a.dtype.kind == "O":  # e.g. Python ints beyond int64
        raise TypeError(f"split: edges must hold ints below 2**63 (got {type(edges).__name__} of objects)")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"split: edges must hold ints (got dtype {a.dtype})")
    if a.size and a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        raise TypeError("split: edges must hold ints below 2**63")
    return a.astype(np.int64)


def _segments(edges: Any, n: int) -> tuple[Positions, Positions, str]:
    """``(starts, stops, kind)`` of the segments ``edges`` describes over ``n`` items."""
    if isinstance(edges, np.ndarray) and edges.ndim == 0:
        edges = edges[()]  # a numpy scalar
    if not isinstance(edges, (bool, np.bool_, np.ndarray)) and hasattr(edges, "__index__"):
        cuts = check_nonnegative_int("split", "edges", operator.index(edges))
        parts = cuts + 1
        if n % parts:
            raise ValueError(f"split: edges={cuts} cuts make {parts} equal parts, which must divide "
                             f"len(seq) = {n} (remainder {n % parts}); pass boundaries or (start, stop) "
                             "pairs for unequal parts")
        step = n // parts
        starts = np.arange(parts, dtype=np.int64) * step
        return starts, starts + step, f"{parts} equal parts"
    if isinstance(edges, (bool, np.bool_)):
        raise TypeError(f"split: edges must be {_EDGES_TYPE} (got bool {edges!r})")
    if not isinstance(edges, np.ndarray) and hasattr(edges, "__len__") and len(edges) == 0:
        raise ValueError("split: edges is empty, which is ambiguous: no boundaries (one segment, the whole "
                         "sequence) or no (start, stop) pairs (no segment); pass np.zeros(0, int) for the "
                         "first or np.zeros((0, 2), int) for the second")
    a = _as_int_array(edges)
    if a.ndim == 1:  # boundaries b_0 <= b_1 <= ...: segments [0, b_0), [b_0, b_1), ..., [b_last, n)
        bad = np.flatnonzero((a < 0) | (a > n))
        if bad.size:
            k = int(bad[0])
            raise IndexError(f"split: edges[{k}] = {a[k]} out of range [0, {n}] (the boundaries of len(seq) = {n} items)")
        down = np.flatnonzero(np.diff(a) < 0)
        if down.size:
            k = int(down[0]) + 1
            raise ValueError(f"split: boundaries must be non-decreasing (edges[{k}] = {a[k]} < edges[{k - 1}] = {a[k - 1]})")
        bounds = np.concatenate([[0], a, [n]]).astype(np.int64)
        return bounds[:-1], bounds[1:], f"{len(a)} boundaries"
    if a.ndim == 2 and a.shape[1] == 2:  # (start, stop) pairs, any order, overlaps allowed
        for k, (start, stop) in enumerate(a.tolist()):
            if not 0 <= start <= stop <= n:
                raise IndexError(f"split: edges[{k}] = ({start}, {stop}) is not a segment of len(seq) = {n} "
                                 f"items (need 0 <= start <= stop <= {n})")
        return a[:, 0].copy(), a[:, 1].copy(), "pairs"
    raise ValueError(f"split: edges must be {_EDGES_TYPE} (got shape {a.shape})")


class _Split(LazySequence[Sequence[T]]):
    def __init__(self, seq: Sequence[T], edges: Any):
        n = check_sequence("split", "seq", seq)
        starts, stops, self._kind = _segments(edges, n)
        starts.setflags(write=False)
        stops.setflags(write=False)
        self._seq = seq
        self._starts, self._stops = starts, stops
        self._native = isinstance(seq, _NATIVE_SLICES) or hasattr(type(seq), "__dlpack__")


    def _position_stage(self) -> Stage:
        edges = np.concatenate([np.asarray(self._starts, dtype=np.int64), np.asarray(self._stops, dtype=np.int64)])
        return Stage("split", {"len": len(self), "edges": digest(edges.tobytes(), 12)}, (self._seq,))

    def __len__(self) -> int:
        return len(self._starts)

    def segment_range(self, k: int) -> range:
        """The positions of the parent that make up segment ``k`` (``0 <= k < len``)."""
        return range(int(self._starts[k]), int(self._stops[k]))

    def _item(self, k: int) -> Sequence[T]:
        start, stop = int(self._starts[k]), int(self._stops[k])
        if self._native:
            return self._seq[start:stop]
        return SliceView(self._seq, slice(start, stop))

    def __repr__(self) -> str:
        return f"split({self._kind}, len={len(self._starts)})"


def split(seq: Sequence[T], edges: Any) -> LazySequence[Sequence[T]]:
    """Cut ``seq`` into consecutive or given segments: item ``k`` is ``seq[start_k:stop_k]``.

    ``edges`` takes seqtools' three forms (with ``n = len(seq)``):

    * an int ``c``: ``c`` *cuts* into ``c + 1`` equal parts (seqtools' meaning: ``split(seq, 4)``
      has 5 segments), which must divide ``n``;
    * a 1-D list of boundaries ``[b_0, ..., b_m]``, non-decreasing in ``[0, n]``: the ``m + 2``
      segments ``[0, b_0), [b_0, b_1), ..., [b_m, n)`` (the start and the end are implicit);
    * a list of ``(start, stop)`` pairs with ``0 <= start <= stop <= n``, in any order, possibly
      overlapping (windows): one segment per pair.

    Unlike seqtools, out-of-range or decreasing edges raise instead of being clipped, and an empty
    list raises (it could mean either of the last two forms; pass ``np.zeros(0, int)`` or
    ``np.zeros((0, 2), int)``). Nothing is read until a segment's items are.

    Segment ``k`` is the parent's own slice where slicing is known to give a subsequence: a lazy
    view for seqloader's sequences (so ``source_indices`` peels through it), a view for numpy
    arrays and tensors (anything with ``__dlpack__``), a list for a list. Any other sequence (a
    torch ``Dataset``, whose ``__getitem__`` may not take a slice) gets a lazy view.

    Args:
        seq: the input sequence.
        edges: an int (cuts), a 1-D array-like of boundaries, or an ``(m, 2)`` array-like of
            ``(start, stop)`` pairs.

    Returns:
        A lazy sequence of segments.

    Raises:
        TypeError: ``seq`` is not a sequence, or ``edges`` is not one of the three forms.
        ValueError: the cuts do not divide ``len(seq)``, boundaries decrease, ``edges`` is an
            empty list, or has the wrong shape.
        IndexError: a boundary or pair is outside ``[0, len(seq)]`` (or a pair has
            ``start > stop``); the message names it.

    Example:
        >>> data = list("abcdefghij")
        >>> list(split(data, [4, 6]))
        [['a', 'b', 'c', 'd'], ['e', 'f'], ['g', 'h', 'i', 'j']]
        >>> list(split(data, [(0, 2), (1, 3)])), list(split(data, 1))
        ([['a', 'b'], ['b', 'c']], [['a', 'b', 'c', 'd', 'e'], ['f', 'g', 'h', 'i', 'j']])
        >>> list(split(data, [10])), len(split(data, [0, 0]))  # empty segments are kept
        ([['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'], []], 3)
        >>> split(data, [6, 4])
        Traceback (most recent call last):
        ValueError: split: boundaries must be non-decreasing (edges[1] = 4 < edges[0] = 6)
    """
    return _Split(seq, edges)
