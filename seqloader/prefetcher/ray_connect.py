"""Connecting to a Ray cluster for :class:`~seqloader.prefetcher.ray.RayExecutor` (:func:`connect`)
and checking that an actor can be placed at all (:func:`check_feasible`).

Each takes the executor's options (a :class:`~seqloader.prefetcher.ray_options.RayWorkers`: its
``address``, ``connect_timeout`` and ``needs()``); ``ray`` is imported only by :func:`connect`.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

__all__ = ["check_feasible", "connect"]


def connect(options: Any) -> Any:
    """The ``ray`` module, connected (see the NOTE of :mod:`seqloader.prefetcher.ray`, 1).

    Args:
        options: a ``RayWorkers`` (its ``address`` and ``connect_timeout``).

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
    error = outcome.get("error")
    if isinstance(error, ConnectionError):
        raise RuntimeError(f"prefetch: no Ray cluster to connect to at address={address!r} ({error}); {hint}") from error
    if error is not None:
        raise error
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


def check_feasible(ray: Any, options: Any) -> None:
    """Raise when no live node could ever hold one actor (it would wait for a node forever).

    Args:
        ray: the connected ``ray`` module (only its ``nodes()`` is used).
        options: a ``RayWorkers``: what each actor reserves (``options.needs()``).

    Raises:
        ValueError: no live node has ``options.needs()``.

    Example:
        >>> from types import SimpleNamespace
        >>> cluster = SimpleNamespace(nodes=lambda: [{"Alive": True, "Resources": {"CPU": 8.0}}])
        >>> from seqloader.prefetcher.ray_options import RayWorkers
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
