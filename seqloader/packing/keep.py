"""``keep``: the items of a sequence that satisfy a predicate, item ``j`` located from ``j`` alone.

The predicate is evaluated once per input item, when the index is built, into a mask (one bit
per item, stored packed). The *count index* holds the cumulative number of kept items at the
end of each window of ``window`` input items: output ``j`` is in the window ``w`` with
``ends[w - 1] <= j < ends[w]`` (one bisection), at the rank ``j - ends[w - 1]`` among that
window's kept items (its bits unpacked: ``window / 8`` bytes). ``keep`` only maps positions
(an :class:`~seqloader.sequences.base.IndexMap`), so a batch of outputs is one batched read of
the input, and nothing but the item read is decoded.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import numpy as np

from seqloader.errors import check_positive_int, normalize_index, note_stage
from seqloader.packing._index import IndexHolder
from seqloader.packing._inputs import describe, read_items
from seqloader.packing._store import array_digest
from seqloader.sequences._util import check_bool, check_sequence, fname
from seqloader.sequences.base import IndexMap, LazySequence, Positions
from seqloader.sequences.describe import Stage, digest, function_name

__all__ = ["keep"]

T = TypeVar("T")


def _check_mask(mask: Any, n: int) -> np.ndarray:
    a = np.asarray(mask)
    if a.dtype != np.bool_:
        raise TypeError(f"keep: predicate must be a callable or an array of bools (a mask); got "
                        f"{type(mask).__name__} of dtype {a.dtype}")
    if a.shape != (n,):
        raise ValueError(f"keep: the mask has shape {a.shape} but the input has {n} items; give one bool per item")
    return a


class _Keep(IndexMap[T]):
    _op = "keep"
    _names: tuple[str, ...] = ("bits", "ends")

    def __init__(self, predicate: Union[Callable[[T], Any], Any], seq: Sequence[T], window: int, cache: bool,
                 cache_dir: Optional[str]):
        self._n = check_sequence("keep", "seq", seq)
        self._parent = seq
        self._window = check_positive_int("keep", "window", window)
        if callable(predicate):
            self._predicate: Optional[Callable[[T], Any]] = predicate
            self._mask = None
        else:
            self._predicate, self._mask = None, _check_mask(predicate, self._n)
        check_bool("keep", "cache", cache)
        if cache_dir is not None and not isinstance(cache_dir, str):
            raise TypeError(f"keep: cache_dir must be a str or None (got {type(cache_dir).__name__})")
        self._holder = IndexHolder(cache, cache_dir)
        self._kept: Optional[str] = None  # the digest of the kept positions, once asked for

    # -- the index ------------------------------------------------------------------------------

    def _position_stage(self) -> Stage:
        """Which input items the positions are: the predicate (by name, or a mask), the window, and a
        digest of the kept positions (of the index, obtained if it was not yet)."""
        if self._kept is None:
            self._kept = digest(array_digest(self._index()[0]).encode(), 12)
        predicate = "mask" if self._predicate is None else function_name(self._predicate)
        return Stage("keep", {"predicate": predicate, "window": self._window, "kept": self._kept}, (self._parent,),
                     values=(self._mask if self._predicate is None else self._predicate,))

    def _key(self) -> tuple[dict[str, Any], Optional[dict[str, Any]], str]:
        location = {"op": "keep", "window": self._window, "n": self._n}
        if self._predicate is None:
            return location, None, "not needed: the mask was given"
        where, why = describe((self._parent, self._predicate), content=False)
        what, why2 = describe((self._parent, self._predicate), content=True) if where is not None else (None, why)
        if what is None:
            return location, None, why or why2
        return {**location, "input": where}, {"input": what}, ""

    def _build(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if self._mask is not None:
            mask, read_n = self._mask, 0
        else:
            mask, read_n = self._evaluate(), self._n
        counts = np.add.reduceat(mask.astype(np.int64), np.arange(0, self._n, self._window)) if self._n else mask
        ends = np.cumsum(counts, dtype=np.int64)
        return {"bits": np.packbits(mask), "ends": ends}, {"items_read": read_n,
                                                          "predicate": "mask" if read_n == 0 else "evaluated"}

    def _evaluate(self) -> np.ndarray:
        pred = self._predicate
        assert pred is not None  # (a mask was given otherwise)
        mask = np.empty(self._n, dtype=bool)
        for a in range(0, self._n, self._window):
            for k, item in enumerate(read_items(self, self._parent, a, min(self._n, a + self._window))):
                try:
                    v = pred(item)
                except Exception as exc:
                    note_stage(exc, self, a + k)
                    raise
                if not isinstance(v, (bool, np.bool_)):
                    raise TypeError(f"{self!r}: the predicate returned {type(v).__name__} {v!r} for item {a + k}; "
                                    "it must return a bool")
                mask[a + k] = v
        return mask

    def _adopt(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        for a in arrays.values():
            a.setflags(write=False)
        return arrays["bits"], arrays["ends"]

    def _summary(self, index: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
        kept = int(index[1][-1]) if index[1].size else 0
        return {"items": self._n, "windows": int(index[1].size), "kept": kept}

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        index: tuple[np.ndarray, np.ndarray] = self._holder.get(self)
        return index

    def index_stats(self) -> dict[str, Any]:
        """How the index was obtained in this process (see ``pack``'s ``index_stats``), with
        ``items`` (input items), ``windows`` and ``kept``."""
        self._index()
        return dict(self._holder.stats or {})

    # -- positions ------------------------------------------------------------------------------

    def __len__(self) -> int:
        ends = self._index()[1]
        return int(ends[-1]) if ends.size else 0

    def _window_kept(self, w: int) -> Positions:
        """The input positions of the kept items of window ``w``."""
        bits = self._index()[0]
        a, b = w * self._window, min(self._n, (w + 1) * self._window)
        lo = a // 8
        flags = np.unpackbits(bits[lo:-(-b // 8)])[a - 8 * lo:b - 8 * lo]
        out: Positions = np.flatnonzero(flags) + a
        return out

    def _source_indices(self, idx: Positions) -> Positions:
        ends = self._index()[1]
        idx = np.asarray(idx, dtype=np.int64)
        w = np.searchsorted(ends, idx, side="right")
        rank = idx - np.concatenate(([0], ends))[w]
        out = np.empty(idx.shape, dtype=np.int64)
        for win in np.unique(w).tolist():
            sel = w == win
            out[sel] = self._window_kept(win)[rank[sel]]
        return out

    def source_index(self, j: int) -> int:
        """The input position of output item ``j`` (negative ``j`` counts from the end).

        Raises:
            IndexError: ``j`` is out of range.
        """
        return self._source_index(normalize_index(j, len(self), stage=self))

    def rank(self, positions: Any) -> Positions:
        """How many input items before each of ``positions`` are kept.

        Raises:
            IndexError: a position is outside ``[0, len(input)]``.
        """
        bits, ends = self._index()
        p = np.asarray(positions, dtype=np.int64).reshape(-1)
        if p.size and (p.min() < 0 or p.max() > self._n):
            bad = int(p[(p < 0) | (p > self._n)][0])
            raise IndexError(f"{self!r}: rank: position {bad} out of range [0, {self._n}]")
        w = p // self._window
        out: Positions = np.concatenate(([0], ends))[w]
        for k, (pos, win) in enumerate(zip(p.tolist(), w.tolist())):
            a = win * self._window
            if pos > a:
                lo = a // 8
                out[k] += int(np.unpackbits(bits[lo:-(-pos // 8)])[a - 8 * lo:pos - 8 * lo].sum())
        return out

    def blocks(self) -> Positions:
        """The input's ``blocks()`` in output positions (for a block shuffle of the kept items).

        Raises:
            TypeError: the input has no ``blocks()``.
        """
        blocks = getattr(self._parent, "blocks", None)
        if not callable(blocks):
            raise TypeError(f"{self!r}: the input has no blocks() (got {type(self._parent).__name__})")
        return self.rank(blocks())

    def __getstate__(self) -> dict[str, Any]:
        return {"parent": self._parent, "window": self._window, "predicate": self._predicate, "mask": self._mask,
                "holder": self._holder, "n": self._n, "kept": self._kept}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._parent, self._window, self._n = state["parent"], state["window"], state["n"]
        self._predicate, self._mask, self._holder = state["predicate"], state["mask"], state["holder"]
        self._kept = state.get("kept")

    def __repr__(self) -> str:
        what = fname(self._predicate) if self._predicate is not None else "mask"
        return f"keep({what}, window={self._window}, of={self._n})"


def keep(predicate: Union[Callable[[T], Any], Any], seq: Sequence[T], *, window: int = 4096, cache: bool = True,
         cache_dir: Optional[str] = None) -> LazySequence[T]:
    """The items of ``seq`` for which ``predicate(item)`` is true, in order, each found from its position.

    Like the builtin ``filter(predicate, seq)``, but a lazy, position-addressable sequence: item
    ``j`` is the ``j``-th kept item, the same whatever the process or the order of reads. The
    predicate runs once per input item, on first use (``len``), and its results are kept as an
    index (one bit per item, and the kept count at each window's end), cached as a file like
    ``pack``'s (``docs/packing.md``); reading item ``j`` then reads only input item
    ``keep(...).source_index(j)``.

    The returned sequence also has ``source_index(j)`` (the input position of item ``j``),
    ``rank(positions)`` (how many input items before each position are kept), ``blocks()`` (the
    input's ``blocks()`` in output positions), ``files()`` (as ``pack``'s) and ``index_stats()``
    (as ``pack``'s, with ``kept``).

    Args:
        predicate: a callable ``item -> bool`` (picklable for ``spawn`` workers), or a precomputed
            boolean array with one entry per item (the mask; nothing is evaluated).
        seq: the input sequence.
        window: input items per entry of the count index (> 0): its size is ``len(seq) / window``
            entries, and locating an item unpacks ``window`` bits.
        cache: keep the index in a file (when the input and the predicate can be described).
        cache_dir: the folder of index files (default ``$SEQLOADER_CACHE/packing``).

    Returns:
        A lazy sequence of the kept items; ``len`` builds (or loads) the index.

    Raises:
        TypeError: ``seq`` is not a sequence, ``predicate`` is neither callable nor an array of
            bools, or (when the index is built) the predicate returns something other than a bool.
        ValueError: the mask's length differs from ``seq``'s, or ``window`` is not positive.

    An exception raised by the predicate keeps its type and gains the note
    ``seqloader: raised in keep(...) at item i``.

    Example:
        >>> evens = keep(lambda x: x % 2 == 0, range(10), window=4, cache=False)
        >>> len(evens), list(evens), evens[-1], evens.source_index(1)
        (5, [0, 2, 4, 6, 8], 8, 2)
        >>> list(keep(np.array([True, False, True]), ["a", "b", "c"]))
        ['a', 'c']
        >>> keep(np.array([True]), ["a", "b"])
        Traceback (most recent call last):
        ValueError: keep: the mask has shape (1,) but the input has 2 items; give one bool per item
    """
    return _Keep(predicate, seq, window, cache, cache_dir)
