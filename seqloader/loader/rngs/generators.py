"""L3: the one seeder and the one draw check of the three generators user code draws from.

User code draws from ``random``, ``numpy.random`` (its legacy global ``RandomState``) and torch's
default CPU generator. seqloader writes all three in one place, :func:`seed_generators`, whoever
asks: the per-batch seeding and the sampler's (:mod:`seqloader.loader.rngs.seeding`), torch's set-up of a
worker process (:class:`~seqloader.loader.workers.pool.TorchWorkerSetup`), and a thread worker's
generators of its own (:func:`~seqloader.loader.torch_compat.thread_generators`). It tells whether
the global three were drawn from (or reseeded) in one way, :class:`DrawCheck`: their states when it
is made, compared with their states when asked (whether a batch *may* draw, decided before it
without running it, is :mod:`seqloader.loader.rngs.draws`'s declaration). Snapshots that put states back are
:mod:`seqloader.loader.rngs.snapshots` (which also counts seqloader's own settings of the globals,
:func:`~seqloader.loader.rngs.snapshots.reseeds`, so that a check can tell them apart).

Example:
    >>> check = DrawCheck()
    >>> _ = random.random()
    >>> check.moved()
    ('random',)
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from seqloader.loader.rngs.snapshots import random_state, reseeded, reseeding, reseeds
from seqloader.loader.rngs.snapshots import numpy_state as _numpy_state

__all__ = ["GENERATORS", "DrawCheck", "seed_generators"]

#: the names of the three generators, as messages name them
GENERATORS = ("random", "numpy.random", "torch")


def seed_generators(random_seed: int, numpy_seed: Any, torch_seed: int, rng: Any = None,
                    accelerators: bool = False) -> None:
    """Seed ``random``, ``numpy.random`` and torch's CPU generator: the process's global ones, or
    (``rng``, torch's ``_RNG`` container) a thread worker's own three.

    Args:
        random_seed: for ``random.seed`` (an int; the cached Gaussian is dropped, as ``seed`` does).
        numpy_seed: for ``numpy.random.seed`` (an int in ``[0, 2**32)`` or a sequence of them).
        torch_seed: for the torch generator's ``manual_seed``.
        rng: ``None``: the global generators, counted as one setting by seqloader
            (:func:`~seqloader.loader.rngs.snapshots.reseeding`); else the container whose
            ``random_generator``, ``numpy_generator`` and ``torch_generator`` are seeded.
        accelerators: the global torch generator through ``torch.manual_seed`` (which also seeds
            every accelerator's generators, as torch's worker set-up does) instead of the CPU
            generator's ``manual_seed`` alone (about 1 ms less on a CPU-only build, and no CUDA
            generator reseeded that a snapshot would not put back).

    Example:
        >>> seed_generators(7, 7, 7); a = (random.random(), float(np.random.rand()), float(torch.rand(())))
        >>> random.seed(7); np.random.seed(7); _ = torch.manual_seed(7)
        >>> a == (random.random(), float(np.random.rand()), float(torch.rand(())))
        True
        >>> seed_generators(1, [1, 2, 3, 4], 1, rng=object())   # not a container
        Traceback (most recent call last):
        AttributeError: 'object' object has no attribute 'random_generator'
    """
    if rng is not None:
        rng.random_generator.seed(random_seed)
        rng.numpy_generator.seed(numpy_seed)
        rng.torch_generator.manual_seed(torch_seed)
        return
    reseeding()
    try:
        random.seed(random_seed)
        np.random.seed(numpy_seed)
        if accelerators:
            torch.manual_seed(torch_seed)
        else:
            torch.default_generator.manual_seed(torch_seed)
    finally:
        reseeded()


def _torch_state() -> bytes:
    return bytes(torch.default_generator.get_state().numpy())


#: name -> the function that reads that global generator's state (raw where known)
_READ = {"random": random_state, "numpy.random": _numpy_state, "torch": _torch_state}


class DrawCheck:
    """The states of the three global generators when it is made; :meth:`moved` names those that
    changed since (drawn from or reseeded, by any thread), :meth:`drawn` those changed by other
    code than seqloader's own settings.

    A compare of the states: raw bytes where :mod:`~seqloader.loader.rngs.snapshots` knows their
    layout, else the public ``getstate``/``get_state`` (``torch``'s always): about 4.5 µs to make
    and 4.5 µs to ask, 2 µs of each torch's. It cannot tell threads apart: a draw by another thread
    in between counts.

    Example:
        >>> check = DrawCheck()
        >>> check.moved(), check.drawn()
        ((), ())
        >>> _ = torch.rand(()); _ = np.random.rand()
        >>> check.moved()
        ('numpy.random', 'torch')
        >>> seed_generators(0, 0, 0)   # seqloader's own setting, while the check was open
        >>> check.moved(), check.drawn()
        (('random', 'numpy.random', 'torch'), ())
        >>> DrawCheck(("torch",)).moved()   # one generator watched
        ()
    """

    __slots__ = ("_which", "_states", "_reseeds")

    def __init__(self, which: tuple[str, ...] = GENERATORS) -> None:
        """``which``: the generators watched (names of :data:`GENERATORS`, in that order)."""
        self._which = which
        self._reseeds = reseeds()
        self._states = [_READ[name]() for name in which]

    def moved(self) -> tuple[str, ...]:
        """The names of the watched generators whose state is not what it was."""
        return tuple(name for name, state in zip(self._which, self._states) if _READ[name]() != state)

    def drawn(self) -> tuple[str, ...]:
        """:meth:`moved`, or nothing if seqloader set the global states meanwhile (one setting
        was under way when the check was made, or one began since): then what moved is not known
        to be a draw."""
        moved = self.moved()
        begun, finished = self._reseeds
        return moved if begun == finished and reseeds()[0] == begun else ()
