"""L3: the sampler objects a ``seqloader.DataLoader`` shows as ``loader.sampler``, whose
``set_epoch`` reaches the loader.

With its built-in order (no ``sampler``/``batch_sampler`` argument) the loader does not read
``loader.sampler``: the epoch's order comes from ``(seed, epoch)``. But frameworks tell a loader
its epoch through that object: Lightning calls ``set_epoch`` on ``loader.sampler`` and on
``loader.batch_sampler.sampler`` (after ``iter()`` when a ``fit`` begins), not on the loader. So the
loader shows torch's own classes, ``RandomSampler`` for ``shuffle=True`` and ``SequentialSampler``
otherwise (Lightning decides from the class whether to shuffle its ``DistributedSampler``), with
a ``set_epoch`` that calls the loader's.

The sampler holds a weak reference to its loader (no cycle keeps the loader's workers alive);
pickling or copying the loader keeps the pair together.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch.utils.data

__all__ = ["forwarding_sampler", "install_forwarding_sampler"]


class _ForwardsEpoch:
    """``set_epoch`` calls the owning loader's ``set_epoch``."""

    _loader: Callable[[], Any]  # a weak reference to the loader (or a dead one)

    def set_epoch(self, epoch: int) -> None:
        """Set the owning loader's epoch (:meth:`seqloader.DataLoader.set_epoch`)."""
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_loader"] = self._loader()  # a strong reference inside the pickle: it is rebuilt with the loader
        return state

    def __setstate__(self, state: dict) -> None:
        loader = state.pop("_loader")
        self.__dict__.update(state)
        self._loader = weakref.ref(loader) if loader is not None else _dead


def _dead() -> None:
    return None


class LoaderRandomSampler(_ForwardsEpoch, torch.utils.data.RandomSampler):
    """torch's ``RandomSampler`` (as Lightning and torch see it) whose ``set_epoch`` reaches the loader."""


class LoaderSequentialSampler(_ForwardsEpoch, torch.utils.data.SequentialSampler):
    """torch's ``SequentialSampler`` (as Lightning and torch see it) whose ``set_epoch`` reaches the loader."""


def forwarding_sampler(sampler: Any, loader: Any) -> Any:
    """The same sampler as torch's default ``sampler``, with ``set_epoch`` forwarded to ``loader``.

    Args:
        sampler: the ``RandomSampler`` or ``SequentialSampler`` torch's ``DataLoader`` built.
        loader: the loader that owns it (held weakly).

    Example:
        >>> class Loader:
        ...     def set_epoch(self, epoch): print("loader epoch", epoch)
        >>> loader = Loader()
        >>> s = forwarding_sampler(torch.utils.data.SequentialSampler(range(3)), loader)
        >>> isinstance(s, torch.utils.data.SequentialSampler), list(s)
        (True, [0, 1, 2])
        >>> s.set_epoch(2)
        loader epoch 2
    """
    classes: dict[type, type[_ForwardsEpoch]] = {torch.utils.data.RandomSampler: LoaderRandomSampler,
                                                 torch.utils.data.SequentialSampler: LoaderSequentialSampler}
    cls = classes[type(sampler)]
    forwarding = cls.__new__(cls)
    forwarding.__dict__.update(sampler.__dict__)
    forwarding._loader = weakref.ref(loader)
    return forwarding


def install_forwarding_sampler(loader: Any) -> None:
    """Put :func:`forwarding_sampler` of ``loader``'s default sampler in both places torch keeps it.

    torch forbids assigning ``.sampler`` after ``__init__``, and the copy is the same sampler, so it
    is set underneath (``object.__setattr__``: Lightning, which records attributes set after
    ``__init__``, does not see it), and as its ``batch_sampler``'s ``sampler``.

    Example:
        >>> loader = torch.utils.data.DataLoader(range(3), batch_size=2)
        >>> install_forwarding_sampler(loader)
        >>> type(loader.sampler).__name__, loader.batch_sampler.sampler is loader.sampler
        ('LoaderSequentialSampler', True)
        >>> loader = torch.utils.data.DataLoader(range(3), batch_size=None)  # no batch_sampler
        >>> install_forwarding_sampler(loader); loader.batch_sampler is None
        True
    """
    default = forwarding_sampler(loader.sampler, loader)
    object.__setattr__(loader, "sampler", default)
    if loader.batch_sampler is not None:  # batch_size=None has none
        loader.batch_sampler.sampler = default
