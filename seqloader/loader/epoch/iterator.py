"""L3: what every loader iterator shares: the ``next()`` bookkeeping and the one read step.

:class:`LoaderIterator` owns ``__next__`` (a finished iterator stays finished, a superseded one
raises, every call is timed by :class:`~seqloader.loader.tuning.stats.LoaderStats`) and :meth:`_read`,
the read / translate-error / consume step of both dataset kinds: the next item of an
:class:`Opened` epoch -- in this process (global RNGs restored), from the workers in order, or
the first to complete (``in_order=False``) -- with worker deaths and timeouts translated into
torch's words, and the item counted as consumed whether it returned or raised its own error.
With ``profile_stages`` it times the batches computed in this process and pinning
(:meth:`~seqloader.loader.tuning.stats.LoaderStats.compute`, :meth:`~seqloader.loader.tuning.stats.LoaderStats.timed_main`).
Subclasses (:class:`~seqloader.loader.epoch.map_iterator.MapIterator`,
:class:`~seqloader.loader.epoch.iterable_iterator.IterableIterator`) supply ``_next`` and ``_consumed``,
as torch's ``_BaseDataLoaderIter`` subclasses supply ``_next_data``.

An iterator gets everything it reads when it is built (an :class:`Opened` epoch, the progress,
the stats, the timeout, the window and at most one ``reopen`` callable) and never calls back into
its loader: compare torch's ``_BaseDataLoaderIter.__init__``, which copies what it needs once.
"""

from __future__ import annotations

import dataclasses
import errno
from typing import Any, Callable, Optional

from seqloader.loader.epoch.batches import EpochBatches
from seqloader.loader.rngs.snapshots import Snapshot
from seqloader.loader.state.progress import Mark, Progress
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.loader.torch_compat import open_files_error, pin, poison_error, worker_error
from seqloader.loader.torch_compat.profiler import span, span_name
from seqloader.loader.epoch.watermark import Watermark
from seqloader.prefetcher.faults import INDEX_ATTR, ItemTimeout, WorkerDied

__all__ = ["LoaderIterator", "Opened", "describe_batch", "infrastructure_error", "read_window", "superseded_error"]


def read_window(num_workers: int, prefetch_factor: Optional[int]) -> int:
    """How far past the oldest batch not yet yielded an out-of-order reader may yield: 4x torch's
    in-flight bound, so a fast worker runs well ahead of a stuck one while the state's ``ahead``
    list stays short.

    Example:
        >>> read_window(2, None), read_window(4, 3)
        (16, 48)
    """
    return 4 * num_workers * (prefetch_factor or 2)


def superseded_error() -> RuntimeError:
    """The error of an iterator whose loader was iterated again or loaded a state."""
    return RuntimeError("DataLoader: this iterator was superseded by a later iter(loader) or "
                        "load_state_dict(); iterate the loader again")


def describe_batch(seq: Any, b: int) -> str:
    """Batch ``b`` of an opened epoch ``seq``, in messages: its number and, for a map-style epoch,
    its dataset indices (the prefetcher's ``describe``: the heal warning, a dead worker, a timeout).

    Example:
        >>> from seqloader.orders.plans import OrderPlan
        >>> from seqloader.orders.orders import RangeOrder
        >>> seq = EpochBatches(list(range(10)), OrderPlan(RangeOrder(10), 0, 4, False), list, seed=0, epoch=0)
        >>> describe_batch(seq, 2), describe_batch(object(), 2)
        ('batch 2 (dataset indices [8, 9])', 'batch 2')
    """
    if isinstance(seq, EpochBatches):   # named by its number in the epoch (the opened epoch may start mid-way)
        try:
            return f"batch {seq.epoch_batch(b)} (dataset indices {_listed(seq.indices(b))})"
        except Exception as exc:  # a message must not fail: say so in it
            return f"batch {b} of the opened epoch (its number and dataset indices could not be computed: " \
                   f"{type(exc).__name__}: {exc})"
    return f"batch {b}"


def infrastructure_error(exc: BaseException, timeout: float, batch: int, seq: Any = None) -> Optional[RuntimeError]:
    """The error to raise instead of ``exc`` when the workers or their transport failed (a dead
    worker, a timeout, no file descriptor left), in torch's words; ``None`` for a batch's own error.
    The batch is named with its dataset indices (``seq``: the opened sequence of batches), a
    *poison* batch (it killed a worker and its replacement) included.

    Example:
        >>> infrastructure_error(KeyError("bad sample"), 0, 3) is None
        True
        >>> e = ItemTimeout("prefetch(...): timed out", seconds=5.0, item=3, worker_id=1, pid=42)
        >>> str(infrastructure_error(e, 5, 3))
        'DataLoader timed out after 5 seconds; seqloader: waiting for batch 3 from worker 1 (pid 42)'
    """
    if isinstance(exc, ItemTimeout):
        b = exc.item if exc.item is not None else batch
        return worker_error(timed_out=True, timeout=timeout, batch=describe_batch(seq, b), worker_id=exc.worker_id,
                            pid=exc.pid, exitcode=None, doing="", detail="")
    if isinstance(exc, WorkerDied) and exc.poison and exc.item is not None:
        b = exc.item
        what = describe_batch(seq, b) if isinstance(seq, EpochBatches) else f"batch {b} (of stream {exc.worker_id})"
        return poison_error(what=what, worker_id=exc.worker_id, pid=exc.pid, exitcode=exc.exitcode, detail=str(exc))
    if isinstance(exc, WorkerDied):
        if exc.item is not None:
            doing = f"while producing {describe_batch(seq, exc.item)}"
        elif getattr(exc, "suspects", ()):  # several threads of one process: each batch it was computing
            doing = "while producing one of " + ", ".join(describe_batch(seq, b) for b in exc.suspects)
        else:
            doing = "while idle"
        shown = seq.epoch_batch(batch) if isinstance(seq, EpochBatches) else batch
        return worker_error(timed_out=False, timeout=timeout, batch=f"batch {shown}", worker_id=exc.worker_id,
                            pid=exc.pid, exitcode=exc.exitcode, doing=doing, detail=str(exc))
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return open_files_error(exc)
    return None


def _listed(indices: Any) -> Any:
    """Dataset indices as plain ints, for a message."""
    try:
        return [int(i) for i in indices]
    except TypeError:  # one index (batch_size=None) or a custom sampler's keys
        return indices


@dataclasses.dataclass
class Opened:
    """One opened epoch (or its rest), as an iterator reads it; swapped whole when it is reopened.

    Attributes:
        seq: the sequence of items (batches, or stream items) from the epoch's position.
        source: ``seq`` itself (read in this process) or the workers' ``Prefetch`` over it.
        owned: the iterator closes ``source`` when it is done (not the loader's persistent workers).
        unordered: items are taken as they complete (``in_order=False`` with workers).
        mark: the epoch and the version of what it reads when this was opened (:meth:`Progress.mark
            <seqloader.loader.state.progress.Progress.mark>`): it is stale when
            ``progress.mark().since(opened.mark)`` is not ``Change.NONE``.
        start: the sample position this was opened at.
        watermark: the items of ``seq`` consumed so far (a watermark and those consumed past it).
        step: the global step of item 0 (map-style: the batch at ``start``).
        unread: a custom sampler's epoch before its first ``next()`` (its indices are read then,
            once: ``seq`` is empty and ``source`` the started workers, if any): the iterator's
            ``len`` until then (torch's ``len(index_sampler)``); ``None`` once read.
        decoders: this iterator's own decode processes (:mod:`seqloader.loader.epoch.read_ahead`),
            closed with it, or ``None``.
    """

    seq: Any
    source: Any
    owned: bool
    unordered: bool
    mark: Mark
    start: int
    watermark: Watermark
    step: int = 0
    unread: Optional[Callable[[], int]] = None
    decoders: Any = None


class LoaderIterator:
    """The shared part of a loader iterator (see the module docstring).

    Args:
        opened: the epoch to read.
        progress: the loader's progress; this iterator's ``generation`` of it.
        stats: the loader's stats.
        pin_device: the device to pin batches for, or ``None``.
        timeout: the loader's ``timeout`` (for torch's message).
        window: how far past the watermark an out-of-order read may take items.
        owner: kept alive while the iterator is (the loader: its finalizer closes persistent workers).
    """

    def __init__(self, opened: Opened, progress: Progress, generation: int, stats: LoaderStats,
                 pin_device: Optional[str], timeout: float, window: int, owner: Any):
        self._opened = opened
        self._progress, self._generation, self._stats = progress, generation, stats
        self._pin_device, self._timeout, self._window = pin_device, timeout, window
        self._owner = owner
        self._done = False
        self._span = span_name(self)   # torch's profiler span of each next(), as torch names it

    def __iter__(self) -> "LoaderIterator":
        return self

    def _next(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _consumed(self, i: Optional[int]) -> None:  # pragma: no cover - abstract
        """Item ``i`` of the opened sequence was consumed (returned, or raised its own error);
        ``None``: the failing item is unknown."""
        raise NotImplementedError

    def __next__(self) -> Any:
        with span(self._span):
            return self._deliver()

    def _deliver(self) -> Any:
        """The next batch (``__next__`` inside torch's profiler span)."""
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
        stats.returned(start, batch)
        return batch

    def _read(self) -> tuple[int, Any]:
        """The next item of the opened sequence, ``(index, value)``: the watermark's (in order) or
        the first to complete; consumed whether it returned or raised its own error."""
        opened = self._opened
        low = opened.watermark.low
        if opened.source is opened.seq:  # this process: the caller's global RNG states are kept
            # (unless the batch draws nothing from them: seqloader.loader.rngs.draws)
            snapshot = Snapshot() if getattr(opened.seq, "draws_globals", True) else None
            try:
                out = self._stats.compute(opened.seq, low) if self._stats.profile else opened.seq[low]
            except Exception:
                self._consumed(low)
                raise
            finally:
                if snapshot is not None:
                    snapshot.restore()
            self._consumed(low)
            return low, out
        try:
            if opened.unordered:
                i, out = opened.source.take(window=self._window)
            else:
                i, out = low, opened.source[low]
        except Exception as exc:
            replacement = infrastructure_error(exc, self._timeout, low, opened.seq)
            if replacement is not None:  # the workers failed: nothing was consumed
                raise replacement from exc
            self._consumed(getattr(exc, INDEX_ATTR, None) if opened.unordered else low)
            raise
        self._consumed(i)
        return i, out

    def _pinned(self, batch: Any) -> Any:
        device = self._pin_device
        if device is None:
            return batch
        if self._stats.profile:  # the stage "pin" of the per-stage account
            return self._stats.timed_main(lambda b: pin(b, device), batch)
        return pin(batch, device)

    def _release(self) -> None:
        """Close this iterator's own workers (not the loader's persistent ones)."""
        opened = self._opened
        if opened.owned and not opened.source.closed:
            self._stats.refresh()
            opened.source.close()
        if opened.decoders is not None:
            opened.decoders.close()

    def _finish(self) -> None:
        self._done = True
        self._release()
