"""L1 orders: which dataset index sits at each position of an epoch's global order (*orders*).

An order is any object with the :class:`Order` protocol: a length ``n``, a vectorised
``lookup(positions)`` and ``run(first, count, stride)`` (the positions ``first, first + stride,
...``, the common case of one rank's batch). It is a pure function of its arguments (a seed, an
epoch's key): a seek is a lookup, never a replay. The built-in ones:

* :class:`RangeOrder`: ``range(n)`` (``shuffle=False``);
* :class:`BijectiveOrder`: a Feistel bijection (``shuffle=True``, and
  :class:`~seqloader.loader.samplers.shuffle.BijectiveShuffleSampler`): O(1) memory and seek;
* :class:`NumpyPermutationOrder`: seqloader 0.1's numpy permutation (states of derivation 1);
* :class:`BlockOrder`: a :class:`~seqloader.orders.block_permutation.BlockPermutation` (windows of
  contiguous blocks, lanes per worker; :class:`~seqloader.loader.samplers.shuffle.BlockShuffleSampler`);
* :class:`ListedOrder`: the indices a custom sampler yielded this epoch (materialised).

Plans (:mod:`seqloader.orders.plans`) cut an order into batches per rank.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, cast, runtime_checkable

import numpy as np

from seqloader.orders.block_permutation import BlockPermutation
from seqloader.orders.permutation import FeistelPermutation
from seqloader.rng import derive_seed

#: How ``(seed, epoch, position)`` turn into the epoch's order and the global-RNG seeds; saved in
#: the loader's state (``"derivation"``) so that a state resumes with the scheme it was saved
#: with. 1 (seqloader 0.1): a numpy permutation per epoch; batch seeds from ``derive_seed``, torch
#: seeded with the full 64-bit seed. 2: a Feistel bijection per epoch (O(1) memory and seek);
#: batch seeds from ``hash_seed`` (~1 µs); torch seeded with the top 63 bits, so
#: ``torch.initial_seed()`` fits a signed 64-bit int as it does under torch's loader
#: (:mod:`seqloader.loader.rngs.seeding` seeds the global RNGs by it).
DERIVATION = 2

#: The dataset indices an order gives (ints for the built-in orders; a custom sampler's own keys).
Indices = list[Any]

__all__ = ["DERIVATION", "BijectiveOrder", "BlockOrder", "ListedOrder", "NumpyPermutationOrder", "Order", "RangeOrder",
           "builtin_order", "materialise_order", "positions_of"]


@runtime_checkable
class Order(Protocol):
    """Position -> dataset index over ``[0, n)``, vectorised (see the module docstring)."""

    n: int

    def lookup(self, pos: np.ndarray) -> Indices:
        """The dataset indices at the (int64) positions ``pos``."""

    def run(self, first: int, count: int, stride: int) -> Indices:
        """The dataset indices at positions ``first, first + stride, ...`` (``count`` of them)."""


def positions_of(order: Any, indices: Any) -> np.ndarray:
    """The positions of ``order`` that hold any of the dataset ``indices`` (sorted int64).

    Uses the order's own inverse when it has one (``range``, the Feistel shuffles, a custom
    sampler's listed indices), else scans the order in chunks of 2**20 positions (O(n)).

    Example:
        >>> positions_of(RangeOrder(10), [7, 3, 12]).tolist()
        [3, 7]
    """
    wanted = np.unique(np.asarray(indices, dtype=np.int64).reshape(-1))
    own = getattr(order, "positions_of", None)
    if own is not None:
        return np.unique(np.asarray(own(wanted), dtype=np.int64))
    found = []
    for lo in range(0, order.n, 1 << 20):
        pos = np.arange(lo, min(order.n, lo + (1 << 20)), dtype=np.int64)
        hit = np.isin(np.asarray(order.lookup(pos), dtype=np.int64), wanted)
        found.append(pos[hit])
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


class RangeOrder:
    """The identity order of ``range(n)``."""

    def __init__(self, n: int):
        self.n = n

    def lookup(self, pos: np.ndarray) -> Indices:
        return cast(Indices, pos.tolist())

    def run(self, first: int, count: int, stride: int) -> Indices:
        return list(range(first, first + count * stride, stride))

    def positions_of(self, indices: np.ndarray) -> np.ndarray:
        return indices[(indices >= 0) & (indices < self.n)]


class NumpyPermutationOrder:
    """``Generator(PCG64(seed)).permutation(n)``, built on first use in each process (cached)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._perm: Optional[np.ndarray] = None

    def _permutation(self) -> np.ndarray:
        if self._perm is None:
            self._perm = np.random.Generator(np.random.PCG64(self.seed)).permutation(self.n)
        return cast(np.ndarray, self._perm)

    def lookup(self, pos: np.ndarray) -> Indices:
        return cast(Indices, self._permutation()[pos].tolist())

    def run(self, first: int, count: int, stride: int) -> Indices:
        return cast(Indices, self._permutation()[first:first + count * stride:stride].tolist())

    def positions_of(self, indices: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.isin(self._permutation(), indices))

    def __getstate__(self) -> dict[str, int]:  # workers rebuild the permutation rather than receive n ints
        return {"n": self.n, "seed": self.seed}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.n, self.seed, self._perm = state["n"], state["seed"], None


class _ChunkedOrder:
    """An order over a vectorised permutation ``perm`` that caches the images of one *chunk*: the
    next :data:`CHUNK` positions of this process's stride (``start, start + stride, ...``; the
    stride is ``world_size`` under sharding), so a batch is a slice of the cache, not a pass of the
    permutation, and a seek costs one chunk. The cache is per process and is not pickled.
    """

    CHUNK = 4096

    n: int
    _chunk: Optional[tuple[int, int, np.ndarray]]  # (start, stride, images)

    def _images(self, pos: np.ndarray) -> np.ndarray:  # pragma: no cover - overridden
        """The dataset indices at ``pos``, as an int64 array."""
        raise NotImplementedError

    def lookup(self, pos: np.ndarray) -> Indices:
        return cast(Indices, self._images(pos).tolist())

    def run(self, first: int, count: int, stride: int) -> Indices:
        chunk = self._chunk
        if chunk is not None and chunk[1] == stride and first >= chunk[0] and (first - chunk[0]) % stride == 0:
            k = (first - chunk[0]) // stride
            if k + count <= len(chunk[2]):
                return cast(Indices, chunk[2][k:k + count].tolist())
        m = max(count, min(self.CHUNK, -(-(self.n - first) // stride)))
        images = self._images(first + stride * np.arange(m, dtype=np.int64))
        self._chunk = (first, stride, images)
        return cast(Indices, images[:count].tolist())

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_chunk": None}


class BijectiveOrder(_ChunkedOrder):
    """A :class:`~seqloader.orders.permutation.FeistelPermutation`: O(1) memory, O(1) seek.

    Its chunk cache (:class:`_ChunkedOrder`) makes a batch of 256 one cached lookup instead of
    ~70 numpy operations (about 18 µs against 100 µs per batch); a seek costs one chunk (a few
    hundred µs at any ``n``).
    """

    def __init__(self, n: int, seed: int):
        self.n, self.perm = n, FeistelPermutation(n, seed)
        self._chunk = None

    def _images(self, pos: np.ndarray) -> np.ndarray:
        return self.perm(pos).astype(np.int64)

    def positions_of(self, indices: np.ndarray) -> np.ndarray:
        inside = indices[(indices >= 0) & (indices < self.n)]
        return self.perm.inverse(inside).astype(np.int64) if inside.size else inside


class ListedOrder:
    """The indices a custom sampler yielded this epoch (an int64 array when they are all ints)."""

    def __init__(self, indices: Indices):
        try:
            arr = np.asarray(indices) if indices else np.zeros(0, dtype=np.int64)
        except ValueError:  # ragged lists of indices (a bulk sampler under batch_size=None): kept as they are
            arr = np.zeros((0, 0))
        self.items = arr if arr.ndim == 1 and arr.dtype.kind in "iu" else list(indices)
        self.n = len(indices)

    def lookup(self, pos: np.ndarray) -> Indices:
        if isinstance(self.items, np.ndarray):
            return cast(Indices, self.items[pos].tolist())
        return [self.items[p] for p in pos.tolist()]

    def run(self, first: int, count: int, stride: int) -> Indices:
        picked = self.items[first:first + count * stride:stride]
        return cast(Indices, picked.tolist()) if isinstance(picked, np.ndarray) else list(picked)


class BlockOrder(_ChunkedOrder):
    """A :class:`~seqloader.orders.block_permutation.BlockPermutation`'s order (vectorised lookups).

    Like :class:`BijectiveOrder`, it caches the images of one chunk (:class:`_ChunkedOrder`): a
    batch of 256 is then a slice, not a pass of the permutation (about 150 µs).

    Example:
        >>> from seqloader.orders.block_permutation import BlockPermutation
        >>> o = BlockOrder(BlockPermutation([3, 6], window=0, seed=0))
        >>> o.n, o.run(0, 3, 2), o.lookup(np.array([5, 0]))
        (6, [0, 2, 4], [5, 0])
    """

    def __init__(self, perm: BlockPermutation):
        self.perm, self.n = perm, perm.n
        self._chunk = None

    def _images(self, pos: np.ndarray) -> np.ndarray:
        return self.perm(pos)

    def window_rows(self, position: int) -> list[int]:
        """One data index in each block of ``position``'s window (``BlockPermutation.window_rows``)."""
        return self.perm.window_rows(position)


def materialise_order(sampler: Any) -> ListedOrder:
    """The indices of one pass over ``sampler`` (indices only; the dataset is not read)."""
    return ListedOrder(list(iter(sampler)))


def builtin_order(n: int, seed: int, epoch: int, shuffle: bool, derivation: int = DERIVATION) -> Order:
    """The order of a built-in sampler: ``range(n)``, or the shuffle of ``(seed, epoch)``: a Feistel
    bijection (O(1) memory, O(1) seek), or for ``derivation=1`` states the numpy permutation."""
    if not shuffle:
        return RangeOrder(n)
    if derivation == 1:
        return NumpyPermutationOrder(n, derive_seed(seed, "shuffle", epoch))
    return BijectiveOrder(n, derive_seed(seed, "shuffle", epoch))
