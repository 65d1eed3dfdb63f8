"""L1: the one place where seeds turn into streams of randomness.

Every random decision in seqloader is a pure function of a user seed and a *position*, never of
the process, the worker id or the order in which items are computed. There are three functions:

=========================================  ==============================================
function                                   used for
=========================================  ==============================================
``derive_seed(seed, "shuffle", epoch)``    the epoch's sample order (``shuffle``, loader)
``derive_seed(seed, "batch_globals",       seeds of ``random``, ``numpy.random`` and
epoch, index)``                            torch's global RNG before item/batch ``index``
``item_rng(seed, index)``                  the ``numpy.random.Generator`` of ``rng_map``
=========================================  ==============================================

``purpose`` is one of the fixed strings in :data:`PURPOSES`; a typo raises instead of silently
producing an unrelated stream. Seeds are ints in ``[0, 2**64)``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from seqloader.errors import check_nonnegative_int

__all__ = ["PURPOSES", "SEED_BOUND", "check_seed", "derive_seed", "hash_seed", "item_rng"]

#: The streams seqloader draws from; the numbers are part of the state format (never renumber).
PURPOSES = {
    "shuffle": 1,
    "rng_map": 2,
    "batch_globals": 3,
    "worker": 4,
    "sampler": 5,
    "mix": 6,
    "block_shuffle": 7,
    "mix_weights": 8,
    "weighted_sampler": 9,
    "thread_worker": 10,
}

#: Seeds are unsigned 64-bit integers.
SEED_BOUND = 2**64


def check_seed(op: str, seed: Any) -> int:
    """Validate a user seed: an int in ``[0, 2**64)``; ``op`` names the caller in errors.

    Example:
        >>> check_seed("shuffle", 7)
        7
        >>> check_seed("shuffle", 2**64)
        Traceback (most recent call last):
        ValueError: shuffle: seed must be < 2**64 (got 18446744073709551616)
    """
    s = check_nonnegative_int(op, "seed", seed)
    if s >= SEED_BOUND:
        raise ValueError(f"{op}: seed must be < 2**64 (got {s})")
    return s


def derive_seed(seed: int, purpose: str, *position: int) -> int:
    """Derive a 64-bit seed for ``purpose`` at ``position`` (e.g. ``epoch`` or ``epoch, index``).

    Args:
        seed: the user seed, an int in ``[0, 2**64)``.
        purpose: one of :data:`PURPOSES`.
        *position: non-negative ints (epoch, batch index, ...).

    Returns:
        An int in ``[0, 2**64)``; equal inputs give equal outputs in every process.

    Raises:
        ValueError: unknown ``purpose`` or a negative position.

    Example:
        >>> derive_seed(0, "shuffle", 1) == derive_seed(0, "shuffle", 1)
        True
        >>> derive_seed(0, "shuffle", 1) != derive_seed(0, "shuffle", 2)
        True
        >>> derive_seed(0, "shufle", 1)
        Traceback (most recent call last):
        ValueError: derive_seed: unknown purpose 'shufle' (expected one of batch_globals, block_shuffle, mix, mix_weights, rng_map, sampler, shuffle, thread_worker, weighted_sampler, worker)
    """
    if purpose not in PURPOSES:
        raise ValueError(f"derive_seed: unknown purpose {purpose!r} (expected one of {', '.join(sorted(PURPOSES))})")
    seed = check_seed("derive_seed", seed)
    pos = [_check_position("derive_seed", "position", p) for p in position]
    state = np.random.SeedSequence(_entropy(seed, purpose, pos)).generate_state(2, dtype=np.uint32)
    return int(state[0]) | (int(state[1]) << 32)


def _check_position(op: str, arg: str, value: Any) -> int:
    i = check_nonnegative_int(op, arg, value)
    if i >= SEED_BOUND:
        raise ValueError(f"{op}: {arg} must be < 2**64 (got {i})")
    return i


def _entropy(seed: int, purpose: str, position: list[int]) -> list[int]:
    """An injective encoding of ``(seed, purpose, position)`` as 32-bit words for ``SeedSequence``.

    Every int takes exactly two words and the number of positions is written out: a plain
    ``SeedSequence([seed, *position])`` splits ints into a variable number of words and pads
    with zeros, so that e.g. ``[2**32, 0]`` and ``[0, 1]`` (seeds ``2**32`` and ``0``) collide.
    """
    words = [seed & 0xFFFFFFFF, seed >> 32, PURPOSES[purpose], len(position)]
    for p in position:
        words += [p & 0xFFFFFFFF, p >> 32]
    return words


_M64 = 2**64 - 1


def _splitmix(x: int) -> int:
    """The finaliser of splitmix64: a bijection of 64-bit ints that mixes every bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def hash_seed(seed: int, purpose: str, *position: int) -> int:
    """A cheap 64-bit seed for ``purpose`` at ``position`` (~1 µs against ~13 µs for
    :func:`derive_seed`), for seeds derived per batch. Arguments are not validated: callers pass
    ints they already checked (``seed`` in ``[0, 2**64)``, non-negative positions below ``2**64``).

    Each input is folded in by a splitmix64 step (``x = mix(x ^ v) + golden``), so every output
    bit depends on every input bit; it is a hash, not an injection (two inputs collide with
    probability about ``2**-64``).

    Example:
        >>> hash_seed(0, "batch_globals", 1, 256) == hash_seed(0, "batch_globals", 1, 256)
        True
        >>> len({hash_seed(0, "batch_globals", 0, k) for k in range(1000)})
        1000
    """
    x = _hash_prefix(seed, purpose, position[:-1]) if position else _splitmix((seed ^ (PURPOSES[purpose] << 56)) & _M64)
    if position:
        x = (_splitmix(x ^ position[-1]) + _GOLDEN) & _M64
    return _splitmix(x)


_GOLDEN = 0x9E3779B97F4A7C15


@functools.lru_cache(maxsize=64)
def _hash_prefix(seed: int, purpose: str, prefix: tuple[int, ...]) -> int:
    """:func:`hash_seed`'s state after ``seed``, ``purpose`` and all positions but the last: the
    same for every batch of an epoch, so it is computed once per epoch (about 0.7 µs a batch)."""
    x = _splitmix((seed ^ (PURPOSES[purpose] << 56)) & _M64)
    for p in prefix:
        x = (_splitmix(x ^ p) + _GOLDEN) & _M64
    return x


def item_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of item ``index`` for ``seed``: a ``SeedSequence`` of ``(seed, "rng_map", index)``.

    Distinct ``(seed, index)`` pairs get distinct ``SeedSequence`` entropy (see ``_entropy``).

    Args:
        seed: an int in ``[0, 2**64)``.
        index: the item position, ``>= 0``.

    Returns:
        A fresh ``numpy.random.Generator``; the same ``(seed, index)`` always gives the same draws.

    Example:
        >>> int(item_rng(3, 10).integers(100)) == int(item_rng(3, 10).integers(100))
        True
        >>> item_rng(3, -1)
        Traceback (most recent call last):
        ValueError: item_rng: index must be a non-negative int (got -1)
    """
    seed = check_seed("item_rng", seed)
    index = _check_position("item_rng", "index", index)
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, "rng_map", [index])))
