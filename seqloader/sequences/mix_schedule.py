"""A mixture whose weights change at exact positions: ``mix(...).with_weights(weights, at=p)``.

A change is a new immutable sequence that agrees with the old one on every position ``< p``. The
mixture is cut into *segments* at the change positions; segment 0 is the static ``mix`` itself and
segment ``s >= 1`` is a static block schedule of its own (the sources with weight > 0, their counts
per block, and with a seed the keys ``derive_seed(seed, "mix_weights", s)``), read from its first
position, so the prefix bound of ``mix`` holds from each change on.

Each source continues where it stopped: item ``j`` of source ``k`` in a segment (``j`` counts the
segment's own reads) is the ``j``-th item of ``k`` not read before the segment. Without a seed the
items read before a change are ``0 .. cursor - 1`` and ``j`` maps to ``cursor + j``. With a seed a
block cut by a change may have read a few items of its block out of order (say 5 and 7 of ``4 ..
7``): those unread ones ("holes", 4 and 6) are read first, then ``high, high + 1, ...``. So no item
is read twice or skipped because of a change. The tables are derived from ``(base, changes)`` at
construction (O(#changes)); pickles hold only those two.

This module only knows the static mix through the :class:`StaticMix` protocol: ``mix.py``
imports it (for ``with_weights``), not the reverse.
"""

from __future__ import annotations

import bisect
import math
import numbers
import sys
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, Union, cast

import numpy as np
import numpy.typing as npt

from seqloader.errors import add_note, check_nonnegative_int
from seqloader.rng import derive_seed
from seqloader.sequences._util import read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage

__all__ = ["Change", "MixSchedule", "StaticMix"]

_OP = "mix.with_weights"
_I64 = npt.NDArray[np.int64]
#: Stand-in sources of a segment's table: long enough that its lookups never wrap.
_FOREVER = range(sys.maxsize)

#: One weight as recorded in ``changes``: an int or a float, as given.
Weight = Union[int, float]
#: ``(position, weights)``: from ``position`` on, the sources are mixed with ``weights``.
Change = tuple[int, tuple[Weight, ...]]


class StaticMix(Protocol):
    """What a schedule reads of a static ``mix`` (``seqloader.sequences.mix._Mix``)."""

    @property
    def _seqs(self) -> tuple[Any, ...]: ...
    @property
    def _lens(self) -> np.ndarray: ...
    @property
    def _counts(self) -> np.ndarray: ...
    @property
    def _src(self) -> np.ndarray: ...
    @property
    def _rank(self) -> np.ndarray: ...
    @property
    def _block(self) -> int: ...
    @property
    def _seed(self) -> Optional[int]: ...
    @property
    def _stop(self) -> Optional[str]: ...
    def __len__(self) -> int: ...
    def _slots(self, q: np.ndarray, r: np.ndarray) -> np.ndarray: ...
    def _unslots(self, q: np.ndarray, slots: np.ndarray) -> np.ndarray: ...
    def _source_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
    def _source_of_one(self, p: int) -> tuple[int, int]: ...


class _Segment:
    """Positions from ``start`` on, read with ``table``; ``high``/``holes`` per source say what was
    read before ``start``: items below ``high`` except ``holes`` (sorted, read first)."""

    def __init__(self, start: int, table: StaticMix, active: _I64, high: _I64, holes: tuple[_I64, ...]):
        self.start, self.table, self.active, self.high, self.holes = start, table, active, high, holes
        # per local source, for vectorised lookups: its holes in one flat array (and a spare 0)
        local = [holes[k] for k in active.tolist()]
        self.nholes = np.array([len(h) for h in local], dtype=np.int64)
        self.offsets = np.cumsum(self.nholes) - self.nholes
        self.flat = np.concatenate(local + [np.zeros(1, dtype=np.int64)])
        self.local_high = high[active]

    def cursors(self) -> _I64:
        out: _I64 = self.high - np.array([len(h) for h in self.holes], dtype=np.int64)
        return out

    def source_of(self, t: _I64) -> tuple[_I64, _I64]:
        """``(k, j)`` of local positions ``t`` (``j`` not wrapped)."""
        kl, jl = self.table._source_of(t)
        kl = kl.astype(np.int64)
        if not self.nholes.any():
            return self.active[kl], self.local_high[kl] + jl
        nh = self.nholes[kl]
        inside = self.flat[self.offsets[kl] + np.minimum(jl, np.maximum(nh - 1, 0))]
        return self.active[kl], np.where(jl < nh, inside, self.local_high[kl] + jl - nh)

    def source_of_one(self, t: int) -> tuple[int, int]:
        kl, jl = self.table._source_of_one(t)
        k = int(self.active[kl])
        holes = self.holes[k]
        return k, int(holes[jl]) if jl < len(holes) else int(self.high[k]) + jl - len(holes)

    def advance(self, t: int) -> tuple[_I64, tuple[_I64, ...]]:
        """``(high, holes)`` after the first ``t`` positions of this segment."""
        table = self.table
        q, r = divmod(t, table._block)
        counts = table._counts.astype(np.int64)
        slots = table._slots(np.full(r, q, dtype=np.int64), np.arange(r, dtype=np.int64))
        ks, ranks = table._src[slots].astype(np.int64), table._rank[slots].astype(np.int64)
        n_local = len(self.active)
        reads = np.bincount(ks, minlength=n_local)       # reads of the cut block, per local source
        top = np.zeros(n_local, dtype=np.int64)          # 1 + the highest rank read in it
        np.maximum.at(top, ks, ranks + 1)
        ends = q * counts + top                          # local high-water marks
        high, holes = self.high.copy(), list(self.holes)
        for kl, k in enumerate(self.active.tolist()):
            old, h0, end = self.holes[k], int(self.high[k]), int(ends[kl])
            if not len(old) and reads[kl] == top[kl]:    # read in order: no holes, before or now
                high[k] = h0 + end
                continue
            local = np.setdiff1d(np.arange(int(top[kl]), dtype=np.int64), ranks[ks == kl]) + q * int(counts[kl])
            mapped = np.where(local < len(old), old[np.minimum(local, max(len(old) - 1, 0))] if len(old) else 0,
                              h0 + local - len(old)).astype(np.int64)
            holes[k] = np.concatenate([mapped, old[end:]]) if end < len(old) else mapped
            high[k] = h0 + max(0, end - len(old))
        return high, tuple(holes)

    def end(self, lens: _I64) -> int:
        """Under ``stop="first"``: the local position of the first read past a source's end."""
        table, cursors = self.table, self.cursors()
        counts = table._counts.astype(np.int64).tolist()
        order = np.argsort(table._src, kind="stable")  # canonical slots, by source then rank
        firsts = np.cumsum(counts) - counts
        ends = []
        for kl, k in enumerate(self.active.tolist()):
            q, m = divmod(int(lens[k] - cursors[k]), int(counts[kl]))
            slots = order[firsts[kl] + m:firsts[kl] + counts[kl]]
            pos = table._unslots(np.full(len(slots), q, dtype=np.int64), slots)
            ends.append(q * table._block + int(pos.min()))
        return min(ends)  # a segment has at least one source


def _check_weights(weights: Any, k: int) -> tuple[Weight, ...]:
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
        raise TypeError(f"{_OP}: weights must be a sequence of numbers >= 0 (got {type(weights).__name__})")
    values = list(weights)
    if len(values) != k:
        raise ValueError(f"{_OP}: weights must have one entry per source (got {len(values)} weights for "
                         f"{k} sources)")
    out: list[Weight] = []
    for i, w in enumerate(values):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
            raise TypeError(f"{_OP}: weights[{i}] must be a real number (got {type(w).__name__} {w!r})")
        try:
            f = float(w)
            ok = math.isfinite(f) and f >= 0
        except OverflowError:
            ok = False
        if not ok:
            raise ValueError(f"{_OP}: weights[{i}] must be a finite number >= 0 (got {w!r})")
        out.append(int(w) if isinstance(w, numbers.Integral) else f + 0.0)  # + 0.0: no -0.0
    if not any(w > 0 for w in out):
        raise ValueError(f"{_OP}: weights are all 0 (got {out}); at least one must be > 0")
    return tuple(out)


class MixSchedule(LazySequence[Any]):
    """A :func:`~seqloader.mix` whose weights change at positions; see :meth:`with_weights`.

    Built by ``mix(...).with_weights(weights, at=position)`` or ``mix(...).with_changes(changes)``
    (never directly). Immutable: every change returns a new sequence.
    """

    def __init__(self, base: StaticMix, segments: tuple[_Segment, ...], changes: tuple[Change, ...]):
        self._base, self._segments, self._changes = base, segments, changes
        self._starts = [s.start for s in segments]
        last = segments[-1]
        if base._stop is None or len(segments) == 1:
            self._len = len(base)
        else:
            n = last.start + last.end(base._lens)
            if n > sys.maxsize:
                raise ValueError(f"{_OP}: stop='first' gives {n} items, more than 2**63 - 1; give length= instead")
            self._len = n

    @classmethod
    def of(cls, base: StaticMix) -> MixSchedule:
        """``base`` with no changes (``stop="all"`` is refused: see :meth:`with_weights`)."""
        if base._stop == "all":
            raise ValueError(f"{_OP}: stop='all' cannot change weights (a source left at weight 0 would "
                             "never be read through); build the mix with stop='first' or length=")
        k = len(base._seqs)
        zeros = np.zeros(k, dtype=np.int64)
        empty = tuple(np.zeros(0, dtype=np.int64) for _ in range(k))
        return cls(base, (_Segment(0, base, np.arange(k, dtype=np.int64), zeros, empty),), ())

    # -- changes --------------------------------------------------------------------------------

    def with_weights(self, weights: Sequence[float], *, at: int) -> MixSchedule:
        """This mixture up to position ``at``, then the sources mixed with ``weights``.

        Each source goes on from its cursor (its items among positions ``< at``): no item is read
        twice or skipped because of a change. From ``at`` on the shares follow ``weights`` with the
        prefix bound of :func:`~seqloader.mix`, measured from ``at`` (the schedule restarts there).
        A weight of 0 leaves its source out from ``at`` on (it keeps its cursor, and a later change
        can bring it back). Under ``stop="first"`` the mixture then ends just before a source of
        weight > 0 would be read past its end; under ``length=`` it keeps its length.

        Args:
            weights: one finite number ``>= 0`` per source, at least one ``> 0``; each positive
                share at least 1/4096 of the total, as for ``mix``.
            at: the first position that uses ``weights``: ``>=`` the last change's position (the
                same position replaces that change) and ``<= len(self)``.

        Returns:
            A new :class:`MixSchedule`; ``self`` is unchanged.

        Raises:
            TypeError: ``weights`` is not a sequence of real numbers, or ``at`` is not an int.
            ValueError: a bad weight, all weights 0, ``at`` before the last change or past the
                end, or a base mixture built with ``stop="all"``.

        Example:
            >>> from seqloader import mix
            >>> m = mix([["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]], weights=[1, 1])
            >>> m2 = m.with_weights([0, 1], at=2)       # from position 2 on, only b
            >>> list(m[:2]), list(m2), m2.cursors(2)
            (['a0', 'b0'], ['a0', 'b0', 'b1', 'b2', 'b3'], (1, 1))
            >>> list(m2.with_weights([1, 0], at=5))     # b is read through: a goes on from a1
            ['a0', 'b0', 'b1', 'b2', 'b3', 'a1', 'a2', 'a3']
            >>> m2.with_weights([1, 1], at=1)
            Traceback (most recent call last):
            ValueError: mix.with_weights: at=1 is before the last change at 2; changes come in order of position (one at the same position replaces it)
        """
        base = self._base
        at = check_nonnegative_int(_OP, "at", at)
        w = _check_weights(weights, len(base._seqs))
        last = self._changes[-1][0] if self._changes else None
        if last is not None and at < last:
            raise ValueError(f"{_OP}: at={at} is before the last change at {last}; changes come in order "
                             "of position (one at the same position replaces it)")
        if at > self._len:
            raise ValueError(f"{_OP}: at={at} is past the end of the mixture (len={self._len}); a change "
                             "starts at len at the latest")
        keep, changes = self._segments, self._changes
        if last == at:
            keep, changes = keep[:-1], changes[:-1]
        prev = keep[-1]
        high, holes = prev.advance(at - prev.start)
        active = np.array([k for k, x in enumerate(w) if x > 0], dtype=np.int64)
        table = _table(base, w, active, len(keep))
        return MixSchedule(base, keep + (_Segment(at, table, active, high, holes),), changes + ((at, w),))

    def with_changes(self, changes: Iterable[Any]) -> MixSchedule:
        """:meth:`with_weights` for each ``[position, weights]`` pair of ``changes``, in order.

        ``m.with_changes(m2.changes)`` rebuilds ``m2`` from its base mixture ``m`` (a resumed run
        passes the ``changes`` it saved, as JSON lists).

        Example:
            >>> from seqloader import mix
            >>> m = mix([range(10), range(100, 110)], weights=[1, 1])
            >>> m2 = m.with_weights([3, 1], at=4).with_weights([0, 1], at=8)
            >>> m2.changes
            ((4, (3, 1)), (8, (0, 1)))
            >>> list(m.with_changes([[4, [3, 1]], [8, [0, 1]]])) == list(m2)
            True
        """
        out = self
        for i, change in enumerate(changes):
            if isinstance(change, (str, bytes)) or not hasattr(change, "__len__") or len(change) != 2:
                raise TypeError(f"mix.with_changes: changes[{i}] must be a [position, weights] pair "
                                f"(got {change!r})")
            try:
                out = out.with_weights(change[1], at=change[0])
            except (TypeError, ValueError) as e:
                add_note(e, f"seqloader: raised in mix.with_changes at changes[{i}]")
                raise
        return out

    @property
    def changes(self) -> tuple[Change, ...]:
        """``((position, weights), ...)`` in order of position, weights as given (ints or floats)."""
        return self._changes

    @property
    def num_sources(self) -> int:
        """How many sequences it mixes (the length of its ``weights``)."""
        return len(self._base._seqs)

    @property
    def base(self) -> LazySequence[Any]:
        """The static mixture the changes apply to."""
        return cast(LazySequence[Any], self._base)

    def cursors(self, position: int) -> tuple[int, ...]:
        """Per source, how many of the positions ``< position`` read it (before wrapping).

        Example:
            >>> from seqloader import mix
            >>> mix([range(6), range(6)], [2, 1], length=30).with_weights([1, 2], at=3).cursors(9)
            (4, 5)
        """
        position = check_nonnegative_int("MixSchedule.cursors", "position", position)
        if position > self._len:
            raise ValueError(f"MixSchedule.cursors: position must be <= len ({self._len}) (got {position})")
        seg = self._segments[bisect.bisect_right(self._starts, position) - 1]
        high, holes = seg.advance(position - seg.start)
        return tuple(int(h) - len(x) for h, x in zip(high.tolist(), holes))

    # -- the sequence ---------------------------------------------------------------------------

    def _source_of(self, positions: np.ndarray) -> tuple[_I64, _I64]:
        """Vectorised: ``(k, j)`` int64 arrays such that position ``p`` is item ``j`` of source ``k``.

        Positions must be in ``[0, len)`` (not checked). One pass per segment involved.
        """
        p = np.asarray(positions, dtype=np.int64)
        lens = self._base._lens
        if not p.size:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        first = bisect.bisect_right(self._starts, int(p.min())) - 1
        if first == bisect.bisect_right(self._starts, int(p.max())) - 1:
            seg = self._segments[first]
            k, j = seg.source_of(p - seg.start)
            return k, j % lens[k]
        which = np.searchsorted(np.array(self._starts, dtype=np.int64), p, side="right") - 1
        k, j = np.empty(len(p), dtype=np.int64), np.empty(len(p), dtype=np.int64)
        for s in np.unique(which).tolist():
            mask = which == s
            seg = self._segments[s]
            k[mask], j[mask] = seg.source_of(p[mask] - seg.start)
        return k, j % lens[k]

    def _source_of_one(self, p: int) -> tuple[int, int]:
        seg = self._segments[bisect.bisect_right(self._starts, p) - 1]
        k, j = seg.source_of_one(p - seg.start)
        return k, j % int(self._base._lens[k])


    def _position_stage(self) -> Stage:
        changes = [[int(at), [float(w) for w in weights]] for at, weights in self._changes]
        return Stage("mix", {"changes": changes}, (self._base,))

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> Any:
        k, j = self._source_of_one(i)
        return read(self._base._seqs[k], j)

    def __getstate__(self) -> dict[str, Any]:
        return {"base": self._base, "changes": self._changes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        rebuilt = MixSchedule.of(state["base"]).with_changes(state["changes"])
        self.__dict__.update(rebuilt.__dict__)

    def __repr__(self) -> str:
        base = self._base
        policy = f"stop={base._stop!r}" if base._stop else f"length={self._len}"
        last = f", last={list(self._changes[-1][1])} at {self._changes[-1][0]}" if self._changes else ""
        return (f"mix.with_weights({len(base._seqs)} seqs, {len(self._changes)} changes{last}, {policy}, "
                f"seed={base._seed}, len={self._len})")


def _table(base: StaticMix, weights: tuple[Weight, ...], active: _I64, index: int) -> StaticMix:
    """The block schedule of segment ``index``: a static mix of the same class over stand-ins."""
    positive = [weights[k] for k in active.tolist()]
    seed = None if base._seed is None else derive_seed(base._seed, "mix_weights", index)
    make = cast(Callable[..., StaticMix], type(base))
    try:
        return make((_FOREVER,) * len(positive), positive, seed=seed, stop=None, length=0)
    except ValueError as e:  # only a share below the finest a block holds gets here
        total = math.fsum(float(x) for x in positive)
        k = min(active.tolist(), key=lambda i: float(weights[i]))
        raise ValueError(f"{_OP}: weights[{k}] is too small: its share of the total is "
                         f"{float(weights[k]) / total:.3g}, below the finest share a mix block holds; "
                         "raise it, or set it to 0") from e
