"""Packing one window of documents into items of ``length`` tokens: pieces, bins and plans.

Everything here is a pure function of the documents' lengths: no tokens are read.

A document of ``l`` tokens is one *piece* ``(doc, start, size)``. With ``overlong="split"`` a
document longer than ``length`` becomes ``ceil(l / length)`` pieces (all but the last full);
with ``"truncate"``, one piece of its first ``length`` tokens; with ``"error"`` it is refused.
An empty document is no piece. The pieces of a window go, in input order, into bins of
``length`` tokens:

* ``"best_fit"``: the open bin with the least room that still holds the piece (ties: the bin
  opened first), else a new bin;
* ``"first_fit"``: the first bin opened that still holds it, else a new bin.

Bins are numbered in the order they are opened; bin ``b`` of window ``w`` is output item
``ends[w - 1] + b`` of the packed sequence (``ends``: the cumulative counts). The index keeps
every piece's bin (:func:`window_bins`), so an item is found without packing its window again
(:func:`item_pieces`: one vectorised pass over the window's lengths). In the *split*
layout (``pack(split=True)``, concat and chunk) there are no bins: item ``j`` is tokens
``[j * length, (j + 1) * length)`` of the documents laid end to end.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["METHODS", "OVERLONG", "best_fit", "first_fit", "pieces", "window_bins", "item_pieces", "chunk_ends",
           "chunk_pieces"]

Ints = npt.NDArray[np.int64]

METHODS = ("best_fit", "first_fit")
OVERLONG = ("split", "truncate", "error")
_LOW = (1 << 32) - 1


def best_fit(sizes: list[int], capacity: int) -> tuple[list[int], int]:
    """The bin of each piece under best fit, and the number of bins.

    Open bins are kept as sorted keys ``room << 32 | bin``: one bisection finds the tightest bin.

    Example:
        >>> best_fit([6, 5, 3, 4, 2], capacity=8)
        ([0, 1, 1, 2, 0], 3)
        >>> best_fit([], capacity=8)
        ([], 0)
    """
    keys: list[int] = []
    out: list[int] = []
    nbins = 0
    for s in sizes:
        k = bisect.bisect_left(keys, s << 32)
        if k == len(keys):
            b, room = nbins, capacity - s
            nbins += 1
        else:
            key = keys.pop(k)
            b, room = key & _LOW, (key >> 32) - s
        if room:
            bisect.insort(keys, (room << 32) | b)
        out.append(b)
    return out, nbins


def first_fit(sizes: list[int], capacity: int) -> tuple[list[int], int]:
    """The bin of each piece under first fit, and the number of bins.

    Example:
        >>> first_fit([6, 5, 3, 4, 2], capacity=8)
        ([0, 1, 1, 2, 0], 3)
        >>> first_fit([3, 3, 2], capacity=4)
        ([0, 1, 2], 3)
    """
    room = np.zeros(len(sizes), dtype=np.int64)
    out: list[int] = []
    nbins = 0
    for s in sizes:
        b = int((room[:nbins] >= s).argmax()) if nbins else 0
        if not nbins or room[b] < s:
            b = nbins
            nbins += 1
            room[b] = capacity
        room[b] -= s
        out.append(b)
    return out, nbins


_ASSIGN: dict[str, Callable[[list[int], int], tuple[list[int], int]]] = {
    "best_fit": best_fit, "first_fit": first_fit}


def _piece_counts(lengths: Ints, length: int, overlong: str) -> Ints:
    """The number of pieces of each document."""
    if overlong == "split":
        out: Ints = np.where(lengths > length, -(-lengths // length), lengths > 0)
        return out
    return (lengths > 0).astype(np.int64)


def pieces(lengths: Ints, length: int, overlong: str, first: int = 0) -> tuple[Ints, Ints, Ints]:
    """``(doc, start, size)`` of the pieces of documents of ``lengths`` (``doc`` indexes ``lengths``).

    Raises:
        ValueError: ``overlong="error"`` and a document is longer than ``length`` (the message
            names its input position, ``first`` + its index in ``lengths``).

    Example:
        >>> [a.tolist() for a in pieces(np.array([3, 0, 9]), 4, "split")]
        [[0, 2, 2, 2], [0, 0, 4, 8], [3, 4, 4, 1]]
        >>> [a.tolist() for a in pieces(np.array([3, 0, 9]), 4, "truncate")]
        [[0, 2], [0, 0], [3, 4]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if overlong == "error" and lengths.size and lengths.max() > length:
        bad = int(np.flatnonzero(lengths > length)[0])
        raise ValueError(f"document {first + bad} has {int(lengths[bad])} tokens, more than length={length}")
    count = _piece_counts(lengths, length, overlong)
    doc = np.repeat(np.arange(lengths.size, dtype=np.int64), count)
    k = np.arange(doc.size, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    start = k * length
    size = np.minimum(length, lengths[doc] - start)
    return doc, start, size


def window_bins(lengths: Ints, window: int, length: int, method: str, overlong: str) -> tuple[Ints, Ints, Ints]:
    """``(counts, piece_ends, bins)`` of every window: its number of items, the cumulative number
    of pieces at its end, and the bin (item within its window) of every piece, in piece order.

    Raises:
        ValueError: ``overlong="error"`` and a document is longer than ``length``.

    Example:
        >>> counts, piece_ends, bins = window_bins(np.array([6, 5, 3, 4, 2, 8]), 3, 8, "best_fit", "split")
        >>> counts.tolist(), piece_ends.tolist(), bins.tolist()
        ([2, 2], [3, 6], [0, 1, 1, 0, 0, 1])
    """
    n = int(lengths.size)
    assign = _ASSIGN[method]
    counts = np.zeros(-(-n // window), dtype=np.int64)
    parts: list[np.ndarray] = []
    for w, a in enumerate(range(0, n, window)):
        size = pieces(lengths[a:a + window], length, overlong, first=a)[2]
        bins, counts[w] = assign(size.tolist(), length)
        parts.append(np.asarray(bins, dtype=np.int64))
    sizes = np.array([p.size for p in parts], dtype=np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    small = not flat.size or int(flat.max()) < 2**15
    return counts, np.cumsum(sizes), flat.astype(np.int16 if small else np.int32)


def item_pieces(lengths: Ints, first: int, bins: Ints, b: int, length: int,
                overlong: str) -> tuple[Ints, Ints, Ints]:
    """``(doc, start, size)`` of item ``b`` of the window whose documents (input positions
    ``first, first + 1, ...``) have ``lengths`` and whose pieces went to ``bins``.

    Example:
        >>> lens = np.array([6, 5, 3]); _, _, bins = window_bins(lens, 3, 8, "best_fit", "split")
        >>> [a.tolist() for a in item_pieces(lens, 10, bins, 1, 8, "split")]
        [[11, 12], [0, 0], [5, 3]]
    """
    sel = np.flatnonzero(bins == b)
    if lengths.size == bins.size and 0 < lengths.min() and lengths.max() <= length:  # a piece per document
        return sel + first, np.zeros(sel.size, dtype=np.int64), lengths[sel].astype(np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    count = _piece_counts(lengths, length, overlong)
    ends = np.cumsum(count)
    doc = np.searchsorted(ends, sel, side="right")
    start = (sel - (ends[doc] - count[doc])) * length
    return doc + first, start, np.minimum(length, lengths[doc] - start)


def chunk_ends(lengths: Ints, window: int) -> Ints:
    """Cumulative tokens at the end of each window (the split layout's index).

    Example:
        >>> chunk_ends(np.array([3, 0, 9, 4, 1]), window=2).tolist()
        [3, 16, 17]
    """
    n = int(lengths.size)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    sums = np.add.reduceat(np.asarray(lengths, dtype=np.int64), np.arange(0, n, window))
    out: Ints = np.cumsum(sums)
    return out


def chunk_pieces(lengths: Ints, ends: Ints, window: int, length: int, j: int) -> tuple[Ints, Ints, Ints]:
    """``(doc, start, size)`` of the pieces of item ``j`` in the split layout.

    Item ``j`` is tokens ``[j * length, min((j + 1) * length, total))`` of the documents laid end
    to end; it reads the documents that overlap that range, found from the window ends.

    Example:
        >>> lens = np.array([3, 0, 9, 4, 1]); ends = chunk_ends(lens, 2)
        >>> [a.tolist() for a in chunk_pieces(lens, ends, 2, 4, 1)]
        [[2], [1], [4]]
        >>> [a.tolist() for a in chunk_pieces(lens, ends, 2, 4, 4)]
        [[4], [0], [1]]
    """
    total = int(ends[-1])
    t0, t1 = j * length, min((j + 1) * length, total)
    w = int(np.searchsorted(ends, t0, side="right"))
    pos = int(ends[w - 1]) if w else 0
    docs, starts, sizes = [], [], []
    a = w * window
    while pos < t1:
        seg = np.asarray(lengths[a:a + window], dtype=np.int64)
        stop = pos + np.cumsum(seg)
        begin = stop - seg
        hit = np.flatnonzero((stop > t0) & (begin < t1) & (seg > 0))
        lo = np.maximum(begin[hit], t0)
        docs.append(hit + a)
        starts.append(lo - begin[hit])
        sizes.append(np.minimum(stop[hit], t1) - lo)
        pos = int(stop[-1])
        a += window
    return np.concatenate(docs), np.concatenate(starts), np.concatenate(sizes)
