"""L3: the loader's topology: ``(rank, world_size)`` of ``torch.distributed``, and a seed all ranks share.

A caller whose data-parallel group is not the whole world (torchtitan's ``dp_rank`` of
``dp_world_size`` under tensor or pipeline parallelism) names it with :func:`topology` around its
calls into the loader: a ``with`` block that sets a context variable of the calling thread and
restores it on exit (nothing process-wide, nothing left behind).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch
import torch.distributed as dist

__all__ = ["check_seed_is_shared", "current_world", "draw_seed", "topology"]

_TOPOLOGY: contextvars.ContextVar[Optional[tuple[int, int]]] = contextvars.ContextVar(
    "seqloader_topology", default=None)


def current_world() -> tuple[int, int]:
    """``(rank, world_size)``: the innermost :func:`topology` block's, else ``torch.distributed``'s
    if initialised, else ``(0, 1)``.

    The one place the loader asks for its topology; tests replace it to simulate ranks.

    Example:
        >>> current_world()
        (0, 1)
        >>> with topology(2, 4):
        ...     current_world()
        (2, 4)
    """
    given = _TOPOLOGY.get()
    if given is not None:
        return given
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def topology(rank: int, world_size: int) -> Iterator[None]:
    """Within the block, :func:`current_world` is ``(rank, world_size)`` in this thread (and the
    contexts copied from it); the previous value is restored on exit.

    Example:
        >>> with topology(0, 2):
        ...     current_world()
        (0, 2)
        >>> with topology(2, 2):
        ...     pass
        Traceback (most recent call last):
        ValueError: topology: rank 2 out of range [0, 2) (world_size=2)
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or isinstance(world_size, bool) \
            or not isinstance(world_size, int):
        raise TypeError(f"topology: rank and world_size must be ints (got {rank!r}, {world_size!r})")
    if world_size < 1:
        raise ValueError(f"topology: world_size must be >= 1 (got {world_size})")
    if not 0 <= rank < world_size:
        raise ValueError(f"topology: rank {rank} out of range [0, {world_size}) (world_size={world_size})")
    token = _TOPOLOGY.set((rank, world_size))
    try:
        yield
    finally:
        _TOPOLOGY.reset(token)


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """A seed drawn from ``generator`` (torch's default generator if ``None``), broadcast from rank 0.

    ``torch.manual_seed(s)`` before the call reproduces the draw. Under an initialised
    ``torch.distributed`` with more than one rank, every rank gets rank 0's draw (a collective:
    every rank must call it). ``broadcast_object_list`` picks the device the backend needs: the
    CPU for gloo, ``torch.cuda.current_device()`` for NCCL, which rejects CPU tensors.

    Example:
        >>> _ = torch.manual_seed(0); a = draw_seed()
        >>> _ = torch.manual_seed(0); a == draw_seed()
        True
    """
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
    rank, world = current_world()
    if world > 1:
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = box[0]
    return seed


def check_seed_is_shared(seed_world: Optional[int]) -> None:
    """Raise if a seed drawn per process (``seed=None``, drawn when the world had ``seed_world``
    ranks, or ``None`` if it was given or loaded) would now shard one global order over ranks that
    may not agree on it.

    Example:
        >>> check_seed_is_shared(None); check_seed_is_shared(1)
    """
    size = current_world()[1]
    if size > 1 and seed_world is not None and seed_world != size:
        raise ValueError(
            f"DataLoader: seed=None was drawn when torch.distributed had world_size={seed_world}, but it "
            f"now has world_size={size}, so the ranks may not agree on the epoch order; build the loader "
            "after init_process_group, or pass seed=, or load a state_dict")
