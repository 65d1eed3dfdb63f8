"""L2: evaluation of sequence items in worker processes, shared memory, global-RNG seeding."""

from seqloader.prefetch.prefetch import Prefetch, prefetch

__all__ = ["Prefetch", "prefetch"]
