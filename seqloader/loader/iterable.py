"""``IterableDataset`` s on seqloader's own workers: one stream per worker, read round-robin.

Each worker (or the main process at ``num_workers=0``) iterates its own copy of the dataset, as in
torch, and ``get_worker_info()`` is torch's, so a dataset that shards itself by worker id keeps
working. :class:`StreamBatches` makes that an index-addressable sequence for the prefetcher:
batch ``i`` of the epoch is the next batch of stream ``i % n`` (the prefetcher computes item ``i``
in worker ``i % n``, torch's assignment), as a :class:`StreamItem` holding the batch and the
stream's state after it. A stream that has ended answers its turns with an ``ended`` item, which
the iterator skips (torch's round-robin skips an exhausted worker the same way); the epoch ends
when every stream has ended. Because batch ``i`` is a function of the streams' states, the resume
state is ``position`` (the next ``i``) plus each stream's latest state; see
:class:`~seqloader.loader.state.IterableState`.

Stream state protocol (torchdata's): a stream is resumed by ``dataset.load_state_dict(...)``, then
``it = iter(dataset)``, then ``it.load_state_dict(...)`` when the iterator is a separate Stateful
object (a dataset whose ``__iter__`` returns ``self`` saves and loads through the second one).
States are taken in the worker right after the batch they belong to, once per batch, and only for
datasets or iterators that have ``state_dict`` (others cost nothing). A stream without any state is
resumed by replaying its batches (a logged warning says so). Global RNGs are seeded before each
batch from ``(seed, epoch, i)``, so random draws in ``__iter__`` resume exactly too.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
from typing import Any, Callable, Iterator, Optional

from torch.utils.data import default_collate, default_convert, get_worker_info
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from seqloader.errors import annotate
from seqloader.loader.epoch import LoaderIterator, infrastructure_error
from seqloader.loader.progress import Progress
from seqloader.loader.global_rngs import Snapshot
from seqloader.loader.seeding import seed_globals
from seqloader.loader.state import is_stateful
from seqloader.loader.watermark import Watermark
from seqloader.loader.workers import worker_info_hidden
from seqloader.sequences.base import LazySequence

__all__ = ["IterableIterator", "StreamBatches", "StreamItem"]

_log = logging.getLogger("seqloader")
_END = object()  # a private end marker: never a dataset item
_TORCH_DEFAULTS = (default_collate, default_convert)


@dataclasses.dataclass(frozen=True)
class StreamItem:
    """Batch ``batches`` of ``stream`` and the stream's state after it, or the stream's end."""

    stream: int
    batch: Any
    batches: int
    state: Any
    ended: bool


class _Stream:
    """One stream's live iterator in this process (never pickled)."""

    def __init__(self, it: Iterator[Any], batches: int, next_index: int, ended: bool, state: Any):
        self.it, self.batches, self.next_index, self.ended, self.state = it, batches, next_index, ended, state


class StreamBatches(LazySequence):
    """Batch ``i`` of an epoch over an ``IterableDataset`` read as ``streams`` round-robin streams.

    Unbounded in length: the streams end by themselves (see the module docstring). Holds, per
    process, the live iterators of the streams it was asked for: read it in increasing ``i``.

    Args:
        dataset: the ``IterableDataset``.
        streams: ``max(1, num_workers)``.
        start: the first ``i`` read (a resume's position), ``resume``: the streams' saved entries
            (``IterableState.workers``), or ``None`` to start every stream afresh.
        skip: items above ``start`` already yielded (out of order): each stream's first item is
            its first turn at or after ``start`` that is not skipped.
        batch_size, drop_last, collate_fn: as in torch's loader.
        seed, epoch, derivation: the global-RNG seeding of each batch.

    Example:
        >>> import torch
        >>> class Count(torch.utils.data.IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(5))
        >>> seq = StreamBatches(Count(), 1, 0, None, 2, False, default_collate, seed=0, epoch=0)
        >>> [(x.batch.tolist() if not x.ended else "end") for x in (seq[0], seq[1], seq[2], seq[3])]
        [[0, 1], [2, 3], [4], 'end']
    """

    def __init__(self, dataset: Any, streams: int, start: int, resume: Optional[tuple],
                 batch_size: Optional[int], drop_last: bool, collate_fn: Callable, seed: int,
                 epoch: int, derivation: int = 2, skip: frozenset = frozenset()):
        self._dataset, self._streams, self._start, self._resume = dataset, streams, start, resume
        self._skip = skip
        self._batch_size, self._drop_last, self._collate_fn = batch_size, drop_last, collate_fn
        self._seed, self._epoch, self._derivation = seed, epoch, derivation
        self._live: dict[int, _Stream] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_live": {}}  # live iterators stay in their process

    def __len__(self) -> int:
        return sys.maxsize

    def __repr__(self) -> str:
        return f"stream_batches(dataset={type(self._dataset).__name__}, streams={self._streams}, epoch={self._epoch})"

    def _open(self, w: int) -> _Stream:
        first = self._start + (w - self._start) % self._streams
        while first in self._skip:  # a stream's batches are yielded in its order: skips are its first turns
            first += self._streams
        saved = None if self._resume is None else self._resume[w]
        ds = self._dataset
        state = None if saved is None else saved["state"]
        if state is not None and state["dataset"] is not None:
            ds.load_state_dict(copy.deepcopy(state["dataset"]))
        it = iter(ds)
        if state is not None and state["iterator"] is not None:
            it.load_state_dict(copy.deepcopy(state["iterator"]))
        batches = 0 if saved is None else saved["batches"]
        stream = _Stream(it, batches, first, saved is not None and saved["exhausted"], state)
        if saved is not None and state is None and batches and not stream.ended:
            for _ in range(batches * (1 if self._batch_size is None else self._batch_size)):
                if next(it, _END) is _END:
                    break
        if not stream.ended:
            stream.state = self._capture(it)  # a state taken before the first batch is valid too
        return stream

    def stream(self, w: int) -> _Stream:
        """Stream ``w``'s live iterator in this process, opened (``iter(dataset)``) on first use."""
        stream = self._live.get(w)
        if stream is None:
            stream = self._live[w] = self._open(w)
        return stream

    def _item(self, i: int) -> StreamItem:
        w = i % self._streams
        stream = self.stream(w)
        if stream.ended:
            return StreamItem(w, None, stream.batches, stream.state, True)
        if i != stream.next_index:
            raise RuntimeError(f"{self!r}: stream {w} was asked for batch {i} but its next is "
                               f"{stream.next_index}; stream batches are read in increasing order")
        stream.next_index = i + self._streams
        seed_globals(self._seed, self._epoch, i, self._derivation)
        with annotate("DataLoader", i, batch=i, epoch=self._epoch):
            items = self._take(stream.it)
            if items is None:
                stream.ended, stream.state = True, self._end_state()
                return StreamItem(w, None, stream.batches, stream.state, True)
            batch = self._collate(items)
        stream.batches += 1
        stream.state = self._capture(stream.it)
        return StreamItem(w, batch, stream.batches, stream.state, False)

    def _take(self, it: Iterator[Any]) -> Any:
        """The next item (``batch_size=None``) or list of items, or ``None`` at the stream's end."""
        if self._batch_size is None:
            item = next(it, _END)
            return None if item is _END else item
        items = []
        while len(items) < self._batch_size:
            item = next(it, _END)
            if item is _END:
                break
            items.append(item)
        if not items or (self._drop_last and len(items) < self._batch_size):
            return None
        return items

    def _collate(self, data: Any) -> Any:
        if self._collate_fn in _TORCH_DEFAULTS and get_worker_info() is not None:
            with worker_info_hidden():  # plain memory: the prefetcher's slots carry it
                return self._collate_fn(data)
        return self._collate_fn(data)

    def _end_state(self) -> Any:
        """An ended stream's state: only the dataset's, which is what a next epoch starts from
        (it calls ``iter(dataset)`` again); a resume loads it before that ``iter``."""
        ds = self._dataset
        return {"dataset": copy.deepcopy(ds.state_dict()), "iterator": None} if is_stateful(ds) else None

    def _capture(self, it: Any) -> Any:
        ds = self._dataset
        dataset_state = copy.deepcopy(ds.state_dict()) if it is not ds and is_stateful(ds) else None
        iterator_state = copy.deepcopy(it.state_dict()) if is_stateful(it) else None
        if dataset_state is None and iterator_state is None:
            return None
        return {"dataset": dataset_state, "iterator": iterator_state}


class IterableIterator(LoaderIterator):
    """One epoch over an ``IterableDataset``: reads :class:`StreamBatches`, skips ended turns,
    records each stream's progress, and ends the epoch when every stream has ended.

    With workers and ``in_order=False`` (or when resuming a state saved that way) items are taken
    as they complete (:meth:`~seqloader.prefetcher.prefetch.Prefetch.take`): a slow stream holds
    up only its own worker. Each stream's batches still come in the stream's order (its worker
    computes them one after another, and replies are read in arrival order), so the per-stream
    records stay exact; the position is then a watermark (every item before it was yielded or
    skipped) plus the items yielded above it (``ahead``), as for a map-style dataset.
    """

    def __init__(self, loader: Any, progress: Progress, generation: int, pin_device: Optional[str]):
        self._loader = loader  # kept alive: its finalizer closes the persistent workers we read
        self._stats = loader._stats
        self._progress, self._generation, self._pin_device = progress, generation, pin_device
        saved = progress.iterable
        resume = tuple(saved.workers) if progress.resumed else None
        if resume is not None and any(w["state"] is None and w["batches"] for w in resume):
            _log.warning("seqloader.DataLoader: %s has no state_dict/load_state_dict; resuming "
                         "replays its streams (skips %d already yielded batches)",
                         type(loader.dataset).__name__, sum(w["batches"] for w in resume))
        skip = frozenset(progress.ahead)
        self._seq = StreamBatches(loader.dataset, len(saved.workers), progress.position, resume,
                                  loader.batch_size, loader.drop_last, loader.collate_fn, loader.seed,
                                  progress.epoch, loader._derivation, skip)
        self._source: Any = self._seq
        self._owns_source = False
        self._unordered = False
        if loader.num_workers == 0:  # like torch: iter(dataset) when the loader's iterator is made
            stream = self._seq.stream(0)
            if not stream.ended:
                saved.record(0, stream.batches, stream.state)
        else:
            self._source = loader._workers.open(loader, self._seq, progress.epoch)
            self._owns_source = not loader._workers.is_persistent(self._source)
            self._source.start()  # like torch: a failing worker_init_fn raises here, at iter()
            loader._stats.attach(self._source)
            # an in-order read would compute skipped items (the workers read ahead): take them
            self._unordered = not loader.in_order or bool(skip)
            if self._unordered:
                self._source.seek(progress.position, skip=skip)
        self._window = 4 * loader.num_workers * (loader.prefetch_factor or 2)
        self._read_up_to = Watermark(progress.position, skip)  # items yielded (or ended turns)
        self._ended = {w for w, s in enumerate(saved.workers) if s["exhausted"]}
        self._done = False

    def _read(self) -> StreamItem:
        """The next item: the watermark's in order, else the first to complete."""
        low = self._read_up_to.low
        if self._source is self._seq:
            i = low
            snapshot = Snapshot()
            try:
                out = self._seq[i]
            except Exception:
                self._took(i)  # a batch that raised is consumed too
                raise
            finally:
                snapshot.restore()
            self._took(i)
            return out
        try:
            if self._unordered:
                i, out = self._source.take(window=self._window)
            else:
                i = low
                out = self._source[i]
        except Exception as exc:
            replacement = infrastructure_error(exc, self._loader.timeout, low)
            if replacement is not None:
                raise replacement from exc
            self._took(getattr(exc, "seqloader_index", None) if self._unordered else low)
            raise
        self._took(i)
        return out

    def _took(self, i: Optional[int]) -> None:
        """Item ``i`` was consumed: move the watermark and the progress."""
        if i is None:
            return
        mark = self._read_up_to
        mark.consume(i)
        self._progress.advance(mark.low, tuple(sorted(mark.above)) if mark.above else ())

    def _next(self) -> Any:
        progress = self._progress
        streams = progress.iterable
        while len(self._ended) < len(streams.workers):
            out = self._read()
            if out.ended:
                self._ended.add(out.stream)
                streams.mark_exhausted(out.stream, out.state)
                continue
            streams.record(out.stream, out.batches, out.state)
            batch = out.batch
            return batch if self._pin_device is None else _pin(batch, self._pin_device)
        self._finish()
        progress.end_epoch()
        raise StopIteration

    def _finish(self) -> None:
        self._done = True
        if self._owns_source:
            self._stats.refresh()
            self._source.close()
