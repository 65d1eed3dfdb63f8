"""L4: a sequence as a ``torch.utils.data.IterableDataset`` split over workers and ranks.

:func:`as_iterable_dataset` is for code that wants torch's own ``DataLoader`` (or anything that
consumes an ``IterableDataset``) on top of a seqloader pipeline. It does no shuffling or batching
of its own: compose those as sequence ops first (``shuffle(seq, seed)``). It is Stateful
(``state_dict``/``load_state_dict``), so :class:`seqloader.DataLoader` resumes it by seeking each
worker's stream instead of replaying it.

Splitting is *strided*, so no item is dropped or repeated. With ``R`` ranks and ``K`` DataLoader
workers, worker ``w`` of rank ``r`` yields the positions

    ``r + R * (w + K * j)``  for ``j = 0, 1, ...`` (ascending, while ``< len(seq)``)

so rank ``r`` owns ``seq[r::R]`` and its workers take turns through it. torch's ``DataLoader``
takes batches from its workers round-robin, so at ``batch_size=1`` (or ``None``) a rank sees its
part in order. Ranks get ``len(seq) // R`` or ``len(seq) // R + 1`` items: their counts differ by
at most one, which a ``DistributedDataParallel`` loop must handle (``DDP.join()``, or make the
length a multiple of ``R``, or use :class:`seqloader.DataLoader`, which pads or drops to give
every rank the same number of batches).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

import torch.utils.data

from seqloader.errors import check_int, check_nonnegative_int, check_positive_int
from seqloader.loader import world
from seqloader.sequences.base import SliceView

__all__ = ["SequenceIterableDataset", "as_iterable_dataset"]

_OP = "as_iterable_dataset"


def _world(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments if given, else the loader's ``current_world()``."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"{_OP}: rank and world_size must be given together "
                         f"(got rank={rank!r}, world_size={world_size!r})")
    if rank is None:
        return world.current_world()  # torch.distributed's (rank, world_size), else (0, 1)
    world_size = check_positive_int(_OP, "world_size", world_size)
    rank = check_nonnegative_int(_OP, "rank", rank)
    if rank >= world_size:
        raise ValueError(f"{_OP}: rank must be < world_size (got rank={rank}, world_size={world_size})")
    return rank, world_size


class SequenceIterableDataset(torch.utils.data.IterableDataset):
    """The ``IterableDataset`` built by :func:`as_iterable_dataset`; see there.

    Holds the sequence, the rank and the world size (fixed when it is built, in the process that
    builds it); the DataLoader worker split is read from ``get_worker_info()`` in ``__iter__``.

    It is *Stateful* (torchdata's protocol, which :class:`seqloader.DataLoader` uses for
    ``IterableDataset`` s): ``state_dict()`` is ``{"yielded": k}``, the number of items the latest
    iterator of this copy has yielded from its worker's stream, and after ``load_state_dict`` the
    next ``iter()`` starts at item ``k`` of the stream (a seek, not a replay); later iterators
    start at 0. A state only makes sense for the same sequence, rank, world size and number of
    workers.
    """

    def __init__(self, seq: Sequence, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self._part = SliceView(seq, slice(rank, None, world_size))
        self._start = 0      # where the next iterator starts (set by load_state_dict)
        self._yielded = 0    # items yielded by the latest iterator, counted from its stream's start

    def __len__(self) -> int:
        return len(self._part)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        mine = SliceView(self._part, slice(worker, None, num_workers))
        start, self._start = self._start, 0
        self._yielded = start
        for i in range(start, len(mine)):
            item = mine[i]
            self._yielded = i + 1
            yield item

    def state_dict(self) -> dict:
        """``{"yielded": k}``: items of this worker's stream yielded by the latest iterator."""
        return {"yielded": self._yielded}

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` start at item ``state["yielded"]`` of this worker's stream.

        Raises:
            ValueError: ``state`` is not ``{"yielded": <non-negative int>}``.
        """
        if not (isinstance(state, dict) and set(state) == {"yielded"}):
            raise ValueError(f"{self!r}.load_state_dict: expected {{'yielded': int}} (got {state!r})")
        self._start = check_nonnegative_int(f"{self!r}.load_state_dict", "yielded", state["yielded"])

    def __repr__(self) -> str:
        return f"{_OP}(rank={self.rank}, world_size={self.world_size}, len={len(self)})"


def as_iterable_dataset(seq: Sequence, *, rank: Optional[int] = None,
                        world_size: Optional[int] = None) -> SequenceIterableDataset:
    """Wrap a sized, indexable sequence as an ``IterableDataset`` split over ranks and workers.

    Every item of ``seq`` is yielded exactly once over all ranks and all DataLoader workers:
    rank ``r`` of ``R`` owns ``seq[r::R]`` and worker ``w`` of ``K`` yields
    ``seq[r + R * (w + K * j)]`` for ``j = 0, 1, ...`` in that order. Nothing is padded or
    dropped, so ranks' lengths differ by at most one (see the module docstring).

    Args:
        seq: any sized, indexable sequence: a seqloader sequence, a ``list``, a ``range``, a
            map-style dataset with ``__len__``.
        rank: this process's rank; taken from ``torch.distributed`` when it is initialised,
            else 0. Give ``rank`` and ``world_size`` together or neither.
        world_size: the number of ranks; like ``rank``.

    Returns:
        A :class:`SequenceIterableDataset`; its ``len`` is the number of items of this rank,
        ``len(range(rank, len(seq), world_size))``. Rank and world size are read once, here. It
        has ``state_dict``/``load_state_dict`` (a seek into each worker's stream), so
        :class:`seqloader.DataLoader` resumes it exactly with the same number of worker streams
        (``max(1, num_workers)``).

    Raises:
        TypeError: ``seq`` has no ``__len__``/``__getitem__``, or ``rank``/``world_size`` is not an
            int.
        ValueError: only one of ``rank``/``world_size`` is given, ``world_size < 1`` or ``rank``
            is outside ``[0, world_size)``.

    Example:
        >>> parts = [list(as_iterable_dataset(range(7), rank=r, world_size=3)) for r in range(3)]
        >>> parts
        [[0, 3, 6], [1, 4], [2, 5]]
        >>> sorted(sum(parts, [])) == list(range(7))
        True
        >>> len(as_iterable_dataset(range(2), rank=2, world_size=3))   # a rank may get nothing
        0
        >>> as_iterable_dataset(range(4), rank=3, world_size=3)
        Traceback (most recent call last):
        ValueError: as_iterable_dataset: rank must be < world_size (got rank=3, world_size=3)
    """
    if not (hasattr(seq, "__len__") and hasattr(seq, "__getitem__")):
        raise TypeError(f"{_OP}: seq must be a sized, indexable sequence (got {type(seq).__name__}); "
                        f"for an iterator or IterableDataset, shard it yourself")
    if rank is not None:
        check_int(_OP, "rank", rank)
    if world_size is not None:
        check_int(_OP, "world_size", world_size)
    r, w = _world(rank, world_size)
    return SequenceIterableDataset(seq, r, w)
