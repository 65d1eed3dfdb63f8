"""One epoch of a map-style ``seqloader.DataLoader``: its iterator, worker pool and pinning.

``_MapIterator`` reads the epoch's batch sequence (``loader/fetch.py``) in order, from the main
process or from a :class:`~seqloader.prefetch.prefetch.Prefetch` over worker processes, and moves
the loader's ``(epoch, position)`` forward as batches are yielded; ``_Workers`` owns that
``Prefetch`` (one per epoch, or kept across epochs with ``persistent_workers``).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin

from seqloader.loader.fetch import EpochBatches
from seqloader.prefetch.seeding import preserved_globals
from seqloader.rng import derive_seed

__all__ = ["MapIterator", "Workers", "pin_device"]


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


class Workers:
    """The loader's ``Prefetch`` over worker processes: opened per epoch or kept (persistent)."""

    def __init__(self):
        self.prefetch = None
        self.persistent = False

    def open(self, loader: Any, seq: EpochBatches):
        from seqloader.prefetch.prefetch import prefetch

        # EpochBatches seeds the global RNGs per batch itself, so Prefetch's per-item seeding
        # stays off (seed=None); workers start from a base seed derived from (seed, epoch).
        if self.prefetch is not None and loader.persistent_workers and not self.prefetch.closed:
            self.prefetch.reset(seq, seed=None, epoch=seq._epoch)
            return self.prefetch
        self.close()
        self.prefetch = prefetch(
            seq, loader.num_workers, prefetch_factor=loader.prefetch_factor,
            multiprocessing_context=loader.multiprocessing_context,
            worker_init_fn=loader.worker_init_fn, timeout=loader.timeout, seed=None,
            epoch=seq._epoch, dataset=loader.dataset,
            base_seed=derive_seed(loader.seed, "worker", seq._epoch) >> 2)
        self.persistent = loader.persistent_workers
        return self.prefetch

    def drop_transient(self) -> None:
        """Close non-persistent workers (a new iterator starts its own)."""
        if not self.persistent:
            self.close()

    def close(self) -> None:
        if self.prefetch is not None:
            pf, self.prefetch = self.prefetch, None
            pf.close()


class MapIterator:
    """Reads one epoch's batch sequence in order and advances the loader's position."""

    def __init__(self, loader: Any, generation: int, seq: EpochBatches, source: Any,
                 pin_device: Optional[str]):
        self._loader = loader
        self._generation = generation
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
        loader = self._loader
        if self._done:
            raise StopIteration
        if loader._generation != self._generation:
            self._done = True
            raise RuntimeError("DataLoader: this iterator was superseded by a later iter(loader) or "
                               "load_state_dict(); iterate the loader again")
        b, n = self._next, len(self._seq)
        if b >= n:  # an empty epoch
            self._done = True
            loader._next_epoch()
            raise StopIteration
        if self._source is self._seq:
            with preserved_globals():
                batch = self._seq[b]
        else:
            batch = self._source[b]
        self._next = b + 1
        if b + 1 == n:
            self._done = True
            loader._next_epoch()
            loader._workers.drop_transient()
        else:
            loader._position = self._seq.end_position(b)
        if self._pin_device is not None:
            batch = _pin(batch, self._pin_device)
        return batch
