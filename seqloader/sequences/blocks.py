"""``block_shuffle``: a locality-aware shuffle that reads contiguous blocks of its input.

An :class:`~seqloader.sequences.base.IndexMap` over
:class:`seqloader.orders.block_permutation.BlockPermutation` (the definition, the tail rule of lanes and
the costs are in that module's docstring): blocks (Parquet row groups, tar shards) are taken in
a keyed random order and rows are mixed within windows of ``window`` consecutive blocks, so a
reader decodes about ``window`` blocks at a time instead of one row from everywhere.
"""

from __future__ import annotations

from typing import Any, Sequence, TypeVar

import numpy as np

from seqloader.orders.block_permutation import BlockPermutation, check_block_ends, check_window
from seqloader.errors import check_positive_int
from seqloader.rng import check_seed
from seqloader.sequences._util import check_sequence
from seqloader.sequences.base import IndexMap, LazySequence, Positions
from seqloader.sequences.describe import Stage, digest

__all__ = ["block_shuffle"]

T = TypeVar("T")


def _block_ends(blocks: Any, n: int) -> Any:
    """Cumulative block ends from ``blocks`` (ends, or an object whose ``blocks()`` returns them)."""
    if callable(getattr(blocks, "blocks", None)):
        blocks = blocks.blocks()
    ends = check_block_ends("block_shuffle", blocks)
    total = int(ends[-1]) if len(ends) else 0
    if total != n:
        raise ValueError(f"block_shuffle: the last block end is {total} but len(seq) is {n}; blocks must be the "
                         "cumulative ends of seq's blocks (numpy.cumsum(sizes))")
    return ends


class _BlockShuffle(IndexMap[T]):
    def __init__(self, seq: Sequence[T], blocks: Any, window: int | None, seed: int, lanes: int, chunk: int):
        n = check_sequence("block_shuffle", "seq", seq)
        ends = _block_ends(blocks, n)
        window = check_window("block_shuffle", window)
        seed = check_seed("block_shuffle", seed)
        lanes = check_positive_int("block_shuffle", "lanes", lanes)
        chunk = check_positive_int("block_shuffle", "chunk", chunk)
        self._perm = BlockPermutation(ends, window, seed, lanes, chunk)
        self._parent = seq


    def _position_stage(self) -> Stage:
        p = self._perm
        return Stage("block_shuffle", {"window": p._window, "seed": p._seed, "lanes": p._lanes, "chunk": p._chunk,
                                       "blocks": digest(np.asarray(p._ends, dtype=np.int64).tobytes(), 12)},
                     (self._parent,))

    def __len__(self) -> int:
        return self._perm.n

    def _source_index(self, i: int) -> int:
        return self._perm.index(i)

    def _source_indices(self, idx: Positions) -> Positions:
        return self._perm(idx)

    def __repr__(self) -> str:
        p = self._perm
        return (f"block_shuffle(blocks={len(p.block_ends)}, window={p.window}, seed={p.seed}, lanes={p.lanes}, "
                f"chunk={p.chunk}, len={p.n})")


def block_shuffle(seq: Sequence[T], blocks: Any, *, window: int | None, seed: int, lanes: int = 1,
                  chunk: int = 1) -> LazySequence[T]:
    """A shuffle of ``seq`` that keeps reads within a few contiguous blocks at a time.

    Item ``i`` is ``seq[P(i)]`` with ``P`` a :class:`~seqloader.orders.block_permutation.BlockPermutation`:
    the blocks are taken in a keyed random order, and rows are mixed within each window of
    ``window`` consecutive (permuted) blocks. With ``lanes=num_workers`` and
    ``chunk=batch_size``, batch ``b`` only reads the blocks of lane ``b % num_workers``, a
    contiguous share of the windowed order, so each worker decodes only its own blocks (about
    1x the data per epoch instead of ``num_workers`` x). O(number of blocks) memory; any item of
    any epoch is computed directly.

    Args:
        seq: the input sequence.
        blocks: the cumulative *ends* of ``seq``'s contiguous blocks (``numpy.cumsum(sizes)``,
            the last one equal to ``len(seq)``; zero-size blocks are allowed), or an object with
            a ``blocks()`` method returning them (a data source: ``block_shuffle(src, src, ...)``).
        window: ``0`` (no shuffle: sequential within each lane), ``k >= 1`` (rows mixed within
            groups of ``k`` blocks; ``1``: within each block) or ``None`` (a full shuffle).
        seed: an int in ``[0, 2**64)``; use one per epoch
            (e.g. ``derive_seed(seed, "block_shuffle", epoch)``).
        lanes: ``>= 1``; chunk ``c`` (positions ``c*chunk ..``) reads lane ``c % lanes``.
        chunk: ``>= 1`` positions per chunk.

    Returns:
        A lazy sequence of ``len(seq)`` items.

    Raises:
        TypeError: ``seq`` is not a sequence, or an argument has the wrong type.
        ValueError: ``blocks`` are not non-decreasing ends ending at ``len(seq)``, or an
            argument is out of range.

    Example:
        >>> s = block_shuffle(range(12), [4, 8, 12], window=1, seed=0)
        >>> [sorted(s[k:k + 4]) for k in (0, 4, 8)]
        [[0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7]]
        >>> list(block_shuffle(range(6), [3, 6], window=0, seed=0, lanes=2, chunk=2))
        [0, 1, 4, 5, 2, 3]
        >>> block_shuffle(range(12), [4, 8], window=1, seed=0)
        Traceback (most recent call last):
        ValueError: block_shuffle: the last block end is 8 but len(seq) is 12; blocks must be the cumulative ends of seq's blocks (numpy.cumsum(sizes))
    """
    return _BlockShuffle(seq, blocks, window, seed, lanes, chunk)

