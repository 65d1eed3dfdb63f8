"""torchdata's ``Stateful`` protocol and ``StatefulDistributedSampler``, under seqloader's names.

Code written for torchdata's ``StatefulDataLoader`` imports both from
``torchdata.stateful_dataloader``; with :class:`seqloader.StatefulDataLoader` they come from here
(``seqloader.Stateful``, ``seqloader.StatefulDistributedSampler``), with the same names, state and
behaviour:

* :class:`Stateful` is a runtime-checkable ``typing.Protocol``: any object with ``state_dict()``
  and ``load_state_dict(state)`` passes ``isinstance(obj, Stateful)``.
* :class:`StatefulDistributedSampler` is torch's ``DistributedSampler`` (the same order, from the
  same arguments) that counts the indices its current iterator has yielded. Its state is
  ``{"yielded": n}``; after ``load_state_dict`` the next ``iter()`` skips the first ``n`` indices
  of the epoch's order and counts on from ``n``.

Where this differs from torchdata's sampler, on purpose:

* ``iter(sampler)`` starts the epoch at once (the order is computed and ``yielded`` is reset, or
  set to the loaded value, when ``iter`` is called, as torch's ``DistributedSampler`` computes its
  order), not at the first ``next``;
* ``state_dict()`` right after ``load_state_dict(sd)`` returns ``sd`` (the loaded position is
  pending, not lost), so saving again before iterating saves the same state;
* ``load_state_dict`` checks the value: a non-int or ``bool`` is a ``TypeError``; a negative
  value, or one above ``len(sampler)`` (a state saved for another dataset or world size), a
  missing or an unknown key is a ``ValueError``, each naming the key.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Protocol, runtime_checkable

import torch.utils.data.distributed

from seqloader.errors import check_nonnegative_int

__all__ = ["Stateful", "StatefulDistributedSampler"]


@runtime_checkable
class Stateful(Protocol):
    """An object whose progress can be saved and restored: torchdata's ``Stateful`` protocol.

    :class:`seqloader.DataLoader` saves the ``state_dict()`` of a sampler or dataset that follows
    it verbatim and hands it back to ``load_state_dict`` on resume. Nothing needs to inherit from
    it: ``isinstance(obj, Stateful)`` checks that ``obj`` has both methods (not their signatures):
    ``state_dict() -> dict`` returns the state to save (best made of JSON types) and
    ``load_state_dict(state_dict: dict) -> None`` restores one.

    Example:
        >>> class Counter:
        ...     def __init__(self): self.n = 0
        ...     def state_dict(self): return {"n": self.n}
        ...     def load_state_dict(self, state_dict): self.n = state_dict["n"]
        >>> isinstance(Counter(), Stateful), isinstance(object(), Stateful)
        (True, False)
        >>> isinstance(type("OnlySave", (), {"state_dict": dict})(), Stateful)
        False
    """

    def state_dict(self) -> dict:
        """The state to save."""
        ...  # pragma: no cover - protocol

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a state returned by :meth:`state_dict`."""
        ...  # pragma: no cover - protocol


class StatefulDistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """torch's ``DistributedSampler`` that can be saved and resumed mid-epoch (torchdata's class).

    The order is torch's, computed by ``DistributedSampler.__iter__`` from ``(seed, epoch)``
    (``set_epoch`` changes it, as in torch). ``yielded`` counts the indices the current iterator
    has yielded this epoch; ``state_dict()`` is ``{"yielded": yielded}``. ``load_state_dict(sd)``
    stores ``sd["yielded"]`` in ``next_yielded``; the next ``iter()`` consumes it: it skips that
    many indices of the epoch's order, yields the rest, and counts on from there. Every other
    ``iter()`` starts the epoch from its first index with ``yielded = 0``.

    Args:
        dataset: the dataset (only ``len`` is used).
        num_replicas: the number of ranks; ``None`` asks the initialised ``torch.distributed``.
        rank: this process's rank in ``[0, num_replicas)``; ``None`` asks ``torch.distributed``.
        shuffle: permute the indices with a generator seeded by ``seed + epoch``.
        seed: the shuffle seed; it must be the same on every rank.
        drop_last: drop the tail that does not divide evenly over the ranks instead of padding
            the order with its first indices.

    Raises:
        ValueError: ``rank`` is outside ``[0, num_replicas)`` (torch's check).
        RuntimeError, ValueError: ``num_replicas`` or ``rank`` is ``None`` without an initialised
            process group (torch's check).

    Example:
        >>> s = StatefulDistributedSampler(range(10), num_replicas=2, rank=0, shuffle=False)
        >>> it = iter(s); [next(it), next(it)], s.state_dict()
        ([0, 2], {'yielded': 2})
        >>> resumed = StatefulDistributedSampler(range(10), num_replicas=2, rank=0, shuffle=False)
        >>> resumed.load_state_dict(s.state_dict())
        >>> list(resumed), resumed.state_dict(), list(resumed)
        ([4, 6, 8], {'yielded': 5}, [0, 2, 4, 6, 8])
        >>> list(StatefulDistributedSampler([], num_replicas=2, rank=1))
        []
    """

    #: The one key of the state (torchdata's tests read this attribute).
    _YIELDED = "yielded"

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last)
        self.yielded = 0
        self.next_yielded: Optional[int] = None

    def __iter__(self) -> Iterator[int]:
        skip = 0 if self.next_yielded is None else self.next_yielded
        self.next_yielded = None
        order = super().__iter__()
        self.yielded = skip
        return self._counted(itertools.islice(order, skip, None))

    def _counted(self, indices: Iterator[int]) -> Iterator[int]:
        for index in indices:
            self.yielded += 1
            yield index

    def state_dict(self) -> dict:
        """The sampler's position in the epoch: ``{"yielded": n}``.

        ``n`` is the number of indices the current iterator has yielded this epoch (counting
        the ones a resumed iterator skipped), or, after :meth:`load_state_dict` and before the
        next ``iter()``, the loaded value.

        Returns:
            ``{"yielded": int}``, a dict of JSON types.

        Example:
            >>> s = StatefulDistributedSampler(range(6), num_replicas=1, rank=0, shuffle=False)
            >>> s.state_dict()
            {'yielded': 0}
            >>> _ = list(s); s.state_dict()
            {'yielded': 6}
        """
        n = self.yielded if self.next_yielded is None else self.next_yielded
        return {self._YIELDED: int(n)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next ``iter()`` resume at the position saved by :meth:`state_dict`.

        The value is checked first; then it is stored in ``next_yielded`` (``yielded`` is
        unchanged until the next ``iter()``). The epoch is not part of the state: call
        ``set_epoch`` with the saved epoch as well, as with torch's ``DistributedSampler``.

        Args:
            state_dict: ``{"yielded": n}`` with an int ``0 <= n <= len(self)``.

        Raises:
            TypeError: ``state_dict`` is not a mapping, or ``'yielded'`` is not an int.
            ValueError: ``'yielded'`` is missing, negative or above ``len(self)``, or there
                are other keys.

        Example:
            >>> s = StatefulDistributedSampler(range(10), num_replicas=2, rank=1, shuffle=False)
            >>> s.load_state_dict({"yielded": 3}); s.next_yielded, list(s), s.yielded
            (3, [7, 9], 5)
            >>> s.load_state_dict({"yielded": -1})
            Traceback (most recent call last):
            ValueError: StatefulDistributedSampler.load_state_dict: 'yielded' must be a non-negative int (got -1)
        """
        stage = "StatefulDistributedSampler.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"{stage}: state_dict must be a dict like {{'yielded': 0}} "
                            f"(got {type(state_dict).__name__})")
        if self._YIELDED not in state_dict:
            raise ValueError(f"{stage}: 'yielded' is missing from the state_dict (keys "
                             f"{sorted(map(str, state_dict))}); pass a dict from state_dict()")
        extra = sorted(str(k) for k in state_dict if k != self._YIELDED)
        if extra:
            raise ValueError(f"{stage}: unknown keys {extra} in the state_dict (expected only "
                             "'yielded'); pass a dict from StatefulDistributedSampler.state_dict()")
        n = check_nonnegative_int(stage, "'yielded'", state_dict[self._YIELDED])
        if n > self.num_samples:
            size = len(self.dataset)  # type: ignore[arg-type]  # a DistributedSampler's dataset is sized
            raise ValueError(
                f"{stage}: 'yielded' is {n} in the state_dict but this sampler yields "
                f"{self.num_samples} indices per epoch (len(dataset)={size}, "
                f"num_replicas={self.num_replicas}, drop_last={self.drop_last}); this state was "
                "saved for a different dataset or number of replicas")
        self.next_yielded = n

    def __repr__(self) -> str:
        return (f"StatefulDistributedSampler(len={self.num_samples}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, "
                f"yielded={self.yielded})")
