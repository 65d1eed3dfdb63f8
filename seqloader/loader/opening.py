"""L3: opening an epoch for an iterator: its items, where they are computed, and what to skip.

:func:`open_map_epoch` and :func:`open_stream_epoch` turn a loader's progress into an
:class:`~seqloader.loader.iterator.Opened` epoch: the lazy sequence of the epoch's rest (the
recipe's batches, or an ``IterableDataset``'s streams), read from this process or from the
workers (started here: like torch, a failing ``worker_init_fn`` raises at ``iter()``), with the
items already yielded out of order (``ahead``) skipped. They read the loader's public settings
only (:class:`Settings`); the loader passes its progress, workers and stats. A stream epoch also
gets a :class:`StreamRespawn`: what the replacement of a dead worker reads
(``max_worker_restarts``), its stream rebuilt from the progress as a resume rebuilds it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional, Protocol

from seqloader.loader.iterator import Opened
from seqloader.loader.progress import Progress
from seqloader.loader.recipe import Recipe
from seqloader.loader.stats import LoaderStats
from seqloader.loader.streams import StreamBatches
from seqloader.loader.watermark import Watermark
from seqloader.loader.workers import Workers

__all__ = ["Settings", "StreamRespawn", "epoch_batches", "open_map_epoch", "open_stream_epoch"]

_log = logging.getLogger("seqloader")


class Settings(Protocol):
    """The loader arguments that opening an epoch reads (torch's public attributes)."""

    dataset: Any
    num_workers: int
    worker_method: Any  # a str, or a RayWorkers
    threads_per_worker: int
    in_order: bool
    batch_size: Optional[int]
    drop_last: bool
    collate_fn: Any
    seed: int


def epoch_batches(recipe: Recipe, progress: Progress) -> tuple[Any, frozenset]:
    """The batches of the progress's epoch from its position, and those to skip (``ahead``)."""
    seq = recipe.batches(progress.epoch, progress.position, progress.step)
    skip = frozenset(seq.batch_of(k) for k in progress.ahead)
    if None in skip:
        raise ValueError(f"DataLoader: the loaded state's 'ahead' keys {list(progress.ahead)} are not all "
                         f"batches of epoch {progress.epoch} from position {progress.position}; the state "
                         "is corrupt or was saved for a different loader")
    return seq, skip


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
            respawn: Optional[StreamRespawn] = None) -> Opened:
    source, unordered = seq, False
    if reuse is not None and len(seq) > 0:  # the same epoch's workers, pointed at the new recipe
        reuse.reset(seq)
        source = reuse
    elif loader.num_workers > 0 and len(seq) > 0:
        # a stream's items must stay on their worker (affinity); batches may go to any free one
        source = workers.open(loader, seq, progress.epoch, affinity=loader.in_order or streams, respawn=respawn)
        source.start()
        stats.attach(source)
        # an in-order read would compute skipped items (the workers read ahead): take them
        unordered = not loader.in_order or (streams and bool(skip))
        if unordered:
            source.seek(mark_from, skip=skip)
    owned = source is not seq and not workers.is_persistent(source)
    return Opened(seq, source, owned, unordered, progress.epoch, progress.position, progress.ahead,
                  Watermark(mark_from, skip), progress.step, progress.recipe_changes)


def open_map_epoch(loader: Settings, recipe: Recipe, progress: Progress, workers: Workers,
                   stats: LoaderStats, reuse: Any = None) -> Opened:
    """The progress's epoch of a map-style dataset, from its position (``reuse``: a live
    ``Prefetch`` of the same epoch to re-target instead of starting workers)."""
    seq, skip = epoch_batches(recipe, progress)
    return _opened(loader, progress, workers, stats, seq, skip, 0, streams=False, reuse=reuse)


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
