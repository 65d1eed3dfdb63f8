"""One epoch of a map-style ``seqloader.DataLoader``: its iterator, and pinning.

:class:`MapIterator` reads the epoch's batch sequence (:class:`~seqloader.loader.fetch.EpochBatches`)
in order, from the main process or from the :class:`~seqloader.prefetcher.prefetch.Prefetch` of
:class:`~seqloader.loader.workers.Workers`, and moves the loader's
:class:`~seqloader.loader.progress.Progress` forward as batches are yielded.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from seqloader.loader.fetch import EpochBatches
from seqloader.loader.progress import Progress
from seqloader.loader.seeding import preserved_globals
from seqloader.loader.workers import Workers

__all__ = ["MapIterator", "pin_device", "superseded_error"]


def superseded_error() -> RuntimeError:
    """The error of an iterator whose loader was iterated again or loaded a state."""
    return RuntimeError("DataLoader: this iterator was superseded by a later iter(loader) or "
                        "load_state_dict(); iterate the loader again")


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


class MapIterator:
    """Reads one epoch's batch sequence in order and advances the loader's progress."""

    def __init__(self, loader: Any, progress: Progress, generation: int, workers: Workers,
                 seq: EpochBatches, source: Any, pin_device: Optional[str]):
        self._loader = loader  # only kept alive: its finalizer would close the workers we read
        self._progress = progress
        self._generation = generation
        self._workers = workers
        self._seq = seq
        self._source = source
        self._pin_device = pin_device
        self._next = 0
        self._done = False

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self._seq)

    def __next__(self):
        if self._done:
            raise StopIteration
        progress = self._progress
        if progress.superseded(self._generation):
            self._done = True
            raise superseded_error()
        b, n = self._next, len(self._seq)
        if b >= n:  # an empty epoch
            self._done = True
            progress.end_epoch()
            raise StopIteration
        if self._source is self._seq:
            with preserved_globals():
                batch = self._seq[b]
        else:
            batch = self._source[b]
        self._next = b + 1
        if b + 1 == n:
            self._done = True
            progress.end_epoch()
            self._workers.drop_transient()
        else:
            progress.advance(self._seq.end_position(b))
        if self._pin_device is not None:
            batch = _pin(batch, self._pin_device)
        return batch
