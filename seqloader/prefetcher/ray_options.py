"""Where and how the Ray executor runs: :class:`RayWorkers`, the public options.

``ray`` is imported only when workers start (:func:`~seqloader.prefetcher.ray_connect.connect`):
the options object is plain data with its executor's behaviour, so ``import seqloader`` and
``DataLoader(worker_method=RayWorkers(...))`` import nothing of Ray. The executor itself is
:class:`~seqloader.prefetcher.ray.RayExecutor`, which :meth:`RayWorkers.build` makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from seqloader.prefetcher.checks import check_restarts

if TYPE_CHECKING:
    from seqloader.prefetcher.executor import Executor

__all__ = ["RayWorkers"]


@dataclass(frozen=True)
class RayWorkers:
    """Where and how the Ray executor runs its workers (``prefetch(method=...)``,
    ``DataLoader(worker_method=...)``; ``"ray"`` means ``RayWorkers()``).

    Args:
        address: the cluster to connect to when this process is not connected yet
            (``ray.init(address=address)``); ``None``: ``"auto"``, the cluster this host is part
            of (``ray start``). An existing connection is always used as it is.
        num_cpus: CPUs each actor reserves (Ray's ``num_cpus``; Ray also sets the actor's
            ``OMP_NUM_THREADS`` from it), ``> 0``.
        resources: other resources each actor reserves, e.g. ``{"data_host": 1}`` to place the
            actors only on nodes started with ``ray start --resources='{"data_host": 8}'``.
        scheduling_strategy: Ray's ``scheduling_strategy`` for the actors (``"SPREAD"``, a
            placement group strategy, ...); ``None``: Ray's default.
        connect_timeout: seconds to wait for the cluster at ``address`` when connecting (``> 0``):
            an address nothing answers at raises within this bound instead of waiting for ever.

    Raises:
        TypeError, ValueError: an argument of the wrong type or value.

    Example:
        >>> RayWorkers(num_cpus=2, resources={"data_host": 1})
        RayWorkers(address=None, num_cpus=2, resources={'data_host': 1}, scheduling_strategy=None, connect_timeout=60.0)
        >>> RayWorkers(num_cpus=0)
        Traceback (most recent call last):
        ValueError: RayWorkers: num_cpus must be a number > 0 (got 0); each actor is a process that needs CPU time
    """

    address: Optional[str] = None
    num_cpus: float = 1
    resources: Optional[dict] = None
    scheduling_strategy: Any = None
    connect_timeout: float = 60.0

    def __post_init__(self) -> None:
        t = self.connect_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0 and math.isfinite(t)):
            raise ValueError(f"RayWorkers: connect_timeout must be a number of seconds > 0 (got {t!r})")
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(f"RayWorkers: address must be a str or None (got {type(self.address).__name__})")
        n = self.num_cpus
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not (n > 0 and math.isfinite(n)):
            raise ValueError(f"RayWorkers: num_cpus must be a number > 0 (got {n!r}); each actor is a process "
                             "that needs CPU time")
        if self.resources is not None:
            if not isinstance(self.resources, dict):
                raise TypeError(f"RayWorkers: resources must be a dict or None (got {type(self.resources).__name__})")
            for k, v in self.resources.items():
                if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                    raise ValueError(f"RayWorkers: resources must map names to amounts >= 0 (got {k!r}: {v!r})")
                if k in ("CPU", "GPU", "memory"):
                    raise ValueError(f"RayWorkers: resources holds {k!r}, which Ray takes as its own argument; "
                                     "use num_cpus= for CPUs (GPUs are the training process's)")

    def needs(self) -> dict:
        """What one actor reserves.

        Returns:
            ``{"CPU": num_cpus, **resources}``.

        Example:
            >>> RayWorkers(num_cpus=0.5, resources={"data_host": 1}).needs()
            {'CPU': 0.5, 'data_host': 1}
            >>> RayWorkers().needs()  # no resources: CPUs only
            {'CPU': 1}
        """
        return {"CPU": self.num_cpus, **(self.resources or {})}

    # -- the executor's behaviour (see seqloader.prefetcher.options) ------------------------------

    @property
    def name(self) -> str:
        """The executor's word in messages."""
        return "ray"

    #: the workers are actors, processes anywhere on the cluster: items, sequences and ``shared`` are sent
    in_this_process = False
    #: each actor computes one item at a time
    threads = 1

    @property
    def word(self) -> "RayWorkers":
        """torch's ``worker_method`` for these options: the options themselves (where the actors run)."""
        return self

    def check_num_workers(self, num_workers: int, stage: str = "DataLoader") -> None:
        """Refuse ``num_workers=0``: ``num_workers`` is the number of Ray actors.

        Example:
            >>> RayWorkers().check_num_workers(0)
            Traceback (most recent call last):
            ValueError: DataLoader: worker_method='ray' needs num_workers > 0 (got num_workers=0): num_workers is the number of Ray actors
        """
        if num_workers == 0:
            raise ValueError(f"{stage}: worker_method='ray' needs num_workers > 0 (got num_workers=0): num_workers "
                             "is the number of Ray actors")

    def check(self, stage: str = "prefetch", *, shared: Any = None, restarts: Any = 0, respawn: Any = None) -> int:
        """Ray actors take ``shared``, ``restarts`` (actors lost with their node are replaced) and
        ``respawn``; the restarts, checked.

        Example:
            >>> RayWorkers().check(shared=[1], restarts=1)
            1
        """
        return check_restarts(restarts, respawn)

    def build(self, workers: int, worker_init_fn: Optional[Callable[[int], None]], shared: Any,
              prefetch_factor: int) -> "Executor":
        """The Ray executor: ``workers`` actors placed by Ray, ``shared`` sent to each once (``ray``
        is imported when they start; ``prefetch_factor`` means nothing to it: Ray keeps the results)."""
        from seqloader.prefetcher.ray import RayExecutor  # lazily: it stands on this module

        return RayExecutor(workers, worker_init_fn, shared, self)
