"""L1 orders: measures of an epoch's order: bytes a loader decodes (locality) and how well it is shuffled.

Both take ``order``, the data indices of an epoch in read order (``perm(np.arange(n))`` for a
:class:`~seqloader.orders.block_permutation.BlockPermutation` ``perm``), and the cumulative ``block_ends``
of the data. Used by the docs, notebooks and benchmarks to choose ``window``; see
``docs/design.md`` ("Block shuffle") for a table.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import numpy.typing as npt

from seqloader.orders.block_permutation import check_block_ends
from seqloader.errors import check_nonnegative_int, check_positive_int

__all__ = ["bytes_read_ratio", "shuffle_quality"]

_I64 = npt.NDArray[np.int64]


def _check_order(op: str, order: Any, n: int) -> _I64:
    a = np.asarray(order)
    if a.ndim != 1 or a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{op}: order must be a 1-D array of ints (got shape {a.shape}, dtype {a.dtype})")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
        raise IndexError(f"{op}: order holds indices outside [0, {n}) of the blocks")
    return a.astype(np.int64)


def _batch_blocks(order: _I64, ends: _I64, batch_size: int) -> list[_I64]:
    """Per batch, the distinct blocks it reads, in the order they are first needed."""
    ids = np.searchsorted(ends, order, side="right")
    out = []
    for lo in range(0, len(ids), batch_size):
        u, first = np.unique(ids[lo:lo + batch_size], return_index=True)
        out.append(u[np.argsort(first)])
    return out


def bytes_read_ratio(order: npt.ArrayLike, block_ends: npt.ArrayLike, *, batch_size: int, num_workers: int,
                     cache_blocks: int, block_bytes: npt.ArrayLike | None = None) -> float:
    """Bytes of blocks decoded over an epoch, divided by the dataset's bytes.

    Simulates a loader: batch ``b`` (positions ``b*batch_size ..``) is computed by worker
    ``b % num_workers``; a worker decodes each distinct block a batch needs once, unless its LRU
    cache of ``cache_blocks`` decoded blocks holds it (``0``: no cache across batches). 1.0 means
    every block was decoded once in all; a sequential order read by ``w`` workers with ``lanes=1``
    gives about ``w``.

    Args:
        order: the epoch's data indices in read order.
        block_ends: cumulative ends of the blocks.
        batch_size, num_workers: ``>= 1``.
        cache_blocks: decoded blocks each worker keeps, ``>= 0``.
        block_bytes: bytes of each block; default: its number of rows.

    Returns:
        The ratio (``0.0`` for an empty dataset).

    Raises:
        TypeError, ValueError, IndexError: malformed arguments, naming them.

    Example:
        >>> ends = [4, 8, 12]
        >>> bytes_read_ratio(list(range(12)), ends, batch_size=2, num_workers=1, cache_blocks=1)
        1.0
        >>> bytes_read_ratio(list(range(12)), ends, batch_size=2, num_workers=2, cache_blocks=1)
        2.0
        >>> bytes_read_ratio([], [], batch_size=2, num_workers=2, cache_blocks=0)
        0.0
    """
    op = "bytes_read_ratio"
    ends = check_block_ends(op, block_ends)
    n = int(ends[-1]) if len(ends) else 0
    bs = check_positive_int(op, "batch_size", batch_size)
    workers = check_positive_int(op, "num_workers", num_workers)
    capacity = check_nonnegative_int(op, "cache_blocks", cache_blocks)
    idx = _check_order(op, order, n)
    sizes = np.diff(ends, prepend=0) if block_bytes is None else np.asarray(block_bytes, dtype=np.float64)
    if sizes.shape != ends.shape:
        raise ValueError(f"{op}: block_bytes must have one entry per block (got {sizes.shape[0]}, "
                         f"{len(ends)} blocks)")
    total = float(sizes.sum())
    if total == 0:
        return 0.0
    caches: list[collections.OrderedDict[int, None]] = [collections.OrderedDict() for _ in range(workers)]
    decoded = 0.0
    for b, blocks in enumerate(_batch_blocks(idx, ends, bs)):
        cache = caches[b % workers]
        for blk in blocks.tolist():
            if blk in cache:
                cache.move_to_end(blk)
                continue
            decoded += float(sizes[blk])
            if capacity:
                cache[blk] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return decoded / total


def shuffle_quality(order: npt.ArrayLike, block_ends: npt.ArrayLike, *, batch_size: int) -> dict[str, float]:
    """How shuffled ``order`` is, in four numbers to compare with a full shuffle.

    Returns:
        ``{"neighbour_distance", "same_block_pairs", "rank_correlation", "blocks_per_batch"}``:
        the mean ``|order[p+1] - order[p]|`` divided by ``(n + 1) / 3`` (its expectation under a
        uniform shuffle: about 1.0 shuffled, near 0 for a local order); the fraction of
        neighbours ``order[p], order[p+1]`` in the same block (about ``1 / blocks`` shuffled, 1.0
        sequential); the correlation between position and data index (about 0 shuffled, 1.0
        sequential); the mean number of distinct blocks in a batch (a full shuffle's is about
        ``min(batch_size, blocks)``).

    Raises:
        TypeError, ValueError, IndexError: malformed arguments, naming them.

    Example:
        >>> q = shuffle_quality(list(range(12)), [4, 8, 12], batch_size=4)
        >>> [round(q[k], 3) for k in ("neighbour_distance", "same_block_pairs", "rank_correlation")]
        [0.231, 0.818, 1.0]
        >>> q["blocks_per_batch"]
        1.0
        >>> shuffle_quality([0], [1], batch_size=4)["rank_correlation"]
        nan
    """
    op = "shuffle_quality"
    ends = check_block_ends(op, block_ends)
    n = int(ends[-1]) if len(ends) else 0
    bs = check_positive_int(op, "batch_size", batch_size)
    idx = _check_order(op, order, n)
    m = len(idx)
    gaps = np.abs(np.diff(idx)).mean() / ((n + 1) / 3) if m > 1 else float("nan")
    ids = np.searchsorted(ends, idx, side="right")
    same = float(np.mean(ids[1:] == ids[:-1])) if m > 1 else float("nan")
    corr = float(np.corrcoef(np.arange(m), idx)[0, 1]) if m > 1 else float("nan")
    per_batch = [len(b) for b in _batch_blocks(idx, ends, bs)]
    return {"neighbour_distance": float(gaps), "same_block_pairs": same, "rank_correlation": corr,
            "blocks_per_batch": float(np.mean(per_batch)) if per_batch else float("nan")}
