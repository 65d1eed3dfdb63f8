"""L3: where a loader stands: ``(epoch, position)``, which iterator may move it, and resume.

:class:`Progress` is the one owner of a loader's progress. The loader and its iterators change it
only through its verbs:

* :meth:`Progress.begin` when ``iter(loader)`` creates an iterator: a loaded state is resumed;
  otherwise an epoch already begun is over (like torch, every ``iter()`` is a new epoch);
* :meth:`Progress.advance` after a batch is yielded; :meth:`Progress.end_epoch` after the last;
* :meth:`Progress.load` from ``load_state_dict``; :meth:`Progress.superseded` tells an iterator
  that a later ``iter()`` or ``load_state_dict()`` replaced it.

For an ``IterableDataset`` it also holds the per-worker :class:`~seqloader.loader.state.IterableState`.
"""

from __future__ import annotations

from typing import Optional

from seqloader.loader.state import IterableState

__all__ = ["Progress"]


class Progress:
    """A loader's ``(epoch, position)`` and iterator generation; see the module docstring.

    Args:
        streams: for an ``IterableDataset``, the number of worker streams (``max(1, num_workers)``);
            ``None`` for a map-style dataset.
        carry: the streams' dataset objects live on across epochs (persistent workers, or
            ``num_workers=0``): a new epoch keeps each stream's latest state, for a resume.

    Example:
        >>> p = Progress()
        >>> g = p.begin(); p.advance(8); (p.epoch, p.position, p.superseded(g))
        (0, 8, False)
        >>> g2 = p.begin(); (p.epoch, p.position, p.superseded(g))   # a new iter(): a new epoch
        (1, 0, True)
        >>> p.load(epoch=0, position=8); _ = p.begin(); (p.epoch, p.position)
        (0, 8)
    """

    def __init__(self, streams: Optional[int] = None, carry: bool = False):
        self.epoch = 0
        self.position = 0              # samples of the epoch's global order already yielded
        self.ahead: tuple[int, ...] = ()  # in_order=False: keys of batches yielded past position
        self._streams = streams
        self._carry = carry
        self.resumed = False           # the current iterator began from a loaded state
        self.iterable: Optional[IterableState] = None if streams is None else IterableState.fresh(streams)
        self._generation = 0           # bumped by begin() and load(): older iterators stop
        self._started = False          # an iterator has begun the current (epoch, position)
        self._resuming = False         # load() was called: the next begin() resumes

    def begin(self) -> int:
        """Settle ``(epoch, position)`` for a new iterator; return the iterator's generation."""
        self.resumed = self._resuming
        if self._resuming:
            self._resuming = False
        elif self._started:
            self.end_epoch()
        self._started = True
        self._generation += 1
        return self._generation

    def superseded(self, generation: int) -> bool:
        """Whether the iterator of ``generation`` was replaced by a later ``begin`` or ``load``."""
        return generation != self._generation

    def advance(self, position: int, ahead: tuple[int, ...] = ()) -> None:
        """Batches were yielded: ``position`` samples of this epoch's global order are done, and
        (out of order) the batches with keys ``ahead`` beyond it."""
        self.position, self.ahead = position, ahead

    def end_epoch(self) -> None:
        """The epoch is over: the next one starts at position 0."""
        self.epoch += 1
        self.position, self.ahead = 0, ()
        self._started = False
        if self._streams is not None:
            carried = self._carry and self.iterable is not None
            self.iterable = self.iterable.carried() if carried else IterableState.fresh(self._streams)

    def load(self, epoch: int, position: int, iterable: Optional[IterableState] = None,
             ahead: tuple[int, ...] = ()) -> None:
        """Resume from a loaded state at the next :meth:`begin`; live iterators are superseded."""
        self._generation += 1
        self.epoch, self.position, self.ahead = epoch, position, ahead
        if self._streams is not None:
            self.iterable = iterable
        self._started = False
        self._resuming = True

    @property
    def started(self) -> bool:
        """Whether an iterator has begun the current ``(epoch, position)``."""
        return self._started
