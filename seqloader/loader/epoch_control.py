"""L3: which epoch the loader reads: the counter, and ``set_epoch`` from frameworks.

The first ``iter(loader)`` reads epoch 0. The epoch counter advances when the last batch of an
epoch is yielded (or when an iterator finds its epoch empty), and also when ``iter()`` is called
again after an unfinished epoch (like torch, every ``iter()`` is a new epoch) unless
``load_state_dict`` was called in between: then the next ``iter()`` resumes the loaded state
(:class:`~seqloader.loader.progress.Progress` keeps that rule).

Frameworks tell a loader its epoch: the transformers ``Trainer`` calls ``loader.set_epoch``,
Lightning calls ``set_epoch`` on ``loader.sampler`` (which forwards to the loader) or on its own
``DistributedSampler``, whose ``set_epoch`` the loader *follows*. :class:`EpochControl` applies the
rule of :meth:`seqloader.DataLoader.set_epoch` to the loader's
:class:`~seqloader.loader.progress.Progress`: the epoch moves at once when no batch of the current
one was read or none is left, else at the next ``iter()``; an iterator settles its order at its
first ``next()`` (:meth:`EpochControl.settle`), so a ``set_epoch`` between ``iter()`` and the first
batch is read.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from seqloader.loader.progress import Progress

__all__ = ["EpochControl", "Watch"]

#: A sampler whose own ``set_epoch`` the loader follows, with its ``epoch`` when it was looked at.
Watch = Optional[tuple[Any, Any]]


class EpochControl:
    """``set_epoch`` for one loader; see the module docstring.

    Args:
        progress: the loader's progress.
        iterable: the dataset is an ``IterableDataset`` (a stream's iterator is opened at
            ``iter()``, so its epoch is fixed from then on).
        owner: the sampler with ``set_epoch`` that the loader follows (a custom sampler, a
            ``batch_sampler``'s sampler, or a seekable sampler), or ``None``.
        forget: called when the owner's new epoch changes its indices (read them again).
        used_up: whether nothing of the current epoch is left to read.

    Example:
        >>> p = Progress(); c = EpochControl(p, iterable=False, owner=None, forget=None, used_up=lambda: False)
        >>> c.set_epoch(3); p.epoch
        3
    """

    def __init__(self, progress: Progress, iterable: bool, owner: Any,
                 forget: Optional[Callable[[], None]], used_up: Callable[[], bool]):
        self._progress, self._iterable, self._owner = progress, iterable, owner
        self._forget, self._used_up = forget, used_up

    def watch(self) -> Watch:
        """The followed sampler and its epoch now (taken at ``iter()``), or ``None``."""
        owner = self._owner
        return None if owner is None else (owner, getattr(owner, "epoch", None))

    def set_epoch(self, epoch: int) -> None:
        """The loader's ``set_epoch``: tell the followed sampler too (as accelerate's loaders do)."""
        if self._owner is not None:
            self._owner.set_epoch(epoch)
        self.move(epoch, used_up=None)

    def move(self, epoch: int, used_up: Optional[bool]) -> None:
        """Move the progress to ``epoch`` now or at the next ``iter()`` (``used_up``: known, or ``None``)."""
        progress = self._progress
        if self._iterable:
            now = not progress.begun and not progress.started
        else:
            now = not progress.begun or (self._used_up() if used_up is None else used_up)
        progress.set_epoch(epoch, now)

    def settle(self, watch: Watch, used_up: bool) -> bool:
        """At an iterator's first ``next()``: follow a sampler's ``set_epoch`` made since ``iter()``
        (``watch``). Returns whether the order must be read again although the loader's epoch and
        position did not change (the sampler's new epoch changes its indices)."""
        if watch is None:
            return False
        owner, seen = watch
        now = getattr(owner, "epoch", None)
        if now == seen or not isinstance(now, int):
            return False
        self.move(now, used_up)
        if self._progress.begun:  # mid-epoch (a resumed one): read on as it began
            return False
        if self._forget is not None:
            self._forget()
        return True
