"""L3: the batches that need no seeding of the global RNGs: computed by seqloader's own code alone.

The loader seeds ``random``, ``numpy.random`` and torch's generator before each batch and, at
``num_workers=0``, puts the caller's states back after it (:mod:`seqloader.loader.rngs.seeding`): user
code that draws from them (a ``__getitem__``, a ``transform``, a ``collate_fn``) then draws the
same numbers whichever process computes the batch. That costs a few µs to tens of µs a batch; a
columnar batch of a Parquet file costs little more than that. When every line of code that
computes a batch is seqloader's or torch's and draws nothing, the seeding changes nothing: the
batch, the loader's state and the global RNG states afterwards are the same bit for bit. Then it
is skipped.

A batch is computed by ``fetch`` (the dataset's ``__getitems__`` or ``__getitem__``) and
``collate_fn`` (the plan of its indices is index arithmetic; a custom sampler was read at the
epoch's start, seeded there as before). So the seeding is skipped exactly when

* ``collate_fn`` is torch's ``default_collate`` or ``default_convert`` (what ``collate_fn=None``
  means), which draw nothing; and
* the dataset declares ``draws_globals = False`` (an attribute or property) in a class of
  seqloader itself, and no class between it and the dataset's type is from elsewhere: a
  subclass of a seqloader source written in user code counts as drawing, since it may override
  ``__getitems__``. A source declares it only where it calls no user code: ``parquet`` and
  ``arrow_ipc`` over local files with ``transform=None`` (a remote file system's client may
  retry with random back-off).

Anything else (a plain dataset, a ``LazySequence`` op over a source, a custom collate) counts as
drawing and keeps the seeding.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import default_collate, default_convert

__all__ = ["batch_draws_globals", "declares_no_draws"]

#: collate functions of torch that draw from no global RNG
_NO_DRAW_COLLATES = (default_collate, default_convert)


def declares_no_draws(obj: Any) -> bool:
    """Whether seqloader's own class of ``obj`` declares that reading it draws from no global RNG
    (``draws_globals`` false), with no class from elsewhere in between.

    Example:
        >>> declares_no_draws([1, 2]), declares_no_draws(object())
        (False, False)
    """
    for cls in type(obj).__mro__:
        if not cls.__module__.startswith("seqloader."):
            return False
        if "draws_globals" in vars(cls):
            return getattr(obj, "draws_globals") is False
    return False


def batch_draws_globals(dataset: Any, collate_fn: Callable[[Any], Any]) -> bool:
    """Whether computing a batch of ``dataset`` with ``collate_fn`` may draw from the global RNGs
    (then the loader seeds them per batch; see the module docstring).

    Example:
        >>> batch_draws_globals(list(range(4)), default_convert)   # a plain dataset: may draw
        True
    """
    if not any(collate_fn is c for c in _NO_DRAW_COLLATES):
        return True
    return not declares_no_draws(dataset)
