"""``IterableDataset`` s: torch's own worker machinery, plus per-worker resume state.

Each worker (or the main process at ``num_workers=0``) iterates its own copy of the dataset, as
in torch. :class:`_Streams` wraps that copy: it batches and collates inside the worker and yields
:class:`_Out` records ``(batch, worker, batches, state)`` where ``state`` is the dataset's own
``state_dict()`` after the batch (if it has one). torch's ``DataLoader(_Streams(...),
batch_size=None, ...)`` runs the workers and takes their outputs round-robin; the loader strips
the records and keeps the latest ``(batches, state)`` per worker and which worker is next.

Resume: each worker's dataset copy gets ``load_state_dict(state)``, or, for a dataset without
one, skips the ``batches`` it had yielded (a replay: a warning says so). Workers before the next
one in the round-robin first yield a placeholder the loader discards, so the batches continue in
the order of the uninterrupted run. A worker whose stream ended stays ended. Worker processes are
started for every epoch (``persistent_workers`` does not keep them for iterable datasets).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils.data
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from seqloader.loader.epoch import superseded_error
from seqloader.loader.fetch import identity
from seqloader.loader.progress import Progress
from seqloader.loader.seeding import seed_globals
from seqloader.loader.state import IterableState, is_stateful
from seqloader.rng import derive_seed

__all__ = ["IterableIterator"]

_log = logging.getLogger("seqloader")


@dataclasses.dataclass(frozen=True)
class _Out:
    """One record from a worker stream: a batch, or a placeholder (``skip``)."""

    batch: Any
    worker: int
    batches: int
    state: Any
    skip: bool = False
    exhausted: bool = False


class _WorkerInit:
    """In each worker: make ``get_worker_info().dataset`` the user's dataset, then the user's fn."""

    def __init__(self, fn: Optional[Callable[[int], None]]):
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        info = torch.utils.data.get_worker_info()
        _torch_worker._worker_info = dataclasses.replace(info, dataset=info.dataset.dataset)
        if self.fn is not None:
            self.fn(worker_id)


class _Streams(torch.utils.data.IterableDataset):
    """The user's ``IterableDataset``, batched and collated per worker; see the module docstring."""

    def __init__(self, dataset, batch_size: Optional[int], drop_last: bool, collate_fn: Callable,
                 resume: Optional[tuple], first_worker: int):
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.resume = resume
        self.first_worker = first_worker

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = 0 if info is None else info.id
        ds = self.dataset
        stateful = is_stateful(ds)
        count, skip_items = 0, 0
        if self.resume is not None:
            w = self.resume[wid]
            if w["exhausted"]:
                return
            count = w["batches"]
            if w["state"] is not None:
                ds.load_state_dict(copy.deepcopy(w["state"]))
            else:
                skip_items = count * (1 if self.batch_size is None else self.batch_size)
        if wid < self.first_worker:
            yield _Out(None, wid, count, None, skip=True)
        it = iter(ds)
        for _ in range(skip_items):
            if next(it, _END) is _END:
                break
        while True:
            if self.batch_size is None:
                item = next(it, _END)
                if item is _END:
                    break
                batch = self.collate_fn(item)
            else:
                items = []
                while len(items) < self.batch_size:
                    item = next(it, _END)
                    if item is _END:
                        break
                    items.append(item)
                if not items or (self.drop_last and len(items) < self.batch_size):
                    break
                batch = self.collate_fn(items)
            count += 1
            state = ds.state_dict() if stateful else None
            if info is None and state is not None:
                state = copy.deepcopy(state)  # same process: do not alias live objects
            yield _Out(batch, wid, count, state)
        yield _Out(None, wid, count, None, skip=True, exhausted=True)


_END = object()  # a private end marker: never a dataset item


class _StreamGlobals:
    """At ``num_workers=0``: the stream's own global-RNG states, swapped in around each step."""

    def __init__(self, seed: int, epoch: int, derivation: int):
        self.seed, self.epoch, self.derivation, self.states = seed, epoch, derivation, None

    def __enter__(self):
        self.caller = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
        if self.states is None:
            seed_globals(self.seed, self.epoch, 0, self.derivation)
        else:
            _set_globals(self.states)

    def __exit__(self, *exc):
        self.states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
        _set_globals(self.caller)
        return False


def _set_globals(states: tuple) -> None:
    py, npy, th = states
    random.setstate(py)
    np.random.set_state(npy)
    torch.random.set_rng_state(th)


class IterableIterator:
    """One epoch over an ``IterableDataset``; updates the loader's progress and stream states."""

    def __init__(self, loader, progress: Progress, generation: int, pin_device: Optional[str]):
        self._progress = progress
        self._generation = generation
        self._pin_device = pin_device
        saved: IterableState = progress.iterable
        resume = tuple(saved.workers) if saved.started else None
        if resume is not None and not is_stateful(loader.dataset) and any(w["batches"] for w in resume):
            _log.warning("seqloader.DataLoader: %s has no state_dict/load_state_dict; resuming "
                         "replays its stream (skips %d already yielded batches)",
                         type(loader.dataset).__name__, sum(w["batches"] for w in resume))
        streams = _Streams(loader.dataset, loader.batch_size, loader.drop_last, loader.collate_fn,
                           resume, saved.next_worker if resume is not None else 0)
        g = torch.Generator()
        g.manual_seed(derive_seed(loader.seed, "worker", progress.epoch) % 2**63)
        nw = loader.num_workers
        inner = torch.utils.data.DataLoader(
            streams, batch_size=None, num_workers=nw, collate_fn=identity, timeout=loader.timeout,
            worker_init_fn=_WorkerInit(loader.worker_init_fn) if nw else None,
            multiprocessing_context=loader.multiprocessing_context if nw else None, generator=g,
            prefetch_factor=loader.prefetch_factor, in_order=True)
        self._globals = _StreamGlobals(loader.seed, progress.epoch, loader._derivation) if nw == 0 else None
        self._it = iter(inner)
        self._done = False
        self._started = False
        self._pending: Optional[_Out] = None

    def __iter__(self):
        return self

    def _step(self) -> _Out:
        if self._it is None:
            raise StopIteration
        if self._globals is None:
            return next(self._it)
        with self._globals:
            return next(self._it)

    def _read(self) -> Optional[_Out]:
        """The next batch record (placeholders skipped, ended streams noted), or ``None`` at the end."""
        while True:
            try:
                out = self._step()
            except StopIteration:
                self._close()
                return None
            if out.exhausted:
                self._progress.iterable.mark_exhausted(out.worker)
            if not out.skip:
                return out

    def __next__(self):
        progress = self._progress
        if self._done:
            raise StopIteration
        if progress.superseded(self._generation):
            self._close()
            self._done = True
            raise superseded_error()
        # One batch of look-ahead: when the last batch is yielded every stream is already marked
        # exhausted, so a state saved then resumes into an empty rest of the epoch; the epoch
        # ends (and its counter advances) at StopIteration, as for map-style datasets.
        out = self._pending if self._started else self._read()
        self._started = True
        if out is None:
            self._close()
            self._done = True
            progress.end_epoch()
            raise StopIteration
        self._pending = self._read()
        progress.iterable.record(out.worker, out.batches, out.state)
        progress.advance(progress.position + 1)
        batch = out.batch
        if self._pin_device is not None:
            batch = _pin(batch, self._pin_device)
        return batch

    def _close(self) -> None:
        """Shut torch's inner iterator (and its workers) down; idempotent."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
