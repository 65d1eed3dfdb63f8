"""L3: where a loader stands: ``(epoch, position)``, which iterator may move it, which epoch it reads.

One concept, the loader's progress, in two classes: :class:`Progress` holds it, and
:class:`EpochControl` applies the rule of ``set_epoch`` to it (the epoch counter *is* progress;
it was ``epoch_control.py``, a twin of the map-style iterator's ``epoch.py``, now ``epoch/map_iterator.py``, in name only).

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

**Whether an opened epoch is stale** is one value compared in one place: :meth:`Progress.mark`
returns a :class:`Mark` (the epoch and the version of what it reads), the opened epoch holds the
mark it was opened at, and :meth:`Mark.since` says what changed since then: nothing, the epoch
(``set_epoch``), or what the epoch reads (a recipe change, a load). ``position`` and ``ahead``
are not in it: they are the reader's own progress, never a reason to reopen. The mark is the
progress's record of those fields (``epoch`` and ``recipe_changes`` read it), replaced when one
changes, so the iterator's check per batch is an identity test. A new kind of change during a run
is one more field of :class:`Mark` and its bump here: no new branch anywhere.

For an ``IterableDataset`` it also holds the per-worker :class:`~seqloader.loader.state.state.IterableState`.

**Which epoch.** The first ``iter(loader)`` reads epoch 0. The epoch counter advances when the last
batch of an epoch is yielded (or when an iterator finds its epoch empty), and also when ``iter()``
is called again after an unfinished epoch (like torch, every ``iter()`` is a new epoch) unless
``load_state_dict`` was called in between: then the next ``iter()`` resumes the loaded state.
Frameworks tell a loader its epoch: the transformers ``Trainer`` calls ``loader.set_epoch``,
Lightning calls ``set_epoch`` on ``loader.sampler`` (which forwards to the loader) or on its own
``DistributedSampler``, whose ``set_epoch`` the loader *follows*. :class:`EpochControl` applies the
rule of :meth:`seqloader.DataLoader.set_epoch` to the :class:`Progress`: the epoch moves at once
when no batch of the current one was read or none is left, else at the next ``iter()``; an
iterator settles its order at its first ``next()`` (:meth:`EpochControl.settle`), so a
``set_epoch`` between ``iter()`` and the first batch is read.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple, Optional

from seqloader.loader.state.state import IterableState

__all__ = ["EPOCH", "NONE", "RECIPE", "Change", "EpochControl", "Mark", "Progress"]


class Change(enum.Enum):
    """What changed since an epoch was opened (:meth:`Mark.since`)."""

    NONE = "none"      #: nothing but the reader's own reads (``position``, ``ahead``)
    EPOCH = "epoch"    #: the loader reads another epoch now (``set_epoch``)
    RECIPE = "recipe"  #: what the epoch reads changed from the frontier on (weights, skips, a load)


class Mark(NamedTuple):
    """Which epoch a loader reads and the version of what it reads; see the module docstring.

    Every field after ``epoch`` versions *what* the epoch reads: a new kind of change during a run
    is one more field (with its bump in :class:`Progress`), reported as :attr:`Change.RECIPE`.

    Example:
        >>> opened = Mark(epoch=0)
        >>> Mark(0).since(opened), Mark(1).since(opened), Mark(0, recipe_changes=1).since(opened)
        (<Change.NONE: 'none'>, <Change.EPOCH: 'epoch'>, <Change.RECIPE: 'recipe'>)
    """

    epoch: int
    recipe_changes: int = 0  # recipe changes (weights, skips) and loads: live iterators reopen

    def since(self, opened: "Mark") -> Change:
        """What changed from ``opened`` (the mark an epoch was opened at) to this mark."""
        if self is opened or self == opened:  # the usual case, once per batch: an identity test
            return NONE
        return EPOCH if self.epoch != opened.epoch else RECIPE


#: The members of :class:`Change` as module constants (looking up an enum member costs ~0.1 µs on
#: Python 3.11; an iterator compares once per batch).
NONE, EPOCH, RECIPE = Change.NONE, Change.EPOCH, Change.RECIPE


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
        self._mark = Mark(epoch=0)      # the epoch and the version of what is read (see mark())
        self.position = 0              # samples of the epoch's global order already yielded
        self.ahead: tuple[int, ...] = ()  # in_order=False: keys of batches yielded past position
        self.step = 0                  # the global step of the batch at position (across epochs)
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

    def mark(self) -> Mark:
        """The epoch and the version of what it reads, as one value (the same object until one
        changes; compare marks with :meth:`Mark.since`)."""
        return self._mark

    @property
    def epoch(self) -> int:
        """The epoch being read (or next to be read)."""
        return self._mark.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._mark = self._mark._replace(epoch=epoch)

    @property
    def recipe_changes(self) -> int:
        """How many times the recipe changed (or a state was loaded): iterators opened before reopen."""
        return self._mark.recipe_changes

    @recipe_changes.setter
    def recipe_changes(self, count: int) -> None:
        self._mark = self._mark._replace(recipe_changes=count)

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


class EpochControl:
    """``set_epoch`` for one loader; see the module docstring.

    Args:
        progress: the loader's progress.
        iterable: the dataset is an ``IterableDataset`` (a stream's iterator is opened at
            ``iter()``, so its epoch is fixed from then on).
        owner: the sampler with ``set_epoch`` that the loader follows (a custom sampler, a
            ``batch_sampler``'s sampler, or a seekable sampler), or ``None``.
        forget: called when the owner's new epoch changes its indices (read them again).

    Example:
        >>> p = Progress(); c = EpochControl(p, iterable=False, owner=None, forget=None)
        >>> c.set_epoch(3, used_up=lambda: False); p.epoch
        3
    """

    def __init__(self, progress: Progress, iterable: bool, owner: Any, forget: Optional[Callable[[], None]]):
        self.progress, self._iterable, self._owner, self._forget = progress, iterable, owner, forget
        self._seen: Any = None  # the followed sampler's epoch when iter() looked at it

    def look(self) -> None:
        """At ``iter()``: note the followed sampler's epoch, for :meth:`settle`."""
        self._seen = getattr(self._owner, "epoch", None)

    def set_epoch(self, epoch: int, used_up: Callable[[], bool]) -> None:
        """The loader's ``set_epoch``: tell the followed sampler too (as accelerate's loaders do);
        ``used_up``: whether nothing of the current epoch is left to read (asked only when needed)."""
        if self._owner is not None:
            self._owner.set_epoch(epoch)
        self.move(epoch, used_up)

    def move(self, epoch: int, used_up: Callable[[], bool]) -> None:
        """Move the progress to ``epoch`` now or at the next ``iter()``."""
        progress = self.progress
        if self._iterable:
            now = not progress.begun and not progress.started
        else:
            now = not progress.begun or used_up()
        progress.set_epoch(epoch, now)

    def settle(self, used_up: Callable[[], bool]) -> bool:
        """At an iterator's first ``next()``: follow a sampler's ``set_epoch`` made since ``iter()``
        (:meth:`look`; ``used_up``: whether nothing of the current epoch is left, asked only when
        needed). Returns whether the order must be read again although the loader's epoch and
        position did not change (the sampler's new epoch changes its indices)."""
        if self._owner is None:
            return False
        now = getattr(self._owner, "epoch", None)
        if now == self._seen or not isinstance(now, int):
            return False
        self.move(now, used_up)
        if self.progress.begun:  # mid-epoch (a resumed one): read on as it began
            return False
        if self._forget is not None:
            self._forget()
        return True
