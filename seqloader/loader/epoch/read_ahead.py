"""L3: workers over a block source: they decode blocks ahead, the training thread cuts the batches.

A :class:`~seqloader.BlockShuffleSampler` reads ``window`` blocks at a time in each lane, and the
first batch of a window needs every block of it. What costs is the decode of a block (about
4 ms for a Parquet row group of 1,000 rows of 512 tokens, the GIL released); cutting a batch
from decoded blocks is a gather, tens of microseconds. Thread workers that compute whole
batches hand every batch from one thread to another, and each hand-off wakes a thread: on a
2-core machine issue 43 measured ~9 context switches per batch, 1.9x the CPU of no worker and
0.57-0.73x its speed. So under ``worker_method="thread"``, when the dataset is such a source
(``parquet(...)``, ``arrow_ipc(...)`` of local files, the loader sizing its cache), the sampler a
block shuffle with ``window`` set, batches have a ``batch_size`` and no ``worker_init_fn`` is given,
the ``num_workers`` threads are *decode threads*: while batch ``b`` is cut (in the training
thread, as at ``num_workers=0``), the blocks of batch ``b + distance`` (the same lane, one window
later) go to the source's :meth:`decode_ahead <seqloader.sources._table.TableSource.decode_ahead>`,
and at most ``num_workers`` threads of the process decode them (they end when none is left). The
first batch asks for every lane's first window too, so that the decode threads share them. A
block whose decode has not begun when a batch needs it is decoded by the training thread (it never
waits behind the queue). Batches are those of ``num_workers=0``: only when a block is decoded
changes, every value comes from the one decode of its block.

Worker processes (``worker_method="process"``, the default, without ``threads_per_worker`` or
``max_worker_restarts``, ``collate_fn`` torch's ``default_collate`` or ``default_convert``) do the
same over a source without a ``transform`` whose blocks are copied into slot buffers (Parquet; not
an Arrow IPC file's memory map): the ``num_workers`` processes are *decode
processes* (:class:`~seqloader.prefetcher.decoders.BlockDecoders`), each decode thread of the
training process hands its block to one and waits (no GIL held), and the process writes the
block into the arena's shared buffers. The processes live as the loader's workers do (an
iterator's, or the loader's with ``persistent_workers``). Elsewhere (other datasets, a
``worker_init_fn``, other executors) workers compute whole batches, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from torch.utils.data import default_collate, default_convert

from seqloader.loader.epoch.block_caches import window_batches
from seqloader.prefetcher.options import ProcessWorkers, ThreadWorkers

__all__ = ["ReadAhead", "read_ahead"]

#: The collates that decode processes leave to the training thread (any other runs in the worker processes)
TORCH_COLLATES = (None, default_collate, default_convert)

#: Looks ahead per window and lane: a later look finds the window's blocks claimed (a set lookup).
LOOKS_PER_WINDOW = 8


@dataclass(frozen=True)
class ReadAhead:
    """While batch ``b`` is cut, ask for the blocks of batch ``b + distance``, once every
    ``every`` batches of a lane (``lanes`` lanes, the epoch's batch ``g`` in lane ``g % lanes``),
    decoded by at most ``threads`` threads; the plan's batch 0 asks for the first batch of every
    lane too. ``plan`` is an :class:`~seqloader.orders.plans.OrderPlan`: ``window_rows`` names
    one row of each block of the window a batch starts in (a few binary searches, the order's
    cache left alone). A plan that starts mid-epoch (a resume, an autotune switch) starts
    ``plan.start`` samples in: the looks are counted from the epoch's start, so that they keep
    their place in each lane's windows (counted from the plan's first batch, a plan that starts
    an odd number of batches in looks for each lane's next window out of step with the lanes, and
    issue 43 measured thread workers 15% slower for the rest of the epoch).
    ``processes``: each thread has a decode process decode its block (worker processes: the
    loader gives ``decoders``, a :class:`~seqloader.prefetcher.decoders.BlockDecoders`, whose
    failure each look raises).

    Example:
        >>> ahead = ReadAhead(distance=250, every=15, lanes=2, threads=2)
        >>> [b for b in range(64) if ahead.looks(b)]
        [0, 1, 30, 31, 60, 61]
    """

    distance: int
    every: int
    lanes: int
    threads: int
    processes: bool = False
    decoders: Any = field(default=None, repr=False, compare=False)

    def looks(self, g: int) -> bool:
        """Whether the epoch's batch ``g`` looks ahead."""
        return (g // self.lanes) % self.every == 0

    def __call__(self, dataset: Any, plan: Any, b: int) -> None:
        """Batch ``b`` of ``plan`` is about to be cut: hand the blocks of ``b + distance`` to ``dataset``."""
        if not self.looks(b + plan.start // max(1, plan.bs * plan.world)) and b != 0:
            return
        how: tuple = (self.threads,)
        if self.decoders is not None:   # (a decode process that died raises here, in the training thread)
            self.decoders.check()
            how = (self.threads, self.decoders.handle)
        if b == 0:   # (the lanes' first windows: the decode threads share them with this thread)
            for first in range(min(self.lanes, len(plan))):
                dataset.decode_ahead(plan.window_rows(first), *how)
        if b + self.distance < len(plan):
            dataset.decode_ahead(plan.window_rows(b + self.distance), *how)


def read_ahead(loader: Any, dataset: Any, sampler: Any) -> Optional[ReadAhead]:
    """The :class:`ReadAhead` of ``loader`` over ``dataset`` in ``sampler``'s order, or ``None``
    where its thread workers compute whole batches (see the module docstring). ``distance`` is a
    window of one lane in batches, ``lanes * floor(window * rows of the smallest block /
    batch_size)``: the batch it looks at is in the same lane's next window, never the one after
    (which has no room yet).

    Example:
        >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq, seqloader
        >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
        >>> pq.write_table(pa.table({"x": list(range(4000))}), path, row_group_size=100)
        >>> src = seqloader.parquet(path, columnar=True)
        >>> sampler = seqloader.BlockShuffleSampler(src, window=8, seed=0)
        >>> loader = seqloader.DataLoader(src, batch_size=64, sampler=sampler, num_workers=2, worker_method="thread")
        >>> read_ahead(loader, src, sampler)
        ReadAhead(distance=24, every=1, lanes=2, threads=2, processes=False)
        >>> read_ahead(seqloader.DataLoader(src, batch_size=64, sampler=sampler, num_workers=2), src, sampler)
        ReadAhead(distance=24, every=1, lanes=2, threads=2, processes=True)
        >>> read_ahead(seqloader.DataLoader(src, batch_size=64, sampler=sampler), src, sampler) is None   # no workers
        True
    """
    executor = loader.executor
    processes = isinstance(executor, ProcessWorkers) and executor.threads == 1 and not loader.max_worker_restarts
    if processes and loader.collate_fn not in TORCH_COLLATES:   # (a collate of the user's stays in the workers)
        return None
    if not loader.num_workers or not (processes or isinstance(executor, ThreadWorkers)) or \
            loader.worker_init_fn is not None:
        return None
    distance = window_batches(sampler, loader.batch_size)   # (a window's fewest rows: never two windows ahead)
    decodes = getattr(dataset, "decodes_in_processes" if processes else "decodes_ahead", None)
    if distance is None or len(sampler.block_ends) < 2 or not callable(decodes) or not decodes():
        return None
    lanes = max(1, sampler.lanes or 1)
    return ReadAhead(distance=distance, every=max(1, distance // lanes // LOOKS_PER_WINDOW), lanes=lanes,
                     threads=loader.num_workers, processes=processes)
