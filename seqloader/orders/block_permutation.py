"""L1 orders: a locality-aware ("block") shuffle: a keyed bijection of ``[0, n)`` that reads whole blocks.

Data sources (Parquet row groups, tar shards) are read fastest in contiguous blocks, and a global
shuffle reads one row from everywhere. :class:`BlockPermutation` maps a position ``p`` of the
epoch's order to an index of the data in three steps, each a bijection:

1. **Lanes** (``lanes=L, chunk=C``): position ``p`` is in chunk ``c = p // C`` at offset
   ``o = p % C``; chunk ``c`` is chunk ``k = c // L`` of lane ``l = c % L``, and lane ``l``
   reads its own contiguous stretch of the windowed order below: ``s = start(l) + k*C + o``.
   *Tail rule*: with ``K, t = divmod(n, C)`` (``K`` full chunks and a last chunk of ``t``
   positions) and ``q, e = divmod(K, L)``, lane ``l`` holds ``q + (l < e)`` full chunks, and lane
   ``e`` holds the last, partial chunk after its ``q`` full ones; lanes are laid out in order, so
   ``start(l) = C*(l*q + min(l, e)) + (t if l > e else 0)``. Lane lengths differ by at most ``C``.
   With ``C = batch_size`` and ``L = num_workers``, batch ``b`` (computed by worker ``b % L``)
   reads lane ``b % L`` only. ``lanes=1`` is the identity: the plain windowed shuffle.
2. **Windows**: the blocks are permuted by a keyed bijection (``FeistelPermutation`` over the
   number of blocks, seed ``derive_seed(seed, "block_shuffle", 0)``); consecutive groups of
   ``window`` permuted blocks form windows (the last may hold fewer); position ``s`` falls in
   window ``w`` at offset ``r``, and ``r`` is permuted by a Feistel network over the window's
   size (the one of :mod:`seqloader.orders.permutation`, per element: radix ``a = ceil(sqrt(m))``,
   ``b = ceil(m / a)``, six rounds, cycle-walking) with round keys ``mix(mix(w ^ K) + (r+1)*G)``
   (splitmix64's ``mix``, ``K = derive_seed(seed, "block_shuffle", 1)``, ``G`` the golden-ratio
   constant): keyed by ``(seed, w)`` and vectorised over windows of different sizes.
3. **Blocks**: the offset inside the window's concatenation of permuted blocks gives the block
   and the row in it: the data index ``block_start + row``.

*Split seams* (``split_seams=True``, what :class:`seqloader.BlockShuffleSampler` uses since its
state records it): a window that a lane boundary cuts is split there into two windows, each
mixed on its own (its Feistel network over its own size), so the two lanes share at most the
one block that straddles the boundary instead of the whole window (which, with few blocks, was
decoded by both workers: 1.4x the bytes with 20 row groups and ``window=8``). Windows no
boundary cuts keep their keys and so their order; the part of a window after a boundary ``j``
(counting from 1) is keyed by ``w + j * W`` (``W`` windows). ``window=None`` (a full shuffle) is
never split.

``window=0``: nothing is shuffled (the order is sequential within each lane; with ``lanes=1``
the identity). ``window=k >= 1``: the block order is shuffled and rows are mixed within each
group of ``k`` consecutive permuted blocks (``window=1``: rows shuffled within each block).
``window=None``: one window of every block, a full shuffle.

Costs: construction O(number of blocks) time and memory (three int64 arrays: the blocks'
cumulative ends, the cumulative sizes in permuted order and the permuted blocks' starts, plus the
windows' starts); a lookup is O(1) numpy arithmetic and two binary searches (O(log blocks)),
vectorised over positions; nothing is O(n). Valid for ``n < 2**63``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from seqloader.errors import check_int, check_positive_int
from seqloader.orders.permutation import FeistelPermutation
from seqloader.rng import check_seed, derive_seed
from seqloader.orders.window_feistel import feistel, feistel_int

__all__ = ["BlockPermutation"]

_I64 = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]

def check_block_ends(op: str, block_ends: Any) -> _I64:
    """``block_ends`` (cumulative ends of consecutive blocks) as a read-only int64 array.

    Zero-size blocks (equal consecutive ends) are allowed; ``n`` is the last end (0 if empty).

    Example:
        >>> check_block_ends("block_shuffle", [3, 3, 5]).tolist()
        [3, 3, 5]
        >>> check_block_ends("block_shuffle", [3, 2])
        Traceback (most recent call last):
        ValueError: block_shuffle: block_ends must be non-decreasing cumulative ends (block_ends[1] = 2 < block_ends[0] = 3); pass numpy.cumsum(sizes)
    """
    if isinstance(block_ends, (str, bytes)):
        raise TypeError(f"{op}: block_ends must be a 1-D array-like of ints (got {type(block_ends).__name__})")
    a = np.asarray(block_ends)
    if a.ndim != 1:
        raise ValueError(f"{op}: block_ends must be 1-D (got shape {a.shape})")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{op}: block_ends must be ints (got dtype {a.dtype})")
    if a.dtype.kind == "u" and int(a.max()) >= 2**63:
        raise ValueError(f"{op}: block_ends must be < 2**63 (got {int(a.max())})")
    ends = a.astype(np.int64)
    if ends[0] < 0:
        raise ValueError(f"{op}: block_ends[0] must be >= 0 (got {int(ends[0])}); block_ends are cumulative ends")
    bad = np.flatnonzero(np.diff(ends) < 0)
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"{op}: block_ends must be non-decreasing cumulative ends (block_ends[{k + 1}] = "
                         f"{int(ends[k + 1])} < block_ends[{k}] = {int(ends[k])}); pass numpy.cumsum(sizes)")
    ends.setflags(write=False)
    return ends


def check_window(op: str, window: Any) -> int | None:
    """``None`` (one window: a full shuffle) or an int ``>= 0`` (0: no shuffle)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
        raise TypeError(f"{op}: window must be None (a full shuffle) or an int >= 0 (got {type(window).__name__} "
                        f"{window!r})")
    w = int(window)
    if w < 0:
        raise ValueError(f"{op}: window must be None (a full shuffle) or an int >= 0 (got {w})")
    return w


class BlockPermutation:
    """A keyed bijection of ``[0, n)`` that shuffles blocks, mixes rows within windows of blocks and
    deals chunks to lanes; see the module docstring for the definition and the tail rule.

    Args:
        block_ends: cumulative ends of the contiguous blocks (``numpy.cumsum(sizes)``), a 1-D
            non-decreasing array-like of ints; ``n = block_ends[-1]`` (0 if empty).
        window: ``0`` (no shuffle), ``k >= 1`` (rows mixed within groups of ``k`` permuted
            blocks) or ``None`` (a full shuffle).
        seed: an int in ``[0, 2**64)``; the loader passes one per epoch.
        lanes: ``>= 1``; chunk ``c`` goes to lane ``c % lanes`` (the loader: ``num_workers``).
        chunk: ``>= 1`` positions per chunk (the loader: ``batch_size``).
        split_seams: split the windows that lane boundaries cut (see the module docstring);
            ``False`` (the default here) is the order of states saved before it existed.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range.

    Example:
        >>> p = BlockPermutation([4, 8, 12], window=1, seed=0)
        >>> order = p(np.arange(12)).tolist()
        >>> sorted(order) == list(range(12)), [sorted(order[k:k + 4]) for k in (0, 4, 8)]
        (True, [[0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7]])
        >>> p.index(5) == order[5]
        True
        >>> BlockPermutation([4, 8, 12], window=0, seed=0)(np.arange(12)).tolist() == list(range(12))
        True
        >>> BlockPermutation([], window=None, seed=0)(np.arange(0)).tolist()
        []
        >>> p.index(12)
        Traceback (most recent call last):
        IndexError: BlockPermutation(blocks=3, window=1, seed=0, lanes=1, chunk=1, n=12): position 12 out of range [0, 12)
    """

    def __init__(self, block_ends: Any, window: int | None, seed: int, lanes: int = 1, chunk: int = 1,
                 split_seams: bool = False):
        self._ends = check_block_ends("BlockPermutation", block_ends)
        self._window = check_window("BlockPermutation", window)
        self._seed = check_seed("BlockPermutation", seed)
        self._lanes = check_positive_int("BlockPermutation", "lanes", lanes)
        self._chunk = check_positive_int("BlockPermutation", "chunk", chunk)
        if not isinstance(split_seams, bool):
            raise TypeError(f"BlockPermutation: split_seams must be a bool (got {type(split_seams).__name__})")
        self._split = split_seams
        self._setup()

    def _setup(self) -> None:
        ends = self._ends
        nb = len(ends)
        self._n = int(ends[-1]) if nb else 0
        self._shuffled = self._window != 0 and self._n > 0
        self._wkey: _I64 | None = None  # the key of window w is w, unless seams are split
        if not self._shuffled:
            return
        per = nb if self._window is None else min(self._window, nb)
        order = FeistelPermutation(nb, derive_seed(self._seed, "block_shuffle", 0))(np.arange(nb)).view(np.int64)
        starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
        cum = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum((ends - starts)[order], out=cum[1:])
        self._cum = cum                 # start of permuted slot j in the windowed order
        self._src = starts[order]       # data index of the first row of permuted slot j
        self._wstart = cum if per == 1 else np.ascontiguousarray(cum[np.append(np.arange(0, nb, per), nb)])
        if self._split and self._window is not None and self._lanes > 1:
            self._split_seams()
        self._key = derive_seed(self._seed, "block_shuffle", 1)

    def _split_seams(self) -> None:
        """Cut the windows at the lane boundaries; a part after the ``j``-th cut of window ``w``
        is keyed by ``w + j * W`` (the first part keeps ``w``)."""
        wstart = self._wstart
        count = len(wstart) - 1
        bounds = np.asarray(self.lane_bounds()[1:-1], dtype=np.int64)
        cuts = np.unique(bounds[(bounds > 0) & (bounds < self._n)])
        cuts = cuts[~np.isin(cuts, wstart)]
        if not cuts.size:
            return
        starts = np.union1d(wstart, cuts)
        window = np.searchsorted(wstart, starts, side="right") - 1        # the window each part is in
        first = np.searchsorted(starts, wstart[window])                    # its first part
        j = np.arange(len(starts)) - first                                 # 0 for the first part
        self._wstart = starts
        self._wkey = (window + j * count).astype(np.int64)

    # -- the three steps ------------------------------------------------------------------------

    def _lane_starts(self) -> tuple[int, int, int, int]:
        k_full, t = divmod(self._n, self._chunk)
        q, e = divmod(k_full, self._lanes)
        return q, e, t, self._chunk

    def lane_bounds(self) -> list[int]:
        """The ``lanes + 1`` boundaries of the lanes in the windowed order (``lanes=1``'s order):
        lane ``l`` reads its positions ``bounds[l] .. bounds[l+1] - 1``.

        Example:
            >>> BlockPermutation([10], window=0, seed=0, lanes=3, chunk=2).lane_bounds()
            [0, 4, 8, 10]
            >>> BlockPermutation([3], window=0, seed=0, lanes=4, chunk=2).lane_bounds()  # more lanes than chunks
            [0, 2, 3, 3, 3]
        """
        q, e, t, c = self._lane_starts()
        return [c * (lane * q + min(lane, e)) + (t if lane > e else 0) for lane in range(self._lanes)] + [self._n]

    def _to_windowed(self, p: _I64) -> _I64:
        if self._lanes == 1:
            return p
        q, e, t, c = self._lane_starts()
        chunk_id, offset = np.divmod(p, c)
        k, lane = np.divmod(chunk_id, self._lanes)
        start = c * (lane * q + np.minimum(lane, e)) + np.where(lane > e, t, 0)
        out: _I64 = start + k * c + offset
        return out

    def _to_data(self, s: _I64) -> _I64:
        wstart = self._wstart
        w = np.searchsorted(wstart, s, side="right") - 1
        w0 = wstart[w]
        key = w if self._wkey is None else self._wkey[w]
        r = feistel((s - w0).view(np.uint64), (wstart[w + 1] - w0).view(np.uint64), key.view(np.uint64), self._key)
        t = w0 + r.view(np.int64)
        j = np.searchsorted(self._cum, t, side="right") - 1
        out: _I64 = self._src[j] + (t - self._cum[j])
        return out

    # -- public API -----------------------------------------------------------------------------

    def __call__(self, positions: npt.ArrayLike) -> _I64:
        """The data indices of an array of positions in ``[0, n)``, as a new int64 array.

        Raises:
            TypeError: ``positions`` is not an integer array.
            IndexError: a position is outside ``[0, n)``.
        """
        a = np.asarray(positions)
        if a.size == 0:
            return np.zeros(a.shape, dtype=np.int64)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{self!r}: positions must be an integer array (got dtype {a.dtype})")
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= self._n:
            raise IndexError(f"{self!r}: position {lo if lo < 0 else hi} out of range [0, {self._n})")
        p = a.astype(np.int64).reshape(-1)
        s = self._to_windowed(p)
        out = self._to_data(s) if self._shuffled else s.copy()
        return out.reshape(a.shape)

    def index(self, position: int) -> int:
        """The data index of one position (pure Python arithmetic; equal to ``self([position])[0]``).

        Raises:
            TypeError: ``position`` is not an int.
            IndexError: ``position`` is outside ``[0, n)``.
        """
        s = self._windowed_int(position)
        if not self._shuffled:
            return s
        w = int(np.searchsorted(self._wstart, s, side="right")) - 1
        w0 = int(self._wstart[w])
        key = w if self._wkey is None else int(self._wkey[w])
        t = w0 + feistel_int(s - w0, int(self._wstart[w + 1]) - w0, key, self._key)
        j = int(np.searchsorted(self._cum, t, side="right")) - 1
        return int(self._src[j]) + t - int(self._cum[j])

    def window_rows(self, position: int) -> list[int]:
        """One data index in each block of the window that holds ``position``: the blocks a
        reader of that window needs, whatever its rows' order (the loader decodes them ahead:
        ``seqloader.loader.epoch.read_ahead``). Without a shuffle (``window=0``): the position's
        own row. O(log blocks).

        Example:
            >>> p = BlockPermutation([4, 8, 12, 16], window=2, seed=0)
            >>> rows = p.window_rows(0)
            >>> sorted({r // 4 for r in rows}) == sorted({int(i) // 4 for i in p(np.arange(8))})
            True
        """
        s = self._windowed_int(position)
        if not self._shuffled:
            return [s]
        w = int(np.searchsorted(self._wstart, s, side="right")) - 1
        lo, hi = int(self._wstart[w]), int(self._wstart[w + 1])
        first = int(np.searchsorted(self._cum, lo, side="right")) - 1
        last = int(np.searchsorted(self._cum, hi - 1, side="right")) - 1
        cum, src, out = self._cum, self._src, []
        for j in range(first, last + 1):
            start = max(lo, int(cum[j]))
            if start < min(hi, int(cum[j + 1])):   # (an empty block holds no row)
                out.append(int(src[j]) + start - int(cum[j]))
        return out

    def _windowed_int(self, position: int) -> int:
        """Step 1 (the lanes) for one position, checked: its position in the windowed order."""
        p = check_int(repr(self), "position", position)
        if not 0 <= p < self._n:
            raise IndexError(f"{self!r}: position {p} out of range [0, {self._n})")
        if self._lanes == 1:
            return p
        q, e, t, c = self._lane_starts()
        chunk_id, offset = divmod(p, c)
        k, lane = divmod(chunk_id, self._lanes)
        return c * (lane * q + min(lane, e)) + (t if lane > e else 0) + k * c + offset

    def __len__(self) -> int:
        return self._n

    @property
    def n(self) -> int:
        return self._n

    @property
    def block_ends(self) -> _I64:
        """The cumulative block ends (read-only)."""
        return self._ends

    @property
    def window(self) -> int | None:
        return self._window

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def chunk(self) -> int:
        return self._chunk

    @property
    def split_seams(self) -> bool:
        return self._split

    def _key_tuple(self) -> tuple[bytes, int | None, int, int, int, bool]:
        return (self._ends.tobytes(), self._window, self._seed, self._lanes, self._chunk, self._split)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockPermutation):
            return NotImplemented
        return self._key_tuple() == other._key_tuple()

    def __hash__(self) -> int:
        return hash((BlockPermutation, self._key_tuple()))

    def __repr__(self) -> str:
        split = ", split_seams=True" if self._split else ""
        return (f"BlockPermutation(blocks={len(self._ends)}, window={self._window}, seed={self._seed}, "
                f"lanes={self._lanes}, chunk={self._chunk}{split}, n={self._n})")

    def __getstate__(self) -> dict[str, Any]:
        return {"block_ends": self._ends, "window": self._window, "seed": self._seed, "lanes": self._lanes,
                "chunk": self._chunk, "split_seams": self._split}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._ends = check_block_ends("BlockPermutation", state["block_ends"])
        self._window, self._seed = state["window"], state["seed"]
        self._lanes, self._chunk = state["lanes"], state["chunk"]
        self._split = state.get("split_seams", False)
        self._setup()
