"""Where and how the Ray executor runs: :class:`RayWorkers` (the public options), connecting to a
cluster (:func:`connect`) and checking that an actor can be placed at all (:func:`check_feasible`).

``ray`` is imported only by :func:`connect`: the options object is plain data, so ``import
seqloader`` and ``DataLoader(worker_method=RayWorkers(...))`` import nothing of Ray until workers start.
The executor itself is :class:`~seqloader.prefetcher.ray.RayExecutor`.
"""

from __future__ import annotations

import math
import socket
import threading
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["RayWorkers", "check_feasible", "connect"]


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


def connect(options: RayWorkers) -> Any:
    """The ``ray`` module, connected (see the NOTE above, 1).

    Raises:
        ImportError: Ray is not installed (names the extra).
        RuntimeError: there is no cluster to connect to (says how to start one).
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError("prefetch: method='ray' needs Ray; install it with `pip install seqloader[ray]` "
                          f"({exc})") from exc
    if ray.is_initialized():
        return ray
    address = "auto" if options.address is None else options.address
    hint = ("start one with `ray start --head` (and `ray start --address=<head>:6379` on each CPU host), then run "
            "this again on a node of it, or call ray.init(...) first, or pass RayWorkers(address='<head>:6379')")
    _check_reachable(address, options.connect_timeout, hint)
    outcome: dict[str, Any] = {}

    def init() -> None:
        try:
            ray.init(address=address)
            outcome["ok"] = True
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=init, name="seqloader-ray-connect", daemon=True)
    thread.start()
    thread.join(options.connect_timeout)
    if thread.is_alive():
        raise RuntimeError(f"prefetch: no answer from the Ray cluster at address={address!r} within "
                           f"RayWorkers(connect_timeout={options.connect_timeout}) seconds; {hint}")
    err = outcome.get("error")
    if isinstance(err, ConnectionError):
        raise RuntimeError(f"prefetch: no Ray cluster to connect to at address={address!r} ({err}); {hint}") from err
    if err is not None:
        raise err
    return ray


def _check_reachable(address: str, timeout: float, hint: str) -> None:
    """Refuse at once an explicit ``host:port`` (or ``ray://host:port``) that no server answers at:
    ``ray.init`` would retry it for many minutes.

    Example:
        >>> _check_reachable("127.0.0.1:1", 5.0, "start one")
        Traceback (most recent call last):
        RuntimeError: prefetch: no Ray cluster answers at address='127.0.0.1:1' (connection refused); start one
    """
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto", "local" or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except ConnectionRefusedError:
        why = "connection refused"
    except OSError as exc:
        why = str(exc) or type(exc).__name__
    else:
        return
    raise RuntimeError(f"prefetch: no Ray cluster answers at address={address!r} ({why}); {hint}")


def check_feasible(ray: Any, options: RayWorkers) -> None:
    """Raise when no live node could ever hold one actor (it would wait for a node forever).

    Args:
        ray: the connected ``ray`` module (only its ``nodes()`` is used).
        options: what each actor reserves.

    Raises:
        ValueError: no live node has ``options.needs()``.

    Example:
        >>> from types import SimpleNamespace
        >>> cluster = SimpleNamespace(nodes=lambda: [{"Alive": True, "Resources": {"CPU": 8.0}}])
        >>> check_feasible(cluster, RayWorkers(num_cpus=4))
        >>> check_feasible(cluster, RayWorkers(resources={"data_host": 1}))
        Traceback (most recent call last):
        ValueError: prefetch: no node of the Ray cluster can hold one worker actor (each needs {'CPU': 1, 'data_host': 1}; the 1 live node(s) have [{'CPU': 8.0, 'data_host': 0}]); lower RayWorkers(num_cpus=...) or resources, or add nodes that have them
    """
    need = options.needs()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not any(all(n.get("Resources", {}).get(k, 0) >= v for k, v in need.items()) for n in nodes):
        have = [{k: n.get("Resources", {}).get(k, 0) for k in need} for n in nodes]
        raise ValueError(f"prefetch: no node of the Ray cluster can hold one worker actor (each needs {need}; the "
                         f"{len(nodes)} live node(s) have {have}); lower RayWorkers(num_cpus=...) or resources, "
                         "or add nodes that have them")
