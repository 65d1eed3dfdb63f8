"""One epoch of a map-style ``seqloader.DataLoader``: its iterator, and pinning.

:class:`MapIterator` reads the epoch's batch sequence (:class:`~seqloader.loader.fetch.EpochBatches`)
in order, from the main process or from the :class:`~seqloader.prefetcher.prefetch.Prefetch` of
:class:`~seqloader.loader.workers.Workers`, and moves the loader's
:class:`~seqloader.loader.progress.Progress` forward as batches are yielded.
"""

from __future__ import annotations

import errno
import signal
import warnings
from typing import Any, Optional

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from seqloader.loader.fetch import EpochBatches
from seqloader.loader.progress import Progress
from seqloader.loader.global_rngs import Snapshot
from seqloader.loader.stats import LoaderStats
from seqloader.loader.watermark import Watermark
from seqloader.prefetcher.prefetch import ItemTimeout, WorkerDied

__all__ = ["LoaderIterator", "MapIterator", "infrastructure_error", "pin_device", "superseded_error"]


def superseded_error() -> RuntimeError:
    """The error of an iterator whose loader was iterated again or loaded a state."""
    return RuntimeError("DataLoader: this iterator was superseded by a later iter(loader) or "
                        "load_state_dict(); iterate the loader again")


def torch_worker_error(exc: RuntimeError, timeout: float, batch: int) -> RuntimeError:
    """torch's message for a dead worker or a timeout (code matches on it), then seqloader's details.

    Example:
        >>> e = ItemTimeout("prefetch(...): timed out", seconds=5.0, item=3, worker_id=1, pid=42)
        >>> str(torch_worker_error(e, 5, 3))
        'DataLoader timed out after 5 seconds; seqloader: waiting for batch 3 from worker 1 (pid 42)'
    """
    if isinstance(exc, ItemTimeout):
        who = f" from worker {exc.worker_id} (pid {exc.pid})" if exc.pid is not None else ""
        return RuntimeError(f"DataLoader timed out after {timeout} seconds; seqloader: waiting for "
                            f"batch {batch}{who}")
    assert isinstance(exc, WorkerDied)
    if exc.exitcode is not None and exc.exitcode < 0:
        name = signal.strsignal(-exc.exitcode) or f"signal {-exc.exitcode}"
        head = f"DataLoader worker (pid {exc.pid}) is killed by signal: {name}. "
    else:
        head = f"DataLoader worker (pid(s) {exc.pid}) exited unexpectedly. "
    doing = f"while producing batch {exc.item}" if exc.item is not None else "while idle"
    return RuntimeError(f"{head}seqloader: worker {exc.worker_id} (pid {exc.pid}) died {doing} ({exc})")


def open_files_error(exc: OSError) -> RuntimeError:
    """torch's advice for running out of file descriptors (code matches on it), made true for
    seqloader's slots.

    Example:
        >>> "ulimit -n" in str(open_files_error(OSError(24, "Too many open files")))
        True
    """
    return RuntimeError(
        "Too many open files: every batch still referenced holds a shared-memory slot (one file "
        "descriptor in the reading process and one in its worker). Please increase the limit "
        "using `ulimit -n` in the shell, or keep copies (`batch.clone()`) instead of the batches; "
        "torch's `torch.multiprocessing.set_sharing_strategy('file_system')` does not apply to "
        f"seqloader's slots ({exc})")


def is_open_files_error(exc: BaseException) -> bool:
    """Whether ``exc`` is ``EMFILE``/``ENFILE``: no file descriptor left."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def infrastructure_error(exc: BaseException, timeout: float, batch: int) -> Optional[RuntimeError]:
    """The error to raise instead of ``exc`` when the workers or their transport failed (a dead
    worker, a timeout, no file descriptor left), in torch's words; ``None`` for a batch's own error.

    Example:
        >>> infrastructure_error(KeyError("bad sample"), 0, 3) is None
        True
    """
    if isinstance(exc, (WorkerDied, ItemTimeout)):
        return torch_worker_error(exc, timeout, batch)
    if is_open_files_error(exc):
        return open_files_error(exc)
    return None


def pin_device(loader: Any) -> Optional[str]:
    """The device to pin batches for, or ``None``; warns like torch's iterator does."""
    if not loader.pin_memory:
        return None
    if loader.pin_memory_device:
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the "
                      f"device,ignore pin_memory_device='{loader.pin_memory_device}'.", stacklevel=3)
    if not torch.accelerator.is_available():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device "
                      "pinned memory won't be used.", stacklevel=3)
        return None
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type == "mps":
        return None
    return acc.type


class LoaderIterator:
    """What every loader iterator shares: ``iter`` is itself; a finished iterator stays finished,
    one superseded by a later ``iter()``/``load_state_dict()`` raises; each ``next()`` is timed."""

    _stats: LoaderStats
    _progress: Progress
    _generation: int
    _done: bool

    def __iter__(self) -> "LoaderIterator":
        return self

    def _next(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _finish(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._progress.superseded(self._generation):
            self._finish()
            raise superseded_error()
        stats = self._stats
        start = stats.start()
        try:
            batch = self._next()
        except StopIteration:
            stats.stopped()
            raise
        except BaseException:
            stats.returned(start)  # a batch that raised was consumed
            raise
        stats.returned(start)
        return batch


class MapIterator(LoaderIterator):
    """Reads one epoch's batch sequence and advances the loader's progress.

    In order by default. With ``in_order=False`` and workers, batches come in completion order
    (:meth:`~seqloader.prefetcher.prefetch.Prefetch.take`): the progress is then a *watermark*
    (every batch before it was yielded) plus the keys of the few batches yielded beyond it, and
    a resume skips those (``skip``), so each batch is yielded exactly once.

    The epoch's order is settled at the first ``next()``, not at ``iter()``: frameworks call
    ``set_epoch`` (on the loader or on its sampler) after ``iter()``, and if that changed what the
    loader reads (:meth:`~seqloader.loader.dataloader.DataLoader._settle`), the batches are built
    again, and the read-ahead of the workers is dropped.

    A batch whose computation raises is consumed, as in torch: the error propagates, the progress
    counts the batch as done and the next ``next()`` reads the following batch. After the last
    batch the position is the end of the epoch; the following ``next()`` raises ``StopIteration``
    and ends the epoch (a state saved in between resumes into that empty remainder), unless
    ``set_epoch`` already moved the loader to another epoch.
    """

    def __init__(self, loader: Any, progress: Progress, generation: int, seq: EpochBatches,
                 source: Any, pin_device: Optional[str], skip: frozenset = frozenset()):
        self._loader = loader  # kept alive: its finalizer closes the persistent workers we read
        self._stats = loader._stats
        self._progress = progress
        self._generation = generation
        self._pin_device = pin_device
        # out of order, batches may be yielded up to this far past the oldest one not yet
        # yielded: 4x torch's in-flight bound, so a fast worker runs well ahead of a stuck one
        # while the state's 'ahead' list stays short
        self._window = 4 * loader.num_workers * (loader.prefetch_factor or 2)
        self._settled = False
        self._done = False
        self._read_from(seq, source, skip)

    def _read_from(self, seq: EpochBatches, source: Any, skip: frozenset) -> None:
        """Read ``seq`` (from ``source``: itself or a Prefetch over it) from the progress's position."""
        progress = self._progress
        self._seq = seq
        self._source = source
        self._owns_source = source is not seq and not self._loader._workers.is_persistent(source)
        self._unordered = source is not seq and not self._loader.in_order
        if self._unordered:
            source.seek(0, skip=skip)
        self._epoch = progress.epoch
        self._start = progress.position          # the epoch's position before this sequence
        self._ahead = progress.ahead
        self._read_up_to = Watermark(0, skip)    # batches of seq yielded (or skipped)
        self._left = len(seq) - len(skip)        # batches still to yield
        self._watch = self._loader._epoch_watch()

    def _settle(self) -> None:
        """Before the first batch: read the order again if ``set_epoch`` changed it since ``iter()``."""
        self._settled = True
        progress = self._progress
        stale = self._loader._settle(self._watch, self._left == 0)
        if not stale and (progress.epoch, progress.position, progress.ahead) == (self._epoch, self._start, self._ahead):
            return
        self._release()
        self._read_from(*self._loader._open_epoch())
        if self._stats.current is not None:
            self._stats.current.epoch = progress.epoch  # the epoch this iterator reads, after all

    def __len__(self) -> int:
        return len(self._seq)

    def _next(self) -> Any:
        progress = self._progress
        if not self._settled:
            self._settle()
        elif progress.epoch != self._epoch:  # set_epoch() moved on after this epoch's last batch
            self._finish()
            raise StopIteration
        if self._left == 0:  # the epoch is over (or was empty)
            self._finish()
            progress.end_epoch()
            raise StopIteration
        try:
            b, batch = self._read()
        finally:  # a batch that raised is consumed too
            if self._left == 0:
                self._release()
        if self._pin_device is not None:
            batch = _pin(batch, self._pin_device)
        return batch

    def _read(self) -> tuple[int, Any]:
        if self._unordered:
            try:
                b, batch = self._source.take(window=self._window)
            except Exception as exc:
                replacement = infrastructure_error(exc, self._loader.timeout, self._read_up_to.low)
                if replacement is not None:
                    raise replacement from exc
                self._yielded(getattr(exc, "seqloader_index", None))  # the batch's own error
                raise
            self._yielded(b)
            return b, batch
        b = self._read_up_to.low
        try:
            if self._source is self._seq:
                snapshot = Snapshot()  # preserved_globals(), without a generator's overhead
                try:
                    batch = self._seq[b]
                finally:
                    snapshot.restore()
            else:
                batch = self._source[b]
        except Exception as exc:
            replacement = infrastructure_error(exc, self._loader.timeout, b)
            if replacement is not None:  # the workers failed: nothing was consumed
                raise replacement from exc
            self._yielded(b)  # the batch's own error: it is consumed
            raise
        self._yielded(b)
        return b, batch

    def _yielded(self, b: Optional[int]) -> None:
        """Batch ``b`` was consumed: move the watermark and the progress."""
        if b is None:
            return
        self._left -= 1
        mark = self._read_up_to
        mark.consume(b)
        position = self._start if mark.low == 0 else self._seq.end_position(mark.low - 1)
        above = mark.above
        self._progress.advance(position, tuple(sorted(self._seq.key(k) for k in above)) if above else ())

    def _release(self) -> None:
        """Close this iterator's own workers (not the loader's persistent ones)."""
        if self._owns_source:
            self._stats.refresh()
            self._source.close()

    def _finish(self) -> None:
        self._done = True
        self._release()
