"""L3: the decoded-block caches of a pipeline's sources, sized from what the loader knows.

A columnar source (``parquet``, ``arrow_ipc``) keeps decoded blocks (row groups, record
batches) in one cache per process, shared by that process's threads. How many it must keep so
that an epoch decodes each block once per process depends on things the source cannot see and
the loader can: the order (a :class:`~seqloader.BlockShuffleSampler` reads ``window`` blocks at a
time in each of its ``lanes``), where batches run (each worker process has its own cache and
reads its lane; thread workers share the training process's cache and read every lane) and the
batch that crosses from one window of a lane to the next (it reads both: one window more).
:func:`blocks_in_use` is that arithmetic, and
:func:`size_block_caches` hands its answer to each source of the pipeline when an epoch opens,
before workers start (so worker processes and Ray actors get it with the dataset).

A source built with an explicit ``cache_blocks=N`` keeps ``N`` (a cap: its owner decided); one
built with the default (``cache_blocks=None``) takes the loader's number, the largest any
loader asked for (two loaders over one source each get what they need). Orders other than a
block shuffle leave the source's own default: a full shuffle reads rows from everywhere (no
cache of fewer than all the blocks helps), a sequential read needs two blocks at a time.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from seqloader.loader.pipeline.walk import pipeline_sources
from seqloader.loader.samplers.shuffle import BlockShuffleSampler
from seqloader.prefetcher.options import ProcessWorkers, ThreadWorkers

__all__ = ["MOST_PREFETCH", "blocks_in_use", "prefetch_depth", "size_block_caches", "window_batches", "window_rows"]

#: The deepest read-ahead a loader derives per worker (batches; ``prefetch_factor`` when given is kept).
MOST_PREFETCH = 32


def blocks_in_use(window: Optional[int], lanes: int, num_blocks: int, num_workers: int, executor: Any,
                  affinity: bool = True, ahead: bool = False) -> int:
    """The decoded blocks one process's cache must keep so that a block shuffle decodes each block
    once per epoch in that process.

    Each reader of a cache reads its lanes one window after another. A cache serves ``lanes_read``
    lanes: every lane at ``num_workers=0`` and under thread workers (one cache for the process);
    under worker processes (or Ray actors) with ``affinity`` (batch ``b`` on worker
    ``b % num_workers``, lane ``b % lanes``), ``lanes / gcd(lanes, num_workers)`` (one when
    ``lanes == num_workers``), else every lane. One window more: the batch that crosses from one
    window of a lane to the next reads rows of both (its rows of the old window from all over
    it), and so does a thread that moves on to the next window while the others finish theirs.
    So ``window * (lanes_read + 1)``, at most ``num_blocks`` (``window=None``, a full shuffle, is
    one window of every block; ``window=0``, no shuffle, reads one block at a time in each lane).
    Without the extra window, the blocks of the crossing batch find no free slot: they are kept
    outside the reused buffers, and the next window's batches gather block by block. With
    ``ahead`` (the next window of each lane decoded while the current one is read:
    :mod:`seqloader.loader.epoch.read_ahead`) one window more per lane read.

    Args:
        window: the sampler's ``window`` (``None``: a full shuffle).
        lanes: the sampler's ``lanes`` (``>= 1``).
        num_blocks: blocks in the sampler's order.
        num_workers: the loader's ``num_workers``.
        executor: the loader's ``executor`` (:class:`~seqloader.prefetcher.options.ProcessWorkers`,
            :class:`~seqloader.prefetcher.options.ThreadWorkers` or a ``RayWorkers``).
        affinity: batches go to worker ``b % num_workers`` (the loader's ``in_order=True``).
        ahead: the loader decodes each lane's next window ahead.

    Returns:
        An int ``>= 1``.

    Example:
        >>> blocks_in_use(8, 2, 100, 2, ThreadWorkers())              # one cache, 2 lanes
        24
        >>> blocks_in_use(8, 2, 100, 2, ProcessWorkers())             # a cache per process, its lane
        16
        >>> blocks_in_use(8, 2, 100, 2, ProcessWorkers(threads=4))    # its lane, 4 threads
        16
        >>> blocks_in_use(8, 1, 100, 0, ProcessWorkers()), blocks_in_use(8, 2, 20, 2, ThreadWorkers())
        (16, 20)
        >>> blocks_in_use(None, 1, 100, 0, ProcessWorkers()), blocks_in_use(0, 1, 100, 0, ProcessWorkers())
        (100, 2)
        >>> blocks_in_use(8, 2, 100, 2, ThreadWorkers(), ahead=True), blocks_in_use(8, 1, 100, 0, None, ahead=True)
        (40, 24)
    """
    w = max(1, num_blocks) if window is None else max(1, window)
    lanes = max(1, lanes)
    if num_workers == 0 or isinstance(executor, ThreadWorkers) or ahead:   # (one cache reads every lane)
        lanes_read = lanes
    else:   # a process (or a Ray actor) per worker, each with its cache
        lanes_read = lanes // math.gcd(lanes, num_workers) if affinity else lanes
    need = w * (lanes_read * (2 if ahead else 1) + 1)
    return max(1, min(need, max(1, num_blocks)))


def size_block_caches(dataset: Any, sampler: Any, num_workers: int, executor: Any, affinity: bool = True,
                      ahead: bool = False) -> None:
    """Tell each source of ``dataset`` that sizes its cache itself (``cache_blocks=None``) how many
    blocks this loader's readers use at once (:func:`blocks_in_use`; ``ahead``: with each lane's
    next window decoded ahead), when ``sampler`` is a :class:`~seqloader.BlockShuffleSampler`;
    otherwise nothing changes.

    Example:
        >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq, seqloader
        >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
        >>> pq.write_table(pa.table({"x": list(range(100))}), path, row_group_size=10)
        >>> src = seqloader.parquet(path, columnar=True)
        >>> sampler = seqloader.BlockShuffleSampler(src, window=2, seed=0, lanes=2, chunk=4)
        >>> size_block_caches(src, sampler, 2, ThreadWorkers()); src.cache_blocks
        6
        >>> fixed = seqloader.parquet(path, cache_blocks=3)
        >>> size_block_caches(fixed, sampler, 2, ThreadWorkers()); fixed.cache_blocks   # a cap is kept
        3
    """
    if not isinstance(sampler, BlockShuffleSampler):
        return
    sources = [s for s in pipeline_sources(dataset) if callable(getattr(s, "size_cache", None))]
    if not sources:
        return
    blocks = blocks_in_use(sampler.window, sampler.lanes or 1, len(sampler.block_ends), num_workers, executor,
                           affinity, ahead)
    for src in sources:
        src.size_cache(blocks)


def prefetch_depth(dataset: Any, sampler: Any, batch_size: Optional[int], executor: Any) -> Optional[int]:
    """The batches in flight per worker process (``prefetch_factor``) that a block shuffle of a
    columnar source reads best with, when the user left ``prefetch_factor`` out; ``None``
    elsewhere (torch's 2).

    The first batch of a window decodes the window (for 8 Parquet row groups of 1,000 rows, about
    30 ms). The loader yields batches in order, so while one worker decodes, the training loop
    reads on only as far as that worker's batches computed before: with torch's 2 it soon waits,
    and the other workers, their own 2 done, wait too (issue 43: two worker processes slower than
    none). Half a lane's window of batches covers the decode, so that is the depth: ``window *
    rows of the smallest block // (2 * batch_size)``, between 2 and :data:`MOST_PREFETCH`. What
    it holds per worker is at most half a window of rows, less than the cache keeps decoded, in
    shared-memory slots reused from batch to batch. Worker processes only: thread workers hand
    batches over by reference, and a deeper read-ahead there outgrows the reused batch buffers
    (fresh arrays faulted in: measured slower, docs/benchmarks.md, issue 43).

    Example:
        >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq, seqloader
        >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
        >>> pq.write_table(pa.table({"x": list(range(20_000))}), path, row_group_size=1000)
        >>> src = seqloader.parquet(path, columnar=True)
        >>> shuffle = seqloader.BlockShuffleSampler(src, window=8, seed=0)
        >>> prefetch_depth(src, shuffle, 64, ProcessWorkers()), prefetch_depth(src, shuffle, 64, ThreadWorkers())
        (32, None)
        >>> prefetch_depth(src, shuffle, 256, ProcessWorkers())
        15
        >>> prefetch_depth(src, seqloader.BlockShuffleSampler(src, window=1, seed=0), 500, ProcessWorkers())
        2
        >>> prefetch_depth(src, None, 64, ProcessWorkers()), prefetch_depth(list(range(9)), shuffle, 64, ProcessWorkers())
        (None, None)
    """
    rows = window_rows(sampler)
    if not isinstance(executor, ProcessWorkers) or rows is None or not batch_size \
            or not callable(getattr(dataset, "size_cache", None)):
        return None
    return max(2, min(MOST_PREFETCH, rows // (2 * batch_size)))


def window_rows(sampler: Any) -> Optional[int]:
    """The fewest rows a window of ``sampler`` holds (``window`` times the smallest block's rows),
    or ``None`` unless it is a :class:`~seqloader.BlockShuffleSampler` with a ``window`` over
    some blocks: what a lane reads between two windows' decodes.

    Example:
        >>> shuffle = BlockShuffleSampler(range(30), blocks=[10, 25, 30], window=2, seed=0)
        >>> window_rows(shuffle), window_rows(BlockShuffleSampler(range(30), blocks=[30], window=None, seed=0))
        (10, None)
    """
    if not isinstance(sampler, BlockShuffleSampler) or sampler.window is None or len(sampler.block_ends) == 0:
        return None
    return max(1, sampler.window) * int(np.diff(sampler.block_ends, prepend=0).min())


def window_batches(sampler: Any, batch_size: Optional[int]) -> Optional[int]:
    """The loader's batches between two windows of a lane of ``sampler`` (every lane reads one
    window in that many): ``lanes * floor(window_rows / batch_size)``, at least ``lanes``; ``None``
    where :func:`window_rows` is, or without a ``batch_size``. A lane's next window must be decoded
    by then: the cycle of a block shuffle's decodes (read-ahead's distance, a trial's length).

    Example:
        >>> shuffle = BlockShuffleSampler(range(4000), blocks=list(range(100, 4001, 100)), window=8, seed=0, lanes=2)
        >>> window_batches(shuffle, 64), window_batches(shuffle, 1000), window_batches(shuffle, None)
        (24, 2, None)
    """
    rows = window_rows(sampler)
    if rows is None or not batch_size:
        return None
    lanes = max(1, sampler.lanes or 1)
    return lanes * max(1, rows // batch_size)
