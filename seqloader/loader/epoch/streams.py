"""The streams of an ``IterableDataset`` on seqloader's own workers: one per worker, read round-robin.

Each worker (or the main process at ``num_workers=0``) iterates its own copy of the dataset, as in
torch, and ``get_worker_info()`` is torch's, so a dataset that shards itself by worker id keeps
working. :class:`StreamBatches` makes that an index-addressable sequence for the prefetcher:
batch ``i`` of the epoch is the next batch of stream ``i % n`` (the prefetcher computes item ``i``
in worker ``i % n``, torch's assignment), as a :class:`StreamItem` holding the batch and the
stream's state after it. A stream that has ended answers its turns with an ``ended`` item, which
the iterator skips (torch's round-robin skips an exhausted worker the same way); the epoch ends
when every stream has ended. Because batch ``i`` is a function of the streams' states, the resume
state is ``position`` (the next ``i``) plus each stream's latest state; see
:class:`~seqloader.loader.state.state.IterableState`.

Stream state protocol (torchdata's): a stream is resumed by ``dataset.load_state_dict(...)``, then
``it = iter(dataset)``, then ``it.load_state_dict(...)`` when the iterator is a separate Stateful
object (a dataset whose ``__iter__`` returns ``self`` saves and loads through the second one).
States are taken in the worker right after the batch they belong to, once per batch, and only for
datasets or iterators that have ``state_dict`` (others cost nothing). A stream without any state is
resumed by replaying its batches (a logged warning says so). Global RNGs are seeded before each
batch from ``(seed, epoch, i)``, so random draws in ``__iter__`` resume exactly too.

Several threads of one process may be asked for batches of the same stream at once
(``threads_per_worker``: the process's threads compute its batches ``w, w + n, w + 2n, ...``).
A stream is read by one thread at a time, in its order: batch ``i`` waits for its turn (stream
``w``'s lock and condition, :meth:`StreamBatches._turn`) until batch ``i - n`` has been taken and
its state captured, so the batches and states are those of one worker process reading alone.
Streams of different workers (thread workers) are read in parallel.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
import threading
from typing import Any, Callable, Iterator, Optional, cast

from seqloader.errors import annotate
from seqloader.loader.epoch.batches import COLLATE, FETCH, SlotCollate
from seqloader.loader.rngs.seeding import DERIVATION, seed_globals, watch_globals
from seqloader.loader.state.state import is_stateful
from seqloader.loader.torch_compat import collate_in_plain_memory, has_arrays, is_default_collate, worker_dataset
from seqloader.sequences import stage_times
from seqloader.sequences.base import LazySequence

__all__ = ["StreamBatches", "StreamItem"]

_END = object()  # a private end marker: never a dataset item
_TURNS_LOCK = threading.Lock()  # creates the per-stream turns of a StreamBatches (StreamBatches._turn)
#: Seconds of waiting, while no thread reads a stream, for an earlier batch of it that never comes.
TURN_WAIT = 60.0


@dataclasses.dataclass(frozen=True)
class StreamItem:
    """Batch ``batches`` of ``stream`` and the stream's state after it, or the stream's end."""

    stream: int
    batch: Any
    batches: int
    state: Any
    ended: bool


class _Stream:
    """One stream's live iterator in this process (never pickled), over ``ds``: the dataset object
    of the worker reading it (its own copy in a worker process or a thread worker)."""

    def __init__(self, it: Iterator[Any], batches: int, next_index: int, ended: bool, state: Any, ds: Any):
        self.it, self.batches, self.next_index, self.ended, self.state = it, batches, next_index, ended, state
        self.ds = ds


def _with_batch(item: StreamItem, batch: Any) -> StreamItem:
    return dataclasses.replace(item, batch=batch)


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
        >>> from torch.utils.data import default_collate
        >>> class Count(torch.utils.data.IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(5))
        >>> seq = StreamBatches(Count(), 1, 0, None, 2, False, default_collate, seed=0, epoch=0)
        >>> [(x.batch.tolist() if not x.ended else "end") for x in (seq[0], seq[1], seq[2], seq[3])]
        [[0, 1], [2, 3], [4], 'end']
    """

    def __init__(self, dataset: Any, streams: int, start: int, resume: Optional[tuple],
                 batch_size: Optional[int], drop_last: bool, collate_fn: Callable, seed: int,
                 epoch: int, derivation: int = DERIVATION, skip: frozenset = frozenset()):
        self._dataset, self._streams, self._start, self._resume = dataset, streams, start, resume
        self._skip = skip
        self._batch_size, self._drop_last, self._collate_fn = batch_size, drop_last, collate_fn
        self._seed, self._epoch, self._derivation = seed, epoch, derivation
        self._live: dict[int, _Stream] = {}
        self._turns: dict[int, threading.Condition] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_live": {}, "_turns": {}}  # live iterators and locks stay in their process

    def _turn(self, w: int) -> threading.Condition:
        """Stream ``w``'s lock: held while one of its batches is read (see the module docstring)."""
        turn = self._turns.get(w)
        if turn is None:
            with _TURNS_LOCK:
                turn = self._turns.setdefault(w, threading.Condition(threading.Lock()))
        return turn

    def __len__(self) -> int:
        return sys.maxsize

    def __repr__(self) -> str:
        return f"stream_batches(dataset={type(self._dataset).__name__}, streams={self._streams}, epoch={self._epoch})"

    def _open(self, w: int) -> _Stream:
        first = self._start + (w - self._start) % self._streams
        while first in self._skip:  # a stream's batches are yielded in its order: skips are its first turns
            first += self._streams
        saved = None if self._resume is None else self._resume[w]
        ds = worker_dataset(self._dataset)
        state = None if saved is None else saved["state"]
        if state is not None and state["dataset"] is not None:
            ds.load_state_dict(copy.deepcopy(state["dataset"]))
        it = iter(ds)
        if state is not None and state["iterator"] is not None:
            it.load_state_dict(copy.deepcopy(state["iterator"]))
        batches = 0 if saved is None else saved["batches"]
        stream = _Stream(it, batches, first, saved is not None and saved["exhausted"], state, ds)
        if saved is not None and state is None and batches and not stream.ended:
            for _ in range(batches * (1 if self._batch_size is None else self._batch_size)):
                if next(it, _END) is _END:
                    break
        if not stream.ended:
            stream.state = self._capture(stream)  # a state taken before the first batch is valid too
        return stream

    def stream(self, w: int) -> _Stream:
        """Stream ``w``'s live iterator in this process, opened (``iter(dataset)``) on first use."""
        stream = self._live.get(w)
        if stream is None:
            stream = self._live[w] = self._open(w)
        return stream

    def _item(self, i: int) -> Any:
        return self._batch(i, False)

    def slot_item(self, i: int) -> Any:
        """Batch ``i`` as a worker process computes it for its slot (see ``EpochBatches.slot_item``)."""
        return self._batch(i, True)

    def _batch(self, i: int, in_slot: bool) -> Any:
        w = i % self._streams
        turn = self._turn(w)
        with turn:
            stream = self.stream(w)
            waited = 0.0
            while not stream.ended and stream.next_index < i and waited < TURN_WAIT:
                turn.wait(1.0)  # another thread of this process reads an earlier batch of the stream
                waited += 1.0
            try:
                return self._batch_in_turn(stream, w, i, in_slot)
            finally:
                turn.notify_all()

    def _batch_in_turn(self, stream: _Stream, w: int, i: int, in_slot: bool) -> Any:
        if stream.ended:
            return StreamItem(w, None, stream.batches, stream.state, True)
        if i != stream.next_index:
            raise RuntimeError(f"{self!r}: stream {w} was asked for batch {i} but its next is "
                               f"{stream.next_index}; stream batches are read in increasing order")
        stream.next_index = i + self._streams
        seed_globals(self._seed, self._epoch, i, self._derivation)
        watched = watch_globals(self._epoch)  # a thread worker: does it draw from the shared globals?
        try:
            return self._read(stream, w, i, in_slot)
        finally:
            if watched is not None:
                watched[0].check(watched[1], lambda: f"batch {i} of epoch {self._epoch} (stream {w})")

    def _read(self, stream: _Stream, w: int, i: int, in_slot: bool) -> Any:
        times = stage_times.current() if stage_times.ACTIVE is not None else None
        with annotate("DataLoader", i, batch=i, epoch=self._epoch):
            items = self._take(stream.it) if times is None else times.call(FETCH, self._take, stream.it)
            if items is None:
                stream.ended, stream.state = True, self._end_state(stream)
                return StreamItem(w, None, stream.batches, stream.state, True)
            if in_slot and self._batch_size is not None and is_default_collate(self._collate_fn) and \
                    has_arrays(items[0]):  # counted and its state taken now, in the stream's turn
                done = self._yielded(stream, w, None)
                return SlotCollate(items, i, {"batch": i, "epoch": self._epoch}, functools.partial(_with_batch, done))
            batch = self._collate(items) if times is None else times.call(COLLATE, self._collate, items)
        return self._yielded(stream, w, batch)

    def _yielded(self, stream: _Stream, w: int, batch: Any) -> StreamItem:
        """Stream ``w`` produced ``batch``: count it and take the stream's state after it."""
        stream.batches += 1
        stream.state = self._capture(stream)
        return StreamItem(w, batch, stream.batches, stream.state, False)

    def _take(self, it: Iterator[Any]) -> Any:
        """The next item (``batch_size=None``) or list of items, or ``None`` at the stream's end."""
        if self._batch_size is None:
            item = next(it, _END)
            return None if item is _END else item
        items: list[Any] = []
        while len(items) < self._batch_size:
            item = next(it, _END)
            if item is _END:
                break
            items.append(item)
        if not items or (self._drop_last and len(items) < self._batch_size):
            return None
        return items

    def _collate(self, data: Any) -> Any:
        return collate_in_plain_memory(self._collate_fn, data)  # plain memory: the prefetcher's slots carry it

    def _end_state(self, stream: _Stream) -> Any:
        """An ended stream's state: only the dataset's, which is what a next epoch starts from
        (it calls ``iter(dataset)`` again); a resume loads it before that ``iter``."""
        ds = stream.ds
        return {"dataset": copy.deepcopy(ds.state_dict()), "iterator": None} if is_stateful(ds) else None

    def _capture(self, stream: _Stream) -> Any:
        ds, it = stream.ds, cast(Any, stream.it)
        dataset_state = copy.deepcopy(ds.state_dict()) if it is not ds and is_stateful(ds) else None
        iterator_state = copy.deepcopy(it.state_dict()) if is_stateful(it) else None
        if dataset_state is None and iterator_state is None:
            return None
        return {"dataset": dataset_state, "iterator": iterator_state}
