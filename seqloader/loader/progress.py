"""L3: where a loader stands: ``(epoch, position)``, which iterator may move it, and resume.

:class:`Progress` is the one owner of a loader's progress. The loader and its iterators change it
only through its verbs:

* :meth:`Progress.begin` when ``iter(loader)`` creates an iterator: a loaded state is resumed;
  otherwise an epoch already begun is over (like torch, every ``iter()`` is a new epoch);
* :meth:`Progress.advance` after a batch is yielded; :meth:`Progress.end_epoch` after the last;
* :meth:`Progress.load` from ``load_state_dict``; :meth:`Progress.superseded` tells an iterator
  that a later ``iter()`` or ``load_state_dict()`` replaced it;
* :meth:`Progress.set_epoch` when a framework (or the user) says which epoch this is: it takes
  effect at once when no batch of the current epoch was read yet or none is left (an iterator that
  has not yielded a batch re-reads its order at its first ``next()``), else at the next ``iter()``.

For an ``IterableDataset`` it also holds the per-worker :class:`~seqloader.loader.state.IterableState`.
"""

from __future__ import annotations

from typing import Optional

from seqloader.loader.stream_state import IterableState

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
        >>> p.set_epoch(5, now=False); (p.epoch, p.position)   # mid-epoch: at the next iter()
        (0, 8)
        >>> _ = p.begin(); (p.epoch, p.position)
        (5, 0)
    """

    def __init__(self, streams: Optional[int] = None, carry: bool = False):
        self.epoch = 0
        self.position = 0              # samples of the epoch's global order already yielded
        self.ahead: tuple[int, ...] = ()  # in_order=False: keys of batches yielded past position
        self.step = 0                  # the global step of the batch at position (across epochs)
        self.recipe_changes = 0        # bumped when the recipe changes mid-epoch: iterators reopen
        self._streams = streams
        self._carry = carry
        self.resumed = False           # the current iterator began from a loaded state
        self.iterable: Optional[IterableState] = None if streams is None else IterableState.fresh(streams)
        self._generation = 0           # bumped by begin() and load(): older iterators stop
        self._started = False          # an iterator has begun the current (epoch, position)
        self._resuming = False         # load() was called: the next begin() resumes
        self._yielded = False          # the current iterator has yielded a batch
        self._next_epoch: Optional[int] = None  # set_epoch() during an epoch: the next begin()'s

    def begin(self) -> int:
        """Settle ``(epoch, position)`` for a new iterator; return the iterator's generation."""
        self.resumed = self._resuming
        if self._resuming:
            self._resuming = False
        elif self._started:
            self.end_epoch()
        if self._next_epoch is not None and not self.resumed:
            self._move(self._next_epoch)
        self._started = True
        self._yielded = False
        self._generation += 1
        return self._generation

    def superseded(self, generation: int) -> bool:
        """Whether the iterator of ``generation`` was replaced by a later ``begin`` or ``load``."""
        return generation != self._generation

    def advance(self, position: int, ahead: tuple[int, ...] = (), step: Optional[int] = None) -> None:
        """Batches were yielded: ``position`` samples of this epoch's global order are done, and
        (out of order) the batches with keys ``ahead`` beyond it; ``step`` is the global step of
        the batch at ``position`` (``None``: one more than before)."""
        self.position, self.ahead = position, ahead
        self.step = self.step + 1 if step is None else step
        self._yielded = True

    def set_epoch(self, epoch: int, now: bool) -> None:
        """A framework's (or the user's) epoch number, as ``DistributedSampler.set_epoch``.

        Args:
            epoch: the epoch to read.
            now: the current epoch has no batch read yet, or none left (the loader knows which):
                move to ``epoch``'s start at once; else at the next :meth:`begin`.
        """
        if epoch == self.epoch:
            self._next_epoch = None
        elif now:
            if self._yielded:  # the live iterator read its epoch to the end: it will not read this one
                self._started = False
            self._move(epoch)
        else:
            self._next_epoch = epoch

    def _move(self, epoch: int) -> None:
        """Go to ``epoch``'s start (an iterable's streams keep what a new epoch starts from)."""
        self.epoch, self.position, self.ahead = epoch, 0, ()
        self._next_epoch = None

    def end_epoch(self) -> None:
        """The epoch is over: the next one starts at position 0."""
        self.epoch += 1
        self.position, self.ahead = 0, ()
        self._started = False
        self._yielded = False
        if self._streams is not None:
            streams = self.iterable
            self.iterable = (streams.carried() if self._carry and streams is not None
                             else IterableState.fresh(self._streams))

    def recipe_changed(self) -> None:
        """The recipe changed from the current position on (weights, skips): live iterators
        read the rest of the epoch again (their read-ahead is dropped)."""
        self.recipe_changes += 1

    def load(self, epoch: int, position: int, iterable: Optional[IterableState] = None,
             ahead: tuple[int, ...] = (), step: int = 0) -> None:
        """Resume from a loaded state at the next :meth:`begin`; live iterators are superseded."""
        self._generation += 1
        self.epoch, self.position, self.ahead, self.step = epoch, position, ahead, step
        self.recipe_changes += 1
        if self._streams is not None:
            self.iterable = iterable
        self._started = False
        self._resuming = True
        self._yielded = False
        self._next_epoch = None

    @property
    def started(self) -> bool:
        """Whether an iterator has begun the current ``(epoch, position)``."""
        return self._started

    @property
    def begun(self) -> bool:
        """Whether batches of the current epoch were read (by an iterator or before a saved state)."""
        return self.position > 0 or bool(self.ahead)
