"""One epoch over an ``IterableDataset``: :class:`IterableIterator`, reading the streams of
:class:`~seqloader.loader.epoch.streams.StreamBatches` round-robin (the map-style counterpart is
:mod:`seqloader.loader.epoch.map_iterator`; the read step is
:meth:`~seqloader.loader.epoch.iterator.LoaderIterator._read`).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from seqloader.loader.epoch.iterator import LoaderIterator, Opened
from seqloader.loader.state.progress import Progress
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.loader.torch_compat.words import iterable_length_warning

__all__ = ["IterableIterator"]


class IterableIterator(LoaderIterator):
    """One epoch over an ``IterableDataset``: reads its stream items, skips ended turns, records
    each stream's progress, and ends the epoch when every stream has ended.

    With workers and ``in_order=False`` (or when resuming a state saved that way) items are taken
    as they complete (:meth:`~seqloader.prefetcher.prefetch.Prefetch.take`): a slow stream holds
    up only its own worker. Each stream's batches still come in the stream's order (its worker
    computes them one after another, and replies are read in arrival order), so the per-stream
    records stay exact; the position is then a watermark (every item before it was yielded or
    skipped) plus the items yielded above it (``ahead``), as for a map-style dataset.

    At ``num_workers=0`` stream 0 is opened (``iter(dataset)``) when the iterator is built, as
    torch's single-process iterator does.
    """

    def __init__(self, opened: Opened, progress: Progress, generation: int, stats: LoaderStats,
                 pin_device: Optional[str], timeout: float, window: int, owner: Any,
                 length_check: Optional[tuple[int, Any, int]] = None):
        super().__init__(opened, progress, generation, stats, pin_device, timeout, window, owner)
        # (len(loader) when it was read, the dataset, num_workers): more batches than that warn, as torch
        self._length_check, self._yielded = length_check, 0
        streams = progress.iterable
        assert streams is not None  # an iterable loader's progress has streams
        if opened.source is opened.seq:
            stream = opened.seq.stream(0)
            if not stream.ended:
                streams.record(0, stream.batches, stream.state)
        self._ended = {w for w, s in enumerate(streams.workers) if s["exhausted"]}

    def _consumed(self, i: Optional[int]) -> None:
        """Item ``i`` was consumed: move the watermark and the progress."""
        if i is None:
            return
        watermark = self._opened.watermark
        watermark.consume(i)
        self._progress.advance(watermark.low, tuple(sorted(watermark.above)) if watermark.above else ())

    def _next(self) -> Any:
        progress = self._progress
        streams = progress.iterable
        assert streams is not None
        while len(self._ended) < len(streams.workers):
            _, out = self._read()
            if out.ended:
                self._ended.add(out.stream)
                streams.mark_exhausted(out.stream, out.state)
                continue
            streams.record(out.stream, out.batches, out.state)
            self._yielded += 1
            if self._length_check is not None and self._yielded > self._length_check[0]:
                reported, dataset, num_workers = self._length_check
                warnings.warn(iterable_length_warning(dataset, reported, self._yielded, num_workers), stacklevel=3)
            return self._pinned(out.batch)
        self._finish()
        progress.end_epoch()
        raise StopIteration
