"""Samplers whose epoch order is computed, not stored: seekable in O(1) by ``seqloader.DataLoader``.

Both are torch ``Sampler`` s (they work with torch's ``DataLoader`` too, with :meth:`set_epoch`),
and both expose ``order(epoch)``: an :class:`~seqloader.orders.orders.Order` that
:class:`seqloader.DataLoader` reads directly, so a resume is a seek and nothing of size ``n`` is
built:

* :class:`BijectiveShuffleSampler`: a Feistel bijection of ``[0, n)`` per epoch (a full shuffle);
* :class:`BlockShuffleSampler`: a *block* shuffle (:class:`~seqloader.orders.block_permutation.BlockPermutation`)
  over a source's contiguous blocks (Parquet row groups, tar shards): reads a few blocks at a time,
  and with ``lanes`` each loader worker reads only its own blocks.

Their state is their seed (and the block sampler's geometry); the loader keeps the epoch.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

import torch.utils.data

from seqloader.orders.block_permutation import BlockPermutation, check_block_ends, check_window
from seqloader.errors import check_nonnegative_int, check_positive_int
from seqloader.orders.orders import BijectiveOrder, BlockOrder, Order
from seqloader.loader.world import draw_seed
from seqloader.rng import check_seed, derive_seed

__all__ = ["BijectiveShuffleSampler", "BlockShuffleSampler", "SeekableSampler"]


class SeekableSampler(torch.utils.data.Sampler):
    """A sampler whose epoch order is an :class:`~seqloader.orders.orders.Order` (``order(epoch)``).

    ``seqloader.DataLoader`` reads :meth:`order` with its own epoch instead of iterating; torch's
    ``DataLoader`` iterates the order of :attr:`epoch` (set with :meth:`set_epoch`).
    """

    seed: int
    epoch: int

    def order(self, epoch: int) -> Order:  # pragma: no cover - abstract
        """The order of ``epoch``."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order :meth:`__iter__` yields (for torch's DataLoader)."""
        self.epoch = check_nonnegative_int(f"{type(self).__name__}.set_epoch", "epoch", epoch)

    def __iter__(self) -> Iterator[int]:
        order = self.order(self.epoch)
        chunk = 1 << 16
        for lo in range(0, order.n, chunk):
            yield from order.run(lo, min(chunk, order.n - lo), 1)

    def bind(self, num_workers: int, batch_size: Optional[int]) -> None:
        """Called by ``seqloader.DataLoader`` when built with this sampler (default: nothing)."""

    def state_dict(self) -> dict:  # pragma: no cover - abstract
        """The sampler's state (its seed, ...); the loader keeps the epoch."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:  # pragma: no cover - abstract
        """Restore what :meth:`state_dict` saved."""
        raise NotImplementedError


class BijectiveShuffleSampler(SeekableSampler):
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

    def order(self, epoch: int) -> BijectiveOrder:
        """The order of ``epoch`` as used by :class:`seqloader.DataLoader`."""
        return BijectiveOrder(len(self), derive_seed(self.seed, "shuffle", epoch))

    def state_dict(self) -> dict:
        """``{"seed": int}``; the loader keeps the epoch itself."""
        return {"seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Restore the seed saved by :meth:`state_dict`."""
        self.seed = check_seed("BijectiveShuffleSampler.load_state_dict", state["seed"])

    def __repr__(self) -> str:
        return f"BijectiveShuffleSampler(len={len(self)}, seed={self.seed})"


class BlockShuffleSampler(SeekableSampler):
    """A locality-aware shuffle: whole blocks of a source (row groups, shards) in a shuffled order.

    Epoch ``e`` reads ``BlockPermutation(blocks, window, derive_seed(seed, "shuffle", e), lanes,
    chunk, split_seams)``: the blocks in a shuffled order, rows mixed within each window of
    ``window`` consecutive (shuffled) blocks (see ``docs/design.md``, "Block shuffle"). With
    ``lanes`` equal to the loader's ``num_workers`` and ``chunk`` its ``batch_size``, worker ``w``
    reads only lane ``w``'s blocks, so each block is decoded about once per epoch (instead of once
    per worker); ``split_seams`` splits a window that a lane boundary cuts, so that two workers
    share at most one block there instead of a whole window.
    ``lanes=None``/``chunk=None`` are filled in by the first ``seqloader.DataLoader`` built with
    this sampler (``max(1, num_workers)`` and ``batch_size``) and kept in the sampler's state, so a
    resume with another ``num_workers`` reads the same order (exactly; less locally). With torch's
    ``DataLoader`` they default to 1.

    Args:
        data_source: the dataset; its ``blocks()`` gives the block ends unless ``blocks`` is given.
        blocks: the cumulative ends of the contiguous blocks (the last equals ``len(data_source)``).
        window: blocks mixed together: ``0`` no shuffle, ``1`` shuffle within each block, ``k``
            within each group of ``k`` shuffled blocks, ``None`` a full shuffle. Default 8.
        seed: an int in ``[0, 2**64)``; ``None`` draws one from torch's default generator.
        lanes, chunk: positive ints, or ``None`` (see above).
        split_seams: ``True`` (the default) splits the windows cut by lane boundaries; a state
            saved before this argument existed loads as ``False``, its order then.

    Raises:
        TypeError, ValueError: a bad argument, or ``blocks`` that do not end at ``len(data_source)``.

    Example:
        >>> s = BlockShuffleSampler(range(12), blocks=[4, 8, 12], window=1, seed=0, lanes=1, chunk=4)
        >>> order = list(s); sorted(order) == list(range(12)), sorted(order[:4])
        (True, [4, 5, 6, 7])
        >>> BlockShuffleSampler(range(12), blocks=[4, 8], window=1, seed=0)
        Traceback (most recent call last):
        ValueError: BlockShuffleSampler: blocks end at 8 but len(data_source) is 12
    """

    def __init__(self, data_source: Sequence, blocks: Any = None, *, window: Optional[int] = 8,
                 seed: Optional[int] = None, lanes: Optional[int] = None, chunk: Optional[int] = None,
                 split_seams: bool = True):
        op = "BlockShuffleSampler"
        self.data_source = data_source
        if blocks is None:
            if not callable(getattr(data_source, "blocks", None)):
                raise TypeError(f"{op}: blocks= is required when data_source has no blocks() method "
                                f"(got {type(data_source).__name__})")
            blocks = data_source.blocks()  # type: ignore[attr-defined]  # checked just above
        self.block_ends = check_block_ends(op, blocks)
        n = int(self.block_ends[-1]) if len(self.block_ends) else 0
        if n != len(data_source):
            raise ValueError(f"{op}: blocks end at {n} but len(data_source) is {len(data_source)}")
        self.window = check_window(op, window)
        self.seed = draw_seed() if seed is None else check_seed(op, seed)
        self.lanes = None if lanes is None else check_positive_int(op, "lanes", lanes)
        self.chunk = None if chunk is None else check_positive_int(op, "chunk", chunk)
        self.split_seams = _check_split(op, split_seams)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.data_source)

    def bind(self, num_workers: int, batch_size: Optional[int]) -> None:
        """Fill in ``lanes``/``chunk`` left as ``None`` from a loader's ``num_workers``/``batch_size``."""
        if self.lanes is None:
            self.lanes = max(1, num_workers)
        if self.chunk is None:
            self.chunk = batch_size or 1

    def permutation(self, epoch: int) -> BlockPermutation:
        """The bijection of ``epoch``."""
        return BlockPermutation(self.block_ends, self.window, derive_seed(self.seed, "shuffle", epoch),
                                lanes=self.lanes or 1, chunk=self.chunk or 1, split_seams=self.split_seams)

    def order(self, epoch: int) -> BlockOrder:
        """The order of ``epoch`` as used by :class:`seqloader.DataLoader`."""
        return BlockOrder(self.permutation(epoch))

    def state_dict(self) -> dict:
        """``{"seed", "window", "lanes", "chunk", "blocks", "split_seams"}`` (``blocks``: the number of
        blocks; ``split_seams`` absent from states saved before it existed, which read as ``False``)."""
        return {"seed": self.seed, "window": self.window, "lanes": self.lanes, "chunk": self.chunk,
                "blocks": int(len(self.block_ends)), "split_seams": self.split_seams}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved; a different block layout or window raises ``ValueError``."""
        op = "BlockShuffleSampler.load_state_dict"
        for key in ("window", "blocks"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ValueError(f"{op}: {key!r} is {state.get(key)!r} in the state but this sampler has "
                                 f"{mine!r}; build it over the same source with the same window")
        seed = check_seed(op, state["seed"])
        lanes = None if state["lanes"] is None else check_positive_int(op, "lanes", state["lanes"])
        chunk = None if state["chunk"] is None else check_positive_int(op, "chunk", state["chunk"])
        split = _check_split(op, state.get("split_seams", False))
        self.seed, self.lanes, self.chunk, self.split_seams = seed, lanes, chunk, split

    def __repr__(self) -> str:
        return (f"BlockShuffleSampler(len={len(self)}, blocks={len(self.block_ends)}, window={self.window}, "
                f"lanes={self.lanes}, chunk={self.chunk}, split_seams={self.split_seams}, seed={self.seed})")


def _check_split(op: str, split_seams: Any) -> bool:
    if not isinstance(split_seams, bool):
        raise TypeError(f"{op}: split_seams must be a bool (got {type(split_seams).__name__} {split_seams!r})")
    return split_seams

