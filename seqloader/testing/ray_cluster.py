"""L4: a real Ray cluster on this machine, for tests, benchmarks and trying ``worker_method="ray"``.

:class:`LocalRayCluster` starts a head node and ``data_nodes`` worker nodes with
``ray.cluster_utils.Cluster``: each node is its own raylet (its own processes and object store),
so removing one (:meth:`LocalRayCluster.remove_node`, a SIGKILL of the raylet and of what it runs)
is what losing a host is to the actors on it. Everything listens on loopback: on Linux Ray turns
``127.0.0.1`` into the host's routable address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (the
switch of its one-machine mode on macOS and Windows), which this class sets for this process and
the processes it starts, until :meth:`LocalRayCluster.shutdown` (which also restores
``PYTHONPATH``). Only the data nodes have the resource :data:`DATA`, so
``RayWorkers(resources={"data": 1})`` keeps actors off the head (where the driver runs).

**Forking after a cluster (Python 3.13+).** ``Cluster`` registers an ``atexit`` hook per node it
starts, and that hook is what keeps the node's Python object (and its GCS client, a gRPC channel)
alive once the node is removed or shut down. Python 3.13's ``multiprocessing`` clears the
inherited ``atexit`` hooks in a forked child before it runs anything (``atexit._clear()`` in
``popen_fork``), so the child freed the node's GCS client: its C++ destructor shuts down a gRPC
completion queue whose poller threads were never forked, and every forked worker (seqloader's and
torch's) died at start with SIGSEGV. Every node this class starts is therefore also referenced
from :data:`_NODES` for the life of the process (as the hooks keep them anyway): a child has
nothing to free.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

__all__ = ["DATA", "FAST_HEALTH_CHECKS", "LocalRayCluster"]

#: The resource the data nodes have (as many as their CPUs) and the head has not.
DATA = "data"
#: Ray's defaults take ~30 s to declare a SIGKILLed node dead (a health check every 3 s, 5 missed),
#: and an actor placed meanwhile on that node waits for it; with these, ~2 s.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                      "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}
_LOOPBACK = "127.0.0.1"
#: Every node any LocalRayCluster started, kept for the process's life (see the module docstring).
_NODES: list = []
_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class LocalRayCluster:
    """A head (1 CPU, no :data:`DATA`) and ``data_nodes`` nodes of ``cpus`` CPUs and ``cpus`` units of
    :data:`DATA` each, on loopback, connected (``ray.init``) in this process. A context manager;
    :meth:`shutdown` stops it and checks that none of its processes is left.

    Args:
        data_nodes: worker nodes to start, ``>= 0``.
        cpus: CPUs (and :data:`DATA`) of each worker node, ``>= 1`` (logical: Ray does not check
            them against the machine's cores).
        pythonpath: folders the actors' processes import from besides the installed packages
            (the raylets and their workers inherit ``PYTHONPATH``), e.g. a test folder whose
            functions the items use; functions defined in ``__main__`` travel by value and need none.
        health_checks: Ray's ``_system_config`` for node failure detection (default:
            :data:`FAST_HEALTH_CHECKS`; ``{}``: Ray's own defaults).

    Raises:
        ValueError: ``data_nodes < 0`` or ``cpus < 1``.
        ImportError: Ray is not installed.

    Example:
        >>> LocalRayCluster(data_nodes=-1)
        Traceback (most recent call last):
        ValueError: LocalRayCluster: data_nodes must be >= 0 and cpus >= 1 (got data_nodes=-1, cpus=2)
    """

    def __init__(self, data_nodes: int = 2, cpus: int = 2, pythonpath: Sequence[str] = (),
                 health_checks: Optional[dict] = None):
        if data_nodes < 0 or cpus < 1:
            raise ValueError(f"LocalRayCluster: data_nodes must be >= 0 and cpus >= 1 (got data_nodes={data_nodes}, "
                             f"cpus={cpus})")
        self._environ = {k: os.environ.get(k) for k in (_SWITCH, "PYTHONPATH")}  # restored by shutdown()
        os.environ[_SWITCH] = "0"
        import psutil
        import ray
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster

        ray_constants.ENABLE_RAY_CLUSTER = False  # ray may have been imported before the variable was set
        self._ray, self._psutil, self.cpus = ray, psutil, cpus
        if pythonpath:
            os.environ["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [self._environ["PYTHONPATH"]])])
        self.seen: set[int] = set()
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "node_ip_address": _LOOPBACK, "include_dashboard": False,
            "_system_config": FAST_HEALTH_CHECKS if health_checks is None else health_checks})
        _NODES.append(self.cluster.head_node)
        self.data_nodes: list[Any] = []
        try:
            for _ in range(data_nodes):
                self.add_node()
            ray.init(address=self.cluster.address, log_to_driver=False)
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        """The head's address, for ``ray.init(address=...)`` or ``RayWorkers(address=...)``."""
        return str(self.cluster.address)

    def add_node(self) -> Any:
        """Start one more data node (a host that joins) and wait until Ray lists it; returns it."""
        node = self.cluster.add_node(num_cpus=self.cpus, resources={DATA: self.cpus}, node_ip_address=_LOOPBACK)
        _NODES.append(node)
        self.cluster.wait_for_nodes()
        self.data_nodes.append(node)
        self.processes()
        return node

    def remove_node(self, node_id: str) -> None:
        """SIGKILL the data node ``node_id`` (its raylet and everything it runs): a host that is lost."""
        node = next(n for n in self.data_nodes if n.node_id == node_id)
        self.processes()
        self.data_nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def processes(self) -> set[int]:
        """The pids of the cluster's live processes and their descendants (remembered, so that
        :meth:`shutdown` checks that every one it ever saw is gone)."""
        pids = set()
        for node in self.cluster.list_all_nodes():
            for _, proc in node.live_processes():
                pids.add(proc.pid)
                try:
                    pids |= {p.pid for p in self._psutil.Process(proc.pid).children(recursive=True)}
                except self._psutil.Error:
                    pass
        self.seen |= pids
        return pids

    def alive_actors(self) -> set[str]:
        """The ids of the cluster's actors that are not dead."""
        return {a for a, info in self._ray._private.state.actors().items() if info["State"] != "DEAD"}

    def shutdown(self, bound: float = 60.0) -> None:
        """Disconnect, stop every node, and check that no process of the cluster is left.

        Raises:
            RuntimeError: a process of the cluster outlived it by ``bound`` seconds.
        """
        self.processes()
        self._ray.shutdown()
        self.cluster.shutdown()
        for key, value in self._environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        deadline = time.monotonic() + bound
        while True:
            left = {p for p in self.seen if self._running(p)}
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"LocalRayCluster: Ray processes outlived the cluster: {sorted(left)}")
            time.sleep(0.05)

    def _running(self, pid: int) -> bool:
        try:
            return bool(self._psutil.Process(pid).status() != self._psutil.STATUS_ZOMBIE)
        except self._psutil.Error:
            return False

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
