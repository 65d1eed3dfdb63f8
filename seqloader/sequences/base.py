"""The base classes of every lazy sequence: indexing, slicing, iteration and index remapping.

An op subclasses :class:`LazySequence` and supplies ``__len__`` and ``_item(i)`` for
``0 <= i < len``; the base class owns negative indices, bounds checks, slices (lazy views) and
iteration. Ops that only *move* items (``gather``, ``shuffle``, ``shard``, slices) subclass
:class:`IndexMap` instead and supply ``_source_indices``, a vectorised map from their positions to
positions of their parent, so that a batch of positions is resolved with one numpy call.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar, overload

import numpy as np
import numpy.typing as npt

from seqloader.errors import normalize_index
from seqloader.sequences.stage import Stage

__all__ = ["LazySequence", "IndexMap", "SliceView", "source_indices"]

T_co = TypeVar("T_co", covariant=True)

#: An int64 array of positions.
Positions = npt.NDArray[np.int64]


class LazySequence(collections.abc.Sequence[T_co], Generic[T_co]):
    """A sized, indexable, iterable sequence whose items are computed on demand.

    Subclasses define ``__len__``, ``_item(i)`` (with ``0 <= i < len(self)``) and ``__repr__``.
    ``LazySequence[T]`` is generic in its item type: ``seq[i]`` is a ``T`` and ``seq[a:b]`` a
    ``LazySequence[T]``.

    Example:
        >>> class Squares(LazySequence):
        ...     def __len__(self):
        ...         return 5
        ...     def _item(self, i):
        ...         return i * i
        ...     def __repr__(self):
        ...         return "squares(len=5)"
        >>> s = Squares()
        >>> s[-1], list(s[1:4]), list(s[::-2])
        (16, [1, 4, 9], [16, 4, 0])
    """

    __slots__ = ()

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _item(self, i: int) -> T_co:  # pragma: no cover - abstract
        raise NotImplementedError

    @overload
    def __getitem__(self, key: int) -> T_co: ...

    @overload
    def __getitem__(self, key: slice) -> LazySequence[T_co]: ...

    def __getitem__(self, key: int | slice) -> T_co | LazySequence[T_co]:
        if isinstance(key, slice):
            return SliceView(self, key)
        return self._item(normalize_index(key, len(self), stage=self))

    def __iter__(self) -> Iterator[T_co]:
        for i in range(len(self)):
            yield self._item(i)

    def __bool__(self) -> bool:
        return len(self) > 0


class IndexMap(LazySequence[T_co]):
    """A sequence whose item ``i`` is item ``_source_indices([i])[0]`` of ``parent``.

    Subclasses set ``self._parent`` and define ``__len__``, ``_source_indices(idx)`` for an int64
    array of valid positions, and ``__repr__``. ``_source_index(i)`` (scalar) may be overridden
    for speed.
    """

    __slots__ = ()
    _parent: Sequence[T_co]

    def _source_indices(self, idx: Positions) -> Positions:  # pragma: no cover - abstract
        raise NotImplementedError

    def _source_index(self, i: int) -> int:
        return int(self._source_indices(np.array([i], dtype=np.int64))[0])

    def _item(self, i: int) -> T_co:
        parent = self._parent
        j = self._source_index(i)
        if isinstance(parent, LazySequence):
            lazy: LazySequence[T_co] = parent  # isinstance narrows to LazySequence[Any]
            return lazy._item(j)
        return parent[j]

    @property
    def __getitems__(self) -> Optional[Callable[[Sequence[int]], Any]]:
        """The batched read of the data stage under this chain of index maps, if it has one.

        torch's fetcher (and so ``seqloader.DataLoader``) calls ``dataset.__getitems__(indices)``
        when it is there and not ``None``: a batch of a ``shuffle``/``gather``/slice/``block_shuffle``
        over a source is then one batched read of the source (each of its blocks read once), the
        positions mapped with one numpy call per stage. ``None`` when the data stage reads item
        by item.
        """
        base: Any = self._parent
        while isinstance(base, IndexMap):
            base = base._parent
        getitems = getattr(base, "__getitems__", None)
        if not getitems:
            return None

        def read_many(positions: Sequence[int]) -> Any:
            return getitems(source_indices(self, positions)[1].tolist())

        return read_many


class SliceView(IndexMap[T_co]):
    """A lazy view of ``parent[key]`` for a slice ``key``; a view of a view folds into one.

    Example:
        >>> v = SliceView(range(10), slice(2, None, 3))
        >>> list(v), list(v[::-1]), v[::-1]
        ([2, 5, 8], [8, 5, 2], slice(range, 8::-3, len=3))
    """

    __slots__ = ("_parent", "_range")
    _range: range

    def __init__(self, parent: Sequence[T_co], key: slice):
        if isinstance(parent, SliceView):
            self._parent = parent._parent
            self._range = parent._range[key]
        else:
            self._parent = parent
            self._range = range(len(parent))[key]


    def _position_stage(self) -> Stage:
        r = self._range
        return Stage("slice", {"start": r.start, "stop": r.stop, "step": r.step}, (self._parent,))

    def __len__(self) -> int:
        return len(self._range)

    def _source_index(self, i: int) -> int:
        return self._range[i]

    def _source_indices(self, idx: Positions) -> Positions:
        return self._range.start + np.asarray(idx, dtype=np.int64) * self._range.step

    def __getstate__(self) -> tuple[Sequence[T_co], range]:
        return (self._parent, self._range)

    def __setstate__(self, state: tuple[Sequence[T_co], range]) -> None:
        self._parent, self._range = state

    def __repr__(self) -> str:
        r = self._range
        name = self._parent.__class__.__name__ if not isinstance(self._parent, LazySequence) else repr(self._parent)
        stop = "" if r.stop < 0 else r.stop
        return f"slice({name}, {r.start}:{stop}:{r.step}, len={len(r)})"


def source_indices(seq: Sequence[Any], idx: npt.ArrayLike) -> tuple[Sequence[Any], Positions]:
    """Resolve positions of ``seq`` through every :class:`IndexMap` down to the first data stage.

    Args:
        seq: any sequence; index maps (slices, ``gather``, ``shuffle``, ``shard``) are peeled off.
        idx: positions in ``[0, len(seq))`` (negative indices are not accepted here).

    Returns:
        ``(base, positions)`` such that ``seq[idx[k]] == base[positions[k]]`` for every ``k``.

    Raises:
        IndexError: a position is outside ``[0, len(seq))``.

    Example:
        >>> base, pos = source_indices(SliceView(range(100), slice(10, 20, 2)), [0, 4])
        >>> base, pos.tolist()
        (range(0, 100), [10, 18])
        >>> source_indices(range(3), [3])
        Traceback (most recent call last):
        IndexError: source_indices: position 3 out of range [0, 3) of range(0, 3)
    """
    pos: Positions = np.asarray(idx, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= len(seq)):
        bad = int(pos.min()) if pos.min() < 0 else int(pos.max())
        raise IndexError(f"source_indices: position {bad} out of range [0, {len(seq)}) of {seq!r}")
    while isinstance(seq, IndexMap):
        pos = seq._source_indices(pos)
        seq = seq._parent
    return seq, pos
