"""L3: the loader's public settings that its parts read: :class:`Settings` (a protocol, no code).

The parts (the epoch's opening, the reading, the saving, the verbs) read torch's attributes of
the loader through it, never the loader's private attributes.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

__all__ = ["Settings"]


class Settings(Protocol):
    """The loader's public settings that its parts read (torch's attributes, and ``seed``)."""

    dataset: Any
    num_workers: int
    worker_method: Any  # a str, or a RayWorkers
    executor: Any  # its options object (seqloader.prefetcher.options)
    threads_per_worker: int
    in_order: bool
    batch_size: Optional[int]
    drop_last: bool
    collate_fn: Any
    shuffle: Optional[bool]
    seed: int
    pin_memory: bool
    pin_memory_device: str
    timeout: float
    prefetch_factor: Optional[int]
    persistent_workers: bool
    worker_init_fn: Any
    profile_stages: bool

    @property
    def prefetch_factor_given(self) -> bool:
        """Whether the user passed ``prefetch_factor`` (else the loader may read a block shuffle deeper)."""
        ...
