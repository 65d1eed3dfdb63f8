"""One epoch of a map-style ``seqloader.DataLoader``: :class:`MapIterator`.

It reads the epoch's batch sequence (:class:`~seqloader.loader.epoch.batches.EpochBatches`), in order,
from the main process or from the workers' :class:`~seqloader.prefetcher.prefetch.Prefetch`, and
moves the loader's :class:`~seqloader.loader.state.progress.Progress` forward as batches are yielded.
The read step itself is :meth:`~seqloader.loader.epoch.iterator.LoaderIterator._read`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from seqloader.loader.epoch.iterator import LoaderIterator, Opened
from seqloader.loader.state.progress import EPOCH, NONE, Progress
from seqloader.loader.tuning.stats import LoaderStats

__all__ = ["MapIterator", "Reopen"]

#: The loader's answer at an iterator's first ``next()`` (``settle``: follow a ``set_epoch`` since
#: ``iter()``) and after a recipe change: the epoch to read instead of ``current`` (``used_up``:
#: nothing of ``current`` is left), else ``None``.
Reopen = Callable[[Opened, bool, bool], Optional[Opened]]


class MapIterator(LoaderIterator):
    """Reads one epoch's batch sequence and advances the loader's progress.

    In order by default. With ``in_order=False`` and workers, batches come in completion order
    (:meth:`~seqloader.prefetcher.prefetch.Prefetch.take`): the progress is then a *watermark*
    (every batch before it was yielded) plus the keys of the few batches yielded beyond it, and
    a resume skips those, so each batch is yielded exactly once.

    The epoch's order is settled at the first ``next()``, not at ``iter()``: frameworks call
    ``set_epoch`` (on the loader or on its sampler) after ``iter()``, and if that changed what the
    loader reads, ``reopen`` returns the epoch to read instead (the workers' read-ahead is dropped).
    A custom sampler is iterated there, once (``opened.unread`` until then).

    A batch whose computation raises is consumed, as in torch: the error propagates, the progress
    counts the batch as done and the next ``next()`` reads the following batch. After the last
    batch the position is the end of the epoch; the following ``next()`` raises ``StopIteration``
    and ends the epoch (a state saved in between resumes into that empty remainder), unless
    ``set_epoch`` already moved the loader to another epoch.
    """

    def __init__(self, opened: Opened, progress: Progress, generation: int, stats: LoaderStats,
                 pin_device: Optional[str], timeout: float, window: int, reopen: Reopen, owner: Any):
        super().__init__(opened, progress, generation, stats, pin_device, timeout, window, owner)
        self._reopen = reopen
        self._settled = False
        self._left = self._remaining(opened)

    @staticmethod
    def _remaining(opened: Opened) -> int:
        return len(opened.seq) - opened.watermark.low - len(opened.watermark.above)  # it counts from 0

    def __len__(self) -> int:
        unread = self._opened.unread  # a custom sampler's epoch before its first next(): torch's len
        return len(self._opened.seq) if unread is None else unread()

    def _settle(self) -> None:
        """Before the first batch: read another epoch if ``set_epoch`` changed it since ``iter()``."""
        self._settled = True
        self._swap(self._reopen(self._opened, self._left == 0, True))

    def _swap(self, replacement: Optional[Opened]) -> None:
        if replacement is not None:
            if replacement.source is not self._opened.source:
                self._release()
            self._opened = replacement
            self._left = self._remaining(replacement)

    def _next(self) -> Any:
        progress = self._progress
        if not self._settled:
            self._settle()
        else:
            change = progress.mark().since(self._opened.mark)
            if change is not NONE:
                if change is EPOCH:  # set_epoch() moved on after this epoch's last batch
                    self._finish()
                    raise StopIteration
                # RECIPE: what the epoch reads changed: drop the read-ahead, read on from the frontier
                self._swap(self._reopen(self._opened, self._left == 0, False))
        if self._left == 0:  # the epoch is over (or was empty)
            self._finish()
            progress.end_epoch()
            raise StopIteration
        try:
            _, batch = self._read()
        finally:  # a batch that raised is consumed too
            if self._left == 0:
                self._release()
        return self._pinned(batch)

    def _consumed(self, b: Optional[int]) -> None:
        """Batch ``b`` was consumed: move the watermark and the progress."""
        if b is None:
            return
        self._left -= 1
        opened = self._opened
        watermark = opened.watermark
        watermark.consume(b)
        seq = opened.seq
        position = opened.start if watermark.low == 0 else seq.end_position(watermark.low - 1)
        above = watermark.above
        self._progress.advance(position, tuple(sorted(seq.key(k) for k in above)) if above else (),
                               opened.step + watermark.low)
