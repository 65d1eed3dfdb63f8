"""The epoch's order and its batches: which dataset indices batch ``b`` of epoch ``e`` reads.

An epoch *plan* maps a batch number to ``(key, indices)`` without touching the dataset:

* :class:`OrderPlan` reads an *order* (a vectorised position -> dataset-index map) from a global
  sample ``position`` on: sequential (``range``), shuffled (a numpy permutation of the epoch,
  O(n) to build, O(1) to seek), bijective (:class:`BijectiveShuffleSampler`, O(1) memory) or a
  custom sampler's indices materialised at the start of the epoch. Under ``torch.distributed``
  (built-in samplers only) rank ``r`` of ``w`` reads global positions ``position + r + j*w``, the
  layout of ``DistributedSampler``: positions past the end wrap to the start (padding), or the
  tail is dropped when ``drop_last=True``.
* :class:`BatchListPlan` reads a custom ``batch_sampler``'s batches, materialised likewise.

``key`` is the global position of the batch's first sample: the same for the same batch whether
the run was resumed or not, and distinct across batches and ranks. The loader seeds the global
RNGs from ``(seed, epoch, key)`` before producing the batch.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data

from seqloader.errors import check_nonnegative_int
from seqloader.permutation import FeistelPermutation
from seqloader.loader.seeding import DERIVATION, preserved_globals, torch_seed
from seqloader.rng import check_seed, derive_seed

__all__ = ["BijectiveShuffleSampler", "BatchListPlan", "OrderPlan", "current_world", "draw_seed",
           "materialise_batches", "materialise_order", "sampler_globals"]


def current_world() -> tuple[int, int]:
    """``(rank, world_size)`` of ``torch.distributed`` if initialised, else ``(0, 1)``.

    The one place the loader asks for its topology; tests replace it to simulate ranks.

    Example:
        >>> current_world()
        (0, 1)
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """A seed drawn from ``generator`` (torch's default generator if ``None``), broadcast from rank 0.

    ``torch.manual_seed(s)`` before the call reproduces the draw. Under an initialised
    ``torch.distributed`` with more than one rank, every rank gets rank 0's draw (a collective:
    every rank must call it). ``broadcast_object_list`` picks the device the backend needs: the
    CPU for gloo, ``torch.cuda.current_device()`` for NCCL, which rejects CPU tensors.

    Example:
        >>> _ = torch.manual_seed(0); a = draw_seed()
        >>> _ = torch.manual_seed(0); a == draw_seed()
        True
    """
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
    rank, world = current_world()
    if world > 1:
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = box[0]
    return seed


@contextlib.contextmanager
def sampler_globals(seed: int, epoch: int, derivation: int = DERIVATION) -> Iterator[None]:
    """Seed ``random``, ``numpy.random`` and torch's generator from ``(seed, "sampler", epoch)``.

    The caller's states are restored on exit. The loader iterates a custom sampler inside this,
    so a sampler drawing from the global RNGs (``RandomSampler`` without a generator) gives the
    same order for the same ``(seed, epoch)``, which makes its epochs resumable.
    """
    s = derive_seed(seed, "sampler", epoch)
    with preserved_globals():
        random.seed(s)
        np.random.seed(s & 0xFFFFFFFF)
        torch.default_generator.manual_seed(torch_seed(s, derivation))
        yield


# -- orders: vectorised position -> dataset index ------------------------------------------------

class _Range:
    """The identity order of ``range(n)``."""

    def __init__(self, n: int):
        self.n = n

    def lookup(self, pos: np.ndarray) -> list:
        return pos.tolist()

    def run(self, first: int, count: int, stride: int) -> list:
        return list(range(first, first + count * stride, stride))


class _NumpyPermutation:
    """``Generator(PCG64(seed)).permutation(n)``, built on first use in each process (cached)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self._perm = n, seed, None

    def _permutation(self) -> np.ndarray:
        if self._perm is None:
            self._perm = np.random.Generator(np.random.PCG64(self.seed)).permutation(self.n)
        return self._perm

    def lookup(self, pos: np.ndarray) -> list:
        return self._permutation()[pos].tolist()

    def run(self, first: int, count: int, stride: int) -> list:
        return self._permutation()[first:first + count * stride:stride].tolist()

    def __getstate__(self):  # workers rebuild the permutation rather than receive n ints
        return {"n": self.n, "seed": self.seed}

    def __setstate__(self, state):
        self.n, self.seed, self._perm = state["n"], state["seed"], None


class _Bijective:
    """A :class:`~seqloader.permutation.FeistelPermutation`: O(1) memory, O(1) seek.

    Caches the images of one *chunk*: the next :data:`CHUNK` positions of this process's stride
    (``start, start + stride, ...``; the stride is ``world_size`` under sharding), so a batch of
    256 costs one cached lookup instead of ~70 numpy operations (about 18 µs against 100 µs per
    batch); a seek costs one chunk (a few hundred µs at any ``n``). The cache is per process and
    is not pickled.
    """

    CHUNK = 4096

    def __init__(self, n: int, seed: int):
        self.n, self.perm = n, FeistelPermutation(n, seed)
        self._chunk: Optional[tuple[int, int, np.ndarray]] = None  # (start, stride, images)

    def lookup(self, pos: np.ndarray) -> list:
        return self.perm(pos).astype(np.int64).tolist()

    def run(self, first: int, count: int, stride: int) -> list:
        chunk = self._chunk
        if chunk is not None and chunk[1] == stride and first >= chunk[0] and (first - chunk[0]) % stride == 0:
            k = (first - chunk[0]) // stride
            if k + count <= len(chunk[2]):
                return chunk[2][k:k + count].tolist()
        m = max(count, min(self.CHUNK, -(-(self.n - first) // stride)))
        images = self.perm(first + stride * np.arange(m, dtype=np.int64)).astype(np.int64)
        self._chunk = (first, stride, images)
        return images[:count].tolist()

    def __getstate__(self):
        return {"n": self.n, "perm": self.perm, "_chunk": None}


class _Listed:
    """The indices a custom sampler yielded this epoch (an int64 array when they are all ints)."""

    def __init__(self, indices: list):
        arr = np.asarray(indices) if indices else np.zeros(0, dtype=np.int64)
        self.items = arr if arr.ndim == 1 and arr.dtype.kind in "iu" else list(indices)
        self.n = len(indices)

    def lookup(self, pos: np.ndarray) -> list:
        if isinstance(self.items, np.ndarray):
            return self.items[pos].tolist()
        return [self.items[p] for p in pos.tolist()]

    def run(self, first: int, count: int, stride: int) -> list:
        picked = self.items[first:first + count * stride:stride]
        return picked.tolist() if isinstance(picked, np.ndarray) else list(picked)


def materialise_order(sampler: Any) -> _Listed:
    """The indices of one pass over ``sampler`` (indices only; the dataset is not read)."""
    return _Listed(list(iter(sampler)))


def builtin_order(n: int, seed: int, epoch: int, shuffle: bool, derivation: int = DERIVATION) -> Any:
    """The order of a built-in sampler: ``range(n)``, or the shuffle of ``(seed, epoch)``: a Feistel
    bijection (O(1) memory, O(1) seek), or for ``derivation=1`` states the numpy permutation."""
    if not shuffle:
        return _Range(n)
    if derivation == 1:
        return _NumpyPermutation(n, derive_seed(seed, "shuffle", epoch))
    return _Bijective(n, derive_seed(seed, "shuffle", epoch))


# -- plans ---------------------------------------------------------------------------------------

class OrderPlan:
    """Batches of ``batch_size`` read from ``order`` starting at global position ``start``.

    Args:
        order: an order object (``n`` and vectorised ``lookup``).
        start: samples of the global order already consumed this epoch.
        batch_size: samples per batch per rank, or ``None`` (one sample per step, not collated).
        drop_last: drop the incomplete last batch (and, with several ranks, the tail that does
            not divide evenly, like ``DistributedSampler(drop_last=True)``).
        rank, world_size: this process's place; positions ``start + rank + j * world_size``.

    Example:
        >>> p = OrderPlan(_Range(9), start=0, batch_size=4, drop_last=False, rank=1, world_size=2)
        >>> len(p), p.batch(0), p.batch(1), p.end_position(1)
        (2, (1, [1, 3, 5, 7]), (9, [0]), 10)
        >>> len(OrderPlan(_Range(10), start=8, batch_size=4, drop_last=True, rank=0, world_size=2))
        0
    """

    def __init__(self, order: Any, start: int, batch_size: Optional[int], drop_last: bool,
                 rank: int = 0, world_size: int = 1):
        self.order, self.start, self.rank, self.world = order, start, rank, world_size
        self.single = batch_size is None
        self.bs = 1 if batch_size is None else batch_size
        n = order.n
        remaining = max(n - start, 0)
        per_rank = remaining // world_size if drop_last else -(-remaining // world_size)
        self.per_rank = per_rank
        self._len = per_rank // self.bs if drop_last else -(-per_rank // self.bs)

    def __len__(self) -> int:
        return self._len

    def key(self, b: int) -> int:
        """The global position of batch ``b``'s first sample."""
        return self.start + self.rank + b * self.bs * self.world

    def batch_of(self, key: int) -> Optional[int]:
        """The batch whose key is ``key``, or ``None`` if no batch of this plan has it."""
        b, r = divmod(key - self.start - self.rank, self.bs * self.world)
        return b if r == 0 and 0 <= b < self._len else None

    def batch(self, b: int) -> tuple[int, Any]:
        """``(key, indices)`` of batch ``b`` (a single index when ``batch_size`` is ``None``)."""
        lo, hi = b * self.bs, min((b + 1) * self.bs, self.per_rank)
        first = self.start + self.rank + lo * self.world
        if hi > lo and first + (hi - 1 - lo) * self.world < self.order.n:
            idx = self.order.run(first, hi - lo, self.world)
        else:  # padding wraps to the start of the order, as in DistributedSampler
            g = self.start + self.rank + np.arange(lo, hi, dtype=np.int64) * self.world
            idx = self.order.lookup(g % self.order.n) if g.size else []
        return self.key(b), (idx[0] if self.single else idx)

    def end_position(self, b: int) -> int:
        """The global position after batch ``b`` (past ``n`` for a padded last batch)."""
        return self.start + min((b + 1) * self.bs, self.per_rank) * self.world


class BatchListPlan:
    """The batches a custom ``batch_sampler`` yielded this epoch, from sample ``start`` on."""

    def __init__(self, batches: list, start: int):
        self.batches = batches
        ends = np.cumsum([len(b) for b in batches], dtype=np.int64)
        self.ends = ends
        first = int(np.searchsorted(ends, start, side="right")) if start else 0
        if start and (first == 0 or int(ends[first - 1]) != start):
            raise ValueError(f"DataLoader: the state's position {start} is not at a batch boundary of "
                             f"this epoch's batch_sampler (batch ends {ends[:8].tolist()}...); the "
                             "batch_sampler must yield the same batches when resumed")
        self.first = first

    def __len__(self) -> int:
        return len(self.batches) - self.first

    def key(self, b: int) -> int:
        """The position (samples of the epoch) where batch ``b`` starts."""
        i = self.first + b
        return int(self.ends[i - 1]) if i else 0

    def batch_of(self, key: int) -> Optional[int]:
        """The batch starting at position ``key``, or ``None``."""
        b = (int(np.searchsorted(self.ends, key, side="right")) if key else 0) - self.first
        return b if 0 <= b < len(self) and self.key(b) == key else None

    def batch(self, b: int) -> tuple[int, list]:
        return self.key(b), list(self.batches[self.first + b])

    def end_position(self, b: int) -> int:
        return int(self.ends[self.first + b])


def materialise_batches(batch_sampler: Any) -> list:
    """The batches of one pass over ``batch_sampler``, as lists of indices."""
    return [list(b) for b in iter(batch_sampler)]


# -- the O(1)-memory shuffle sampler -------------------------------------------------------------

class BijectiveShuffleSampler(torch.utils.data.Sampler):
    """A shuffling sampler in O(1) memory: a keyed bijection of ``[0, n)`` per epoch.

    Item ``i`` of epoch ``e``'s order is computed on demand by a Feistel network keyed by
    ``derive_seed(seed, "shuffle", e)``, so nothing of size ``n`` is ever built and any
    position is reached in O(1). Use it for datasets of 10**8 to 10**10 items, where
    ``shuffle=True`` would materialise an ``n``-int permutation (8 bytes per item) per epoch
    and per worker. :class:`seqloader.DataLoader` recognises it (``sampler=``) and seeks into it
    directly, with the loader's epoch; with torch's ``DataLoader`` call :meth:`set_epoch`.

    Args:
        data_source: the dataset (only ``len`` is used).
        seed: an int in ``[0, 2**64)``; ``None`` draws one from torch's default generator.

    Raises:
        TypeError, ValueError: ``seed`` is not an int in ``[0, 2**64)``.

    Example:
        >>> s = BijectiveShuffleSampler(range(10), seed=3)
        >>> sorted(s) == list(range(10)), len(s)
        (True, 10)
        >>> s.set_epoch(1); list(s) != list(BijectiveShuffleSampler(range(10), seed=3))
        True
        >>> list(BijectiveShuffleSampler([], seed=0))
        []
    """

    def __init__(self, data_source: Sequence, seed: Optional[int] = None):
        self.data_source = data_source
        self.seed = draw_seed() if seed is None else check_seed("BijectiveShuffleSampler", seed)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.data_source)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order :meth:`__iter__` yields (for torch's DataLoader)."""
        self.epoch = check_nonnegative_int("BijectiveShuffleSampler.set_epoch", "epoch", epoch)

    def order(self, epoch: int) -> _Bijective:
        """The order of ``epoch`` as used by :class:`seqloader.DataLoader`."""
        return _Bijective(len(self), derive_seed(self.seed, "shuffle", epoch))

    def __iter__(self) -> Iterator[int]:
        order = self.order(self.epoch)
        chunk = 1 << 16
        for lo in range(0, order.n, chunk):
            yield from order.run(lo, min(chunk, order.n - lo), 1)

    def state_dict(self) -> dict:
        """``{"seed": int}``; the loader keeps the epoch itself."""
        return {"seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Restore the seed saved by :meth:`state_dict`."""
        self.seed = check_seed("BijectiveShuffleSampler.load_state_dict", state["seed"])

    def __repr__(self) -> str:
        return f"BijectiveShuffleSampler(len={len(self)}, seed={self.seed})"
