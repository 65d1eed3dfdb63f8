"""L3: opening an epoch for an iterator: its items, where they are computed, and what to skip.

:func:`open_map_epoch` and :func:`open_stream_epoch` turn a loader's progress into an
:class:`~seqloader.loader.epoch.iterator.Opened` epoch: the lazy sequence of the epoch's rest (the
recipe's batches, or an ``IterableDataset``'s streams), read from this process or from the
workers (started here: like torch, a failing ``worker_init_fn`` raises at ``iter()``), with the
items already yielded out of order (``ahead``) skipped, and :func:`new_iterator` is ``iter(loader)``
around them (a custom sampler's epoch is opened by :func:`open_unread_epoch`: its workers start,
its sampler is iterated at the first ``next()``, once). A map-style epoch first sizes its sources' caches of decoded blocks
(:mod:`seqloader.loader.epoch.block_caches`), before its workers start. They read the loader's public settings only
(:class:`~seqloader.loader.settings.Settings`); the loader passes its parts (reading, epochs and
progress, workers, stats). :class:`Reopen` is a map-style iterator's one ``reopen`` callable: the
epoch to read instead of the opened one after a ``set_epoch`` or a recipe change. A stream epoch
also gets a :class:`StreamRespawn`: what the replacement of a dead worker reads
(``max_worker_restarts``), its stream rebuilt from the progress as a resume rebuilds it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Optional

from seqloader.loader.epoch.block_caches import prefetch_depth, size_block_caches
from seqloader.loader.epoch.read_ahead import read_ahead
from seqloader.loader.epoch.map_iterator import MapIterator
from seqloader.loader.epoch.iterable_iterator import IterableIterator
from seqloader.loader.epoch.iterator import Opened, describe_batch, read_window
from seqloader.loader.state.progress import Change, EpochControl, Progress
from seqloader.loader.epoch.batches import epoch_batches
from seqloader.loader.settings import Settings
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.loader.epoch.streams import StreamBatches
from seqloader.loader.torch_compat import pin_device
from seqloader.loader.epoch.watermark import Watermark
from seqloader.loader.workers.pool import Workers

__all__ = ["Reopen", "StreamRespawn", "new_iterator", "open_map_epoch", "open_stream_epoch", "open_unread_epoch"]

_log = logging.getLogger("seqloader")


class StreamRespawn:
    """``respawn(worker_id)`` for the prefetcher: the streams a replacement of dead worker ``w``
    reads, rebuilt from the progress *when it is called* exactly as a ``load_state_dict`` resume
    rebuilds them: stream ``w`` from its recorded state, at its first turn not yet yielded (the
    prefetcher recomputes every item of ``w`` not yet returned, from that turn on).

    Raises ``RuntimeError`` when stream ``w`` has yielded batches but has no recorded state
    (neither the dataset nor its iterator has ``state_dict``/``load_state_dict``): it cannot be
    restarted exactly, and replaying it silently is not an option.
    """

    def __init__(self, make: Callable[..., StreamBatches], progress: Progress, dataset_name: str):
        self._make, self._progress, self._name = make, progress, dataset_name

    def __call__(self, worker_id: int) -> StreamBatches:
        progress = self._progress
        streams = progress.iterable
        assert streams is not None  # an iterable loader's progress has streams
        entry = streams.workers[worker_id]
        if entry["state"] is None and entry["batches"] and not entry["exhausted"]:
            raise RuntimeError(
                f"DataLoader: the stream of worker {worker_id} ({self._name}) cannot be restarted exactly: it "
                f"has yielded {entry['batches']} batch(es) this epoch and has no state (neither the dataset nor "
                "its iterator has state_dict/load_state_dict, torchdata's Stateful protocol); implement them "
                "to heal workers of an IterableDataset")
        return self._make(progress.position, tuple(streams.copy().workers), frozenset(progress.ahead))


def _opened(loader: Settings, progress: Progress, workers: Workers, stats: LoaderStats, seq: Any,
            skip: frozenset, mark_from: int, streams: bool, reuse: Any = None,
            respawn: Optional[StreamRespawn] = None, unread: Optional[Callable[[], int]] = None,
            depth: Optional[int] = None, in_process: bool = False) -> Opened:
    source, unordered = seq, False
    if in_process:   # the batches are cut in this thread; the workers decode ahead (read_ahead)
        source = seq
    elif reuse is not None and len(seq) > 0:  # the same epoch's workers, pointed at the new recipe
        reuse.reset(seq)
        source = reuse
    elif loader.num_workers > 0 and (len(seq) > 0 or unread is not None):
        # a stream's items must stay on their worker (affinity); batches may go to any free one
        source = workers.open(loader, seq, progress.epoch, affinity=loader.in_order or streams, respawn=respawn,
                              describe=describe_batch, depth=depth)
        source.start()
        stats.attach(source)
        # an in-order read would compute skipped items (the workers read ahead): take them
        unordered = unread is None and (not loader.in_order or (streams and bool(skip)))
        if unordered:
            source.seek(mark_from, skip=skip)
    owned = source is not seq and not workers.is_persistent(source)
    return Opened(seq, source, owned, unordered, progress.mark(), progress.position, Watermark(mark_from, skip),
                  progress.step, unread)


def open_map_epoch(loader: Settings, reading: Any, progress: Progress, workers: Workers,
                   stats: LoaderStats, reuse: Any = None, unread: bool = False) -> Opened:
    """The progress's epoch of a map-style dataset, from its position, with the recipe changes
    pending for it placed (``reuse``: a live ``Prefetch`` of the same epoch to re-target instead
    of starting workers; ``unread``: it is the one :func:`open_unread_epoch` started, which has
    computed nothing: an out-of-order read seeks it as fresh workers)."""
    reading.control.resolve(reading.recipe(loader))
    seq, skip = epoch_batches(reading.recipe(loader), progress)
    # workers over a block source decode ahead; the batches are cut here (read_ahead)
    ahead = read_ahead(loader, seq.dataset, reading.seekable)
    if reuse is None and not unread:   # (before workers start: processes and actors get the sizes with the dataset)
        size_block_caches(loader.dataset, reading.seekable, loader.num_workers, loader.executor, loader.in_order,
                          ahead=ahead is not None)
    if ahead is not None and ahead.processes:   # (decode processes: the loader's, or this iterator's)
        ahead = dataclasses.replace(ahead, decoders=workers.decoders(loader, seq.dataset))
    seq.read_ahead = ahead
    # an in-order read of a block shuffle waits for a window's decode: read deeper (unless given)
    deeper = None if loader.prefetch_factor_given or not loader.in_order or not loader.num_workers else \
        prefetch_depth(loader.dataset, reading.seekable, loader.batch_size, loader.executor)
    opened = _opened(loader, progress, workers, stats, seq, skip, 0, streams=False, reuse=reuse, depth=deeper,
                     in_process=ahead is not None)
    if ahead is not None and ahead.decoders is not None and not workers.is_persistent(ahead.decoders):
        opened.decoders = ahead.decoders
    if unread and reuse is not None and opened.source is reuse and not loader.in_order:
        opened.unordered = True
        reuse.seek(0, skip=skip)
    return opened


def open_unread_epoch(loader: Settings, reading: Any, progress: Progress, workers: Workers,
                      stats: LoaderStats) -> Opened:
    """``iter()`` of a custom sampler's epoch: the workers start (a failing ``worker_init_fn``
    raises here, as torch's), but the sampler is not iterated yet: :class:`Reopen` reads it, once,
    at the first ``next()``, after any ``set_epoch`` made in between (Lightning's). The workers
    compute nothing before that read in any case (a ``Prefetch`` submits at its first read)."""
    custom = reading.custom
    assert custom is not None  # a custom sampler's loader
    size_block_caches(loader.dataset, reading.seekable, loader.num_workers, loader.executor, loader.in_order)
    return _opened(loader, progress, workers, stats, (), frozenset(), 0, streams=False,
                   unread=functools.partial(custom.batches, loader.batch_size, loader.drop_last))


class Reopen:
    """A map-style iterator's ``reopen(current, used_up, settle)``: the epoch to read instead of
    ``current`` (``None``: read on), at its first ``next()`` if a ``set_epoch`` since ``iter()``
    changed it (``settle``; or the sampler the loader follows changed its order) or if it is a
    custom sampler's epoch not read yet (``current.unread``: read now, on the same workers unless
    the epoch changed), or after a recipe change (the same workers read on from the frontier).
    Whether ``current`` is stale is ``progress.mark().since(current.mark)``
    (:class:`~seqloader.loader.state.progress.Mark`).
    """

    def __init__(self, loader: Settings, reading: Any, epochs: EpochControl, workers: Workers,
                 stats: LoaderStats):
        self._loader, self._reading, self._epochs = loader, reading, epochs
        self._workers, self._stats = workers, stats

    def __call__(self, current: Opened, used_up: bool, settle: bool) -> Optional[Opened]:
        progress = self._epochs.progress
        unread = current.unread is not None
        if unread:  # (whether the epoch is used up: read its indices, only if a set_epoch asks)
            left: Callable[[], bool] = lambda: self._reading.used_up(self._loader, progress)  # noqa: E731
        else:
            left = lambda: used_up  # noqa: E731
        stale = self._epochs.settle(left) if settle else False
        change = progress.mark().since(current.mark)
        if change is Change.NONE and not stale and not unread:
            return None
        reuse = None
        if current.owned and not current.source.closed:
            if change is not Change.EPOCH and (unread or not stale):  # (unread: nothing was computed)
                reuse = current.source
            else:  # its workers (seeded for its epoch) go before new ones start
                self._stats.refresh()
                current.source.close()
        opened = open_map_epoch(self._loader, self._reading, progress, self._workers, self._stats, reuse,
                                unread=unread)
        self._stats.reading(progress.epoch)
        return opened


def _stream_batches(fixed: tuple, start: int, resume: Optional[tuple], skip: frozenset) -> StreamBatches:
    dataset, streams, batch_size, drop_last, collate_fn, seed, epoch, derivation = fixed
    return StreamBatches(dataset, streams, start, resume, batch_size, drop_last, collate_fn, seed, epoch,
                         derivation, skip)


def open_stream_epoch(loader: Settings, derivation: int, progress: Progress, workers: Workers,
                      stats: LoaderStats) -> Opened:
    """The progress's epoch of an ``IterableDataset``: its streams, resumed if it was loaded."""
    saved = progress.iterable
    assert saved is not None  # an iterable loader's progress has streams
    resume = tuple(saved.workers) if progress.resumed else None
    if resume is not None and any(w["state"] is None and w["batches"] for w in resume):
        _log.warning("seqloader.DataLoader: %s has no state_dict/load_state_dict; resuming "
                     "replays its streams (skips %d already yielded batches)",
                     type(loader.dataset).__name__, sum(w["batches"] for w in resume))
    skip = frozenset(progress.ahead)
    # the settings by value: the respawn outlives this call (persistent workers), never the loader
    fixed = (loader.dataset, len(saved.workers), loader.batch_size, loader.drop_last, loader.collate_fn,
             loader.seed, progress.epoch, derivation)
    seq = _stream_batches(fixed, progress.position, resume, skip)
    respawn = StreamRespawn(functools.partial(_stream_batches, fixed), progress, type(loader.dataset).__name__)
    return _opened(loader, progress, workers, stats, seq, skip, progress.position, streams=True, respawn=respawn)


def new_iterator(loader: Settings, reading: Any, epochs: EpochControl, workers: Workers, stats: LoaderStats,
                 reported_len: Optional[int] = None, map_iterator: Callable[..., MapIterator] = MapIterator) -> Any:
    """``iter(loader)`` after its checks: the progress begins (a loaded state resumes, or the next
    epoch starts), the epoch opens (workers start), and its iterator is returned (a map-style one
    made by ``map_iterator``: ``autotune``'s switches configurations); ``loader`` is the
    iterator's owner (kept alive with it: the loader's finalizer closes persistent workers).
    ``reported_len``: ``len(loader)`` of an ``IterableDataset`` loader, if it was read (torch's
    ``_IterableDataset_len_called``): yielding more batches than that warns, in torch's words."""
    progress = epochs.progress
    device = pin_device(loader.pin_memory, loader.pin_memory_device)
    generation = progress.begin()
    stats.begin(progress.epoch, progress.resumed, profile=loader.profile_stages)
    window = read_window(loader.num_workers, loader.prefetch_factor)
    if reading.iterable:
        opened = open_stream_epoch(loader, reading.derivation, progress, workers, stats)
        it: Any = IterableIterator(opened, progress, generation, stats, device, loader.timeout, window, owner=loader,
                                   length_check=None if reported_len is None else (reported_len, loader.dataset,
                                                                                   loader.num_workers))
    else:
        epochs.look()
        if reading.custom is not None:  # its sampler is iterated at the first next(), once
            opened = open_unread_epoch(loader, reading, progress, workers, stats)
        else:
            opened = open_map_epoch(loader, reading, progress, workers, stats)
        it = map_iterator(opened, progress, generation, stats, device, loader.timeout, window,
                          reopen=Reopen(loader, reading, epochs, workers, stats), owner=loader)
    stats.opened()  # what iter() took (worker start-up) is its own line: startup_s
    return it
