"""L3: seeding of the global RNGs (``random``, ``numpy.random``, torch) per batch, and restoring them.

User code (a dataset's ``__getitem__``, a ``collate_fn``) often draws from the global RNGs. To make
that reproducible whichever process computes an item, the item is computed right after
:func:`seed_globals` with a seed derived from ``(seed, epoch, index)`` by
:func:`seqloader.rng.derive_seed`. In the main process the caller's RNG states are saved and put
back around that work by :func:`preserved_globals`. A thread worker's generators are its own
(:mod:`seqloader.loader.workers.threads`): :func:`seed_globals` seeds those there, with the same
seeds, and :func:`watch_globals` lets its probe report draws from the shared globals. The
generators are written by :func:`seqloader.loader.rngs.generators.seed_generators`, the one seeder.
"""

from __future__ import annotations

import contextlib
import random  # (the doctests)
from typing import Iterator, Optional

from seqloader.loader.rngs.snapshots import Snapshot
from seqloader.loader.rngs.generators import seed_generators
from seqloader.loader.rngs.probe import GlobalDrawProbe, current_thread_rngs
from seqloader.orders.orders import DERIVATION  # the scheme's number lives with the orders it names
from seqloader.rng import derive_seed, hash_seed

__all__ = ["DERIVATION", "preserved_globals", "sampler_globals", "seed_globals", "torch_seed", "watch_globals"]


def torch_seed(s: int, derivation: int = DERIVATION) -> int:
    """The seed given to torch's generator for the derived 64-bit seed ``s``.

    Example:
        >>> torch_seed(2**64 - 1, derivation=1), torch_seed(2**64 - 1) < 2**63
        (18446744073709551615, True)
    """
    return s if derivation == 1 else s >> 1


def seed_globals(seed: int, epoch: int, index: int, derivation: int = DERIVATION) -> int:
    """Seed ``random``, ``numpy.random`` and torch's default CPU generator for item ``index`` (in a
    thread worker: the thread's own three, with the same seeds).

    Args:
        seed: the pipeline's seed, an int in ``[0, 2**64)``.
        epoch: the epoch, ``>= 0``.
        index: the item (or batch) position, ``>= 0``.
        derivation: see :data:`DERIVATION`.

    Returns:
        The derived 64-bit seed (``hash_seed(seed, "batch_globals", epoch, index)``, or
        ``derive_seed`` for derivation 1).

    Example:
        >>> _ = seed_globals(0, 0, 5); a = random.random()
        >>> _ = seed_globals(0, 0, 5); a == random.random()
        True
    """
    if derivation == 1:
        s = derive_seed(seed, "batch_globals", epoch, index)
    else:
        s = hash_seed(seed, "batch_globals", epoch, index)
    rngs = current_thread_rngs()
    # torch's CPU generator alone, not torch.manual_seed: its accelerator hooks cost about 1 ms per
    # call on a CPU-only build and would reseed CUDA generators that preserved_globals does not restore
    seed_generators(s, s & 0xFFFFFFFF, torch_seed(s, derivation), rng=None if rngs is None else rngs.rng)
    return s


def watch_globals(epoch: int) -> Optional[tuple[GlobalDrawProbe, tuple]]:
    """In a thread worker, at its first batch of ``epoch``: the loader's probe, watching this
    thread's draws from the global generators until ``probe.check(watched, what)``; else ``None``."""
    rngs = current_thread_rngs()
    if rngs is None or rngs.probe is None:
        return None
    watched = rngs.probe.watch(rngs, epoch)
    return None if watched is None else (rngs.probe, watched)


@contextlib.contextmanager
def preserved_globals() -> Iterator[None]:
    """Save the states of ``random``, ``numpy.random`` and torch's CPU generator; restore on exit
    (:class:`~seqloader.loader.rngs.snapshots.Snapshot`).

    Example:
        >>> random.seed(1); before = random.random(); random.seed(1)
        >>> with preserved_globals():
        ...     _ = seed_globals(9, 0, 0)
        >>> random.random() == before
        True
    """
    snapshot = Snapshot()  # a raw copy, or get_state() on the plain snapshots route (docs/design.md)
    try:
        yield
    finally:
        snapshot.restore()


@contextlib.contextmanager
def sampler_globals(seed: int, epoch: int, derivation: int = DERIVATION) -> Iterator[None]:
    """Seed ``random``, ``numpy.random`` and torch's generator from ``(seed, "sampler", epoch)``.

    The caller's states are restored on exit. The loader iterates a custom sampler inside this,
    so a sampler drawing from the global RNGs (``RandomSampler`` without a generator) gives the
    same order for the same ``(seed, epoch)``, which makes its epochs resumable.
    """
    s = derive_seed(seed, "sampler", epoch)
    with preserved_globals():
        seed_generators(s, s & 0xFFFFFFFF, torch_seed(s, derivation))
        yield
