"""A weighted mixture of sequences whose item ``p`` is computed from ``p`` alone: :func:`mix`.

The weights become integer counts ``c_k`` per *block* of ``B = sum(c_k)`` positions (``7, 2, 1`` in
a block of 10 for weights ``0.7, 0.2, 0.1``). One block's order is fixed at construction by an
earliest-deadline-first schedule that meets Tijdeman's bound: among the first ``r`` positions of
a block, source ``k`` has ``r * c_k / B`` items up to ``1 - 1/(2K - 2)`` (``K >= 2`` sources). Every
block repeats that order, so position ``p = q * B + r`` reads item ``q * c_k + rank[r]`` of source
``k = src[r]``: two lookups in tables of ``B`` entries, whatever the length. With a ``seed`` the
positions inside each block are permuted by a keyed bijection of ``[0, B)`` (a Feistel
permutation between two rotations drawn per block), which keeps the counts of every whole block.
"""

from __future__ import annotations

import heapq
import math
import numbers
import sys
from fractions import Fraction
from typing import Any, Optional, Sequence

import numpy as np

from seqloader.errors import check_nonnegative_int
from seqloader.orders.permutation import MAX_N, FeistelPermutation
from seqloader.rng import check_seed, derive_seed
from seqloader.sequences._util import check_sequences, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.mix_schedule import MixSchedule
from seqloader.sequences.describe import Stage

__all__ = ["mix", "MAX_BLOCK"]

#: The largest block: weights are represented as integer counts summing to at most this.
MAX_BLOCK = 4096


def _check_weights(weights: Any, k: int) -> list[Any]:
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
        raise TypeError(f"mix: weights must be a sequence of positive numbers (got {type(weights).__name__})")
    values: list[Any] = list(weights)
    if len(values) != k:
        raise ValueError(f"mix: seqs and weights must have the same length (got {k} seqs and {len(values)} weights)")
    for i, w in enumerate(values):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
            raise TypeError(f"mix: weights[{i}] must be a real number (got {type(w).__name__} {w!r})")
        try:
            f = float(w)
            ok = math.isfinite(f) and f > 0
        except OverflowError:
            ok = False
        if not ok:
            raise ValueError(f"mix: weights[{i}] must be a finite number > 0 (got {w!r})")
    return values


def _block_counts(weights: list[Any]) -> np.ndarray:
    """Integer counts per block: exact when the shares are multiples of ``1/B`` for some
    ``B <= MAX_BLOCK``, else rounded by largest remainder in a block of ``MAX_BLOCK``."""
    if all(isinstance(w, numbers.Integral) for w in weights):
        total = sum(int(w) for w in weights)
        exact = [Fraction(int(w), total) for w in weights]
        shares = [float(f) for f in exact]
    else:
        top = max(float(w) for w in weights)
        scaled = [float(w) / top for w in weights]  # no overflow in the sum
        shares = [x / math.fsum(scaled) for x in scaled]
        exact = [Fraction(x).limit_denominator(MAX_BLOCK) for x in shares]
        if (sum(exact) != 1 or any(f <= 0 for f in exact)
                or any(abs(float(f) - x) > 1e-9 for f, x in zip(exact, shares))):
            exact = None
    if exact is not None:
        block = math.lcm(*(f.denominator for f in exact))
        if block <= MAX_BLOCK:
            return np.array([int(f * block) for f in exact], dtype=np.int64)
    for i, x in enumerate(shares):
        if x < 1 / MAX_BLOCK:
            raise ValueError(f"mix: weights[{i}] is too small: its share of the total is {x:.3g}, below "
                             f"1/{MAX_BLOCK}, the finest share a block holds; raise it, or concatenate "
                             "small sources into one")
    raw = np.array(shares) * MAX_BLOCK
    counts: np.ndarray = np.floor(raw).astype(np.int64)
    extra = np.argsort(-(raw - counts), kind="stable")[:MAX_BLOCK - int(counts.sum())]
    counts[extra] += 1
    return counts


def _block_schedule(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(src, rank)`` of one block: slot ``r`` holds item ``rank[r]`` (of the block) of source ``src[r]``.

    Earliest deadline first: item ``m`` (1-based) of source ``k`` may take slot ``t`` (1-based)
    only if ``(m - s) * B / c_k <= t <= (m - 1 + s) * B / c_k + 1`` with ``s = 1 - 1/(2K - 2)``,
    which keeps ``|count_k(t) - t * c_k / B| <= s`` for every ``t``. Tijdeman (1980) shows that
    a schedule with that ``s`` exists, and EDF finds one whenever one exists.
    """
    k, block = len(counts), int(counts.sum())
    src = np.repeat(np.arange(k), counts)
    rank = np.arange(block) - np.repeat(np.cumsum(counts) - counts, counts)
    if k == 1:
        return src.astype(np.int16), rank.astype(np.int16)
    d, a = 2 * k - 2, 2 * k - 3  # s = a / d
    c, m = counts[src], rank + 1
    release = -((a - m * d) * block // (c * d))  # ceil((m - s) * B / c_k)
    deadline = ((m - 1) * d + a) * block // (c * d) + 1
    order = np.argsort(release, kind="stable")
    items = list(zip(release[order].tolist(), deadline[order].tolist(), src[order].tolist(),
                     rank[order].tolist()))
    out_src, out_rank = np.empty(block, np.int16), np.empty(block, np.int16)
    heap: list[tuple[int, int, int]] = []
    nxt = 0
    for t in range(1, block + 1):
        while nxt < block and items[nxt][0] <= t:
            heapq.heappush(heap, items[nxt][1:])
            nxt += 1
        if not heap or heap[0][0] < t:  # pragma: no cover - excluded by Tijdeman's theorem
            raise RuntimeError(f"mix: no block schedule met the bound for counts {counts.tolist()}")
        _, out_src[t - 1], out_rank[t - 1] = heapq.heappop(heap)
    return out_src, out_rank


class _Mix(LazySequence[Any]):
    def __init__(self, seqs: Any, weights: Any, seed: Optional[int], stop: Optional[str],
                 length: Optional[int]):
        seqs, lens = check_sequences("mix", seqs, "a sequence of sequences")
        if not seqs:
            raise ValueError("mix: seqs must not be empty; give at least one source")
        for i, n in enumerate(lens):
            if n == 0:
                raise ValueError(f"mix: seqs[{i}] is empty; every source needs at least one item")
        self._counts = _block_counts(_check_weights(weights, len(seqs)))
        self._src, self._rank = _block_schedule(self._counts)
        self._block = int(self._counts.sum())
        self._seqs, self._lens = seqs, np.array(lens, dtype=np.int64)
        self._seed = None if seed is None else check_seed("mix", seed)
        if self._seed is not None:  # keys of the in-block shuffle, and of the rotations per block
            self._perm = FeistelPermutation(self._block, derive_seed(self._seed, "mix", 0))
            self._rot = FeistelPermutation(MAX_N, derive_seed(self._seed, "mix", 1))
        self._stop, fixed = _check_policy(stop, length)
        self._len = fixed if fixed is not None else self._policy_length(lens)

    # -- the schedule ---------------------------------------------------------------------------

    def _slots(self, q: np.ndarray, r: np.ndarray) -> np.ndarray:
        """The slot of the canonical block that position ``r`` of block ``q`` shows."""
        if self._seed is None:
            return r
        b = np.uint64(self._block)
        h = self._rot(q)
        u, v = h % b, (h // b) % b
        slots: np.ndarray = ((self._perm((r.astype(np.uint64) + u) % b) + v) % b).astype(np.int64)
        return slots

    def _unslots(self, q: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The inverse of ``_slots``: the positions in blocks ``q`` that show canonical ``slots``."""
        if self._seed is None:
            return slots
        b = np.uint64(self._block)
        h = self._rot(q)
        u, v = h % b, (h // b) % b
        back = self._perm.inverse((slots.astype(np.uint64) + b - v) % b)
        out: np.ndarray = ((back + b - u) % b).astype(np.int64)
        return out

    def _source_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised: ``(k, j)`` int64 arrays such that position ``p`` is item ``j`` of source ``k``.

        Positions must be in ``[0, len)`` (not checked; negative ones are not accepted).
        """
        p = np.asarray(positions, dtype=np.int64)
        q, r = np.divmod(p, self._block)
        s = self._slots(q, r)
        k = self._src[s].astype(np.int64)
        j = q * self._counts[k] + self._rank[s]
        return k, j % self._lens[k]

    def _source_of_one(self, p: int) -> tuple[int, int]:
        q, r = divmod(p, self._block)
        if self._seed is not None:
            b = self._block
            h = self._rot.index(q)
            r = (self._perm.index((r + h % b) % b) + h // b) % b
        k = int(self._src[r])
        return k, (q * int(self._counts[k]) + int(self._rank[r])) % int(self._lens[k])

    def _policy_length(self, lens: list[int]) -> int:
        """The length under ``stop``: the position of the first read past a source's end
        ("first"), or the position after which every item of every source has been read ("all")."""
        counts = self._counts.tolist()
        blocks = [divmod(n if self._stop == "first" else n - 1, c) for n, c in zip(lens, counts)]
        order = np.argsort(self._src, kind="stable")  # canonical slots, by source then rank
        q_of_slot = np.repeat(np.array([q for q, _ in blocks], dtype=np.int64), counts)
        where = self._unslots(q_of_slot, order)  # source k's ranks 0 .. c - 1, in its block q
        starts = (np.cumsum(counts) - counts).tolist()
        ends: list[int] = []
        for k, n in enumerate(lens):
            c, (q, m) = counts[k], blocks[k]
            pos = where[starts[k]:starts[k] + c]
            if self._stop == "first":  # the first read of an item j >= n
                ends.append(q * self._block + int(pos[m:].min()))
            else:  # every item j in [q * c, n) is read in block q, maybe as j + t * n (j % n wraps)
                items = (q * c + np.arange(c)) % n
                by_pos = np.argsort(pos, kind="stable")
                seen, first = np.unique(items[by_pos], return_index=True)
                needed = seen >= q * c
                ends.append(q * self._block + int(pos[by_pos[first[needed]]].max()) + 1)
        n = min(ends) if self._stop == "first" else max(ends)
        if n > sys.maxsize:
            raise ValueError(f"mix: stop={self._stop!r} gives {n} items, more than 2**63 - 1; "
                             "give length= instead")
        return n

    # -- the sequence ---------------------------------------------------------------------------


    def _position_stage(self) -> Stage:
        return Stage("mix", {"counts": self._counts.tolist(), "seed": self._seed, "stop": self._stop,
                             "length": self._len}, self._seqs)

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> Any:
        k, j = self._source_of_one(i)
        return read(self._seqs[k], j)

    @property
    def num_sources(self) -> int:
        """How many sequences it mixes (the length of its ``weights``)."""
        return len(self._seqs)

    def with_weights(self, weights: Sequence[float], *, at: int) -> MixSchedule:
        """This mixture up to position ``at``, then mixed with ``weights`` (zeros allowed):
        see :meth:`MixSchedule.with_weights <seqloader.sequences.mix_schedule.MixSchedule.with_weights>`."""
        return MixSchedule.of(self).with_weights(weights, at=at)

    def with_changes(self, changes: Any) -> MixSchedule:
        """This mixture with ``changes`` (``[[position, weights], ...]``) applied in order."""
        return MixSchedule.of(self).with_changes(changes)

    def __repr__(self) -> str:
        counts = self._counts.tolist()
        shown = ", ".join(map(str, counts[:8])) + (", ..." if len(counts) > 8 else "")
        policy = f"stop={self._stop!r}" if self._stop else f"length={self._len}"
        return (f"mix({len(self._seqs)} seqs, counts=[{shown}] per {self._block}, {policy}, "
                f"seed={self._seed}, len={self._len})")


def _check_policy(stop: Any, length: Any) -> tuple[Optional[str], Optional[int]]:
    """``(stop, length)``: ``stop`` is ``"first"``, ``"all"`` or ``None`` (when ``length`` is given)."""
    if length is not None:
        if stop is not None:
            raise ValueError(f"mix: give stop or length, not both (got stop={stop!r}, length={length!r})")
        length = check_nonnegative_int("mix", "length", length)
        if length > sys.maxsize:
            raise ValueError(f"mix: length must be < 2**63 (got {length})")
        return None, length
    if stop is None:
        return "first", None
    if not isinstance(stop, str):
        raise TypeError(f"mix: stop must be 'first' or 'all' (got {type(stop).__name__} {stop!r})")
    if stop not in ("first", "all"):
        raise ValueError(f"mix: stop must be 'first' or 'all' (got {stop!r})")
    return stop, None


def mix(seqs: Sequence[Sequence[Any]], weights: Sequence[float], *, seed: Optional[int] = None,
        stop: Optional[str] = None, length: Optional[int] = None) -> LazySequence[Any]:
    """A weighted mixture of ``seqs``: item ``p`` is an item of one source, computed from ``p`` alone.

    The weights are turned into integer counts ``c_k`` per block of ``B = sum(c_k)`` positions:
    exactly when the shares ``w_k / sum(w)`` are multiples of ``1/B`` for some ``B <= 4096``
    (``[0.7, 0.2, 0.1]`` gives 7, 2, 1 per block of 10), else by largest remainder in a block of
    4096 (each share then off by less than 1/4096). Every block holds exactly ``c_k`` items of
    source ``k``; without a seed, each source is read in order, ``0, 1, 2, ...``. Among the first
    ``p`` positions, source ``k`` has ``count_k(p)`` items with, for every ``p``:

    * without a seed: ``|count_k(p) - p * c_k / B| <= 1 - 1/(2K - 2)`` (``K >= 2`` sources; 1/2
      for two sources, 3/4 for three, always below 1);
    * with a seed: the positions inside each block are shuffled (by a keyed bijection of the
      block, drawn per block), and ``|count_k(p) - p * c_k / B| <= c_k * (1 - c_k / B)``: less
      than one block. Inside a block the items of a source come in shuffled order.

    Nothing is read from the sources except the item requested; ``mix(...)[p]`` costs O(1).

    Args:
        seqs: the sources, a non-empty sequence of non-empty sequences.
        weights: one positive, finite number per source (any scale: ``[7, 2, 1]`` is ``[0.7, 0.2,
            0.1]``); each share must be at least 1/4096 of the total.
        seed: ``None`` for the deterministic schedule, or an int in ``[0, 2**64)`` to shuffle the
            order inside each block.
        stop: ``"first"`` (the default): the mixture ends just before a source would be read past
            its end, so no item repeats (with a seed, the source that runs out may leave up to
            ``c_k - 1`` items of its last block unread). ``"all"``: short sources start over
            (item ``j % len``) until every source has been read through at least once.
        length: instead of ``stop``, a fixed number of items; every source starts over as needed.

    Returns:
        A lazy sequence; ``len`` follows ``stop`` or equals ``length``.

    Raises:
        TypeError: ``seqs`` is not a sequence of sequences, a weight is not a real number, ``seed``
            or ``length`` is not an int, or ``stop`` is not a string.
        ValueError: ``seqs`` or one of its sources is empty, ``seqs`` and ``weights`` differ in
            length, a weight is not finite and positive or below 1/4096 of the total, ``seed`` is
            outside ``[0, 2**64)``, ``stop`` is unknown, both ``stop`` and ``length`` are given, or
            the length would reach ``2**63``.

    Example:
        >>> a, b = ["a0", "a1", "a2", "a3", "a4", "a5"], ["b0", "b1"]
        >>> m = mix([a, b], weights=[2, 1])
        >>> len(m), list(m)
        (7, ['a0', 'b0', 'a1', 'a2', 'b1', 'a3', 'a4'])
        >>> list(mix([a, b], weights=[2, 1], stop="all"))  # b starts over: b0 again before a5
        ['a0', 'b0', 'a1', 'a2', 'b1', 'a3', 'a4', 'b0', 'a5']
        >>> mix([range(3), []], weights=[1, 1])
        Traceback (most recent call last):
        ValueError: mix: seqs[1] is empty; every source needs at least one item
    """
    return _Mix(seqs, weights, seed, stop, length)
