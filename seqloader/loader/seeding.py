"""L3: seeding of the global RNGs (``random``, ``numpy.random``, torch) per batch, and restoring them.

User code (a dataset's ``__getitem__``, a ``collate_fn``) often draws from the global RNGs. To make
that reproducible whichever process computes an item, the item is computed right after
:func:`seed_globals` with a seed derived from ``(seed, epoch, index)`` by
:func:`seqloader.rng.derive_seed`. In the main process the caller's RNG states are saved and put
back around that work by :func:`preserved_globals`.
"""

from __future__ import annotations

import contextlib
import random
from typing import Iterator

import numpy as np
import torch

from seqloader.rng import derive_seed

__all__ = ["preserved_globals", "seed_globals"]


def seed_globals(seed: int, epoch: int, index: int) -> int:
    """Seed ``random``, ``numpy.random`` and torch's default CPU generator for item ``index``.

    Args:
        seed: the pipeline's seed, an int in ``[0, 2**64)``.
        epoch: the epoch, ``>= 0``.
        index: the item (or batch) position, ``>= 0``.

    Returns:
        The derived 64-bit seed (``derive_seed(seed, "batch_globals", epoch, index)``).

    Example:
        >>> _ = seed_globals(0, 0, 5); a = random.random()
        >>> _ = seed_globals(0, 0, 5); a == random.random()
        True
    """
    s = derive_seed(seed, "batch_globals", epoch, index)
    random.seed(s)
    np.random.seed(s & 0xFFFFFFFF)
    # Same stream as torch.manual_seed(s) on the CPU, without its accelerator hooks: those cost
    # about 1 ms per call on a CPU-only build and would reseed CUDA generators that
    # preserved_globals does not restore.
    torch.default_generator.manual_seed(s)
    return s


@contextlib.contextmanager
def preserved_globals() -> Iterator[None]:
    """Save the states of ``random``, ``numpy.random`` and torch's CPU generator; restore on exit.

    Example:
        >>> random.seed(1); before = random.random(); random.seed(1)
        >>> with preserved_globals():
        ...     _ = seed_globals(9, 0, 0)
        >>> random.random() == before
        True
    """
    py, npy, th = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(th)
