"""A real Ray cluster on this machine for the Ray tests: a head and "data" nodes, each its own raylet,
all on loopback, and the leak check those tests run under.

Importing this module skips the importing test module when Ray is not installed (the ``test``
extra installs it). It keeps Ray on loopback: on Linux Ray turns ``127.0.0.1`` into the host's
routable address; the switch Ray uses for its one-machine mode on macOS and Windows
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) keeps every address at ``127.0.0.1``, in this process and
in the processes it starts (ranks of ``run_distributed`` included, which inherit the environment).

**Why the Ray tests replace the conftest's ``no_leaks``.** That check fails a test if a child
process of the test process outlives it. The cluster's processes (its GCS, raylets, and the worker
processes each raylet starts and keeps in a pool for reuse: their number changes with Ray's
pooling, not with what a test did) are children of this process, started by the module's cluster
fixture and owned by it, not by a test. So :func:`leak_check` checks what a test does own: every
Ray actor created during the test is dead (Ray's actor table) and no other child process (outside
the cluster's process trees) or shared-memory segment of seqloader outlived it, each within a
bounded wait. The cluster fixture then shuts the cluster down at the end of the module and
asserts that every process it ever had (removed nodes' included) is gone.
"""

from __future__ import annotations

import gc
import os
import pathlib
import time

import psutil
import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import conftest  # noqa: E402  # tests/conftest.py: its leak helpers

ray_constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before the variable was set

LOOPBACK = "127.0.0.1"
#: Ray's defaults take ~30 s to declare a SIGKILLed node dead (health checks every 3 s, 5 misses),
#: and an actor placed meanwhile on that node waits for it. Tests declare it within ~2 s.
HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                 "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}
#: The resource the data nodes have (and the head has not): actors that ask for it run there.
DATA = "data"
BOUND = 120.0
_TESTS = pathlib.Path(__file__).resolve().parent
#: The repository and the test folders whose modules the tests' items come from.
TEST_PATHS = [str(_TESTS.parent), str(_TESTS), str(_TESTS / "prefetcher"), str(_TESTS / "loader")]


class LocalCluster:
    """A head node (1 CPU, no ``data``) and ``data_nodes`` nodes of ``cpus`` CPUs and ``cpus``
    ``data`` each, connected (``ray.init``) in this process."""

    def __init__(self, data_nodes: int = 2, cpus: int = 2):
        self.cpus = cpus
        # The actors unpickle functions of the test modules: their processes (started by the
        # raylets, which inherit this environment) import from the same folders as this one.
        self._pythonpath = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([*TEST_PATHS, *filter(None, [self._pythonpath])])
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False,
            "_system_config": HEALTH_CHECKS})
        self.seen: set[int] = set()
        self.data_nodes = [self.add_node() for _ in range(data_nodes)]
        ray.init(address=self.cluster.address, log_to_driver=False)

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_node(self):
        node = self.cluster.add_node(num_cpus=self.cpus, resources={DATA: self.cpus}, node_ip_address=LOOPBACK)
        self.cluster.wait_for_nodes()
        self.processes()
        return node

    def remove_node(self, node_id: str) -> None:
        """SIGKILL the node ``node_id`` (its raylet and everything it runs): a host that is lost."""
        node = next(n for n in self.data_nodes if n.node_id == node_id)
        self.processes()
        self.data_nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def processes(self) -> set[int]:
        """The live processes of the cluster (and their descendants); remembered for :meth:`shutdown`."""
        pids = set()
        for node in self.cluster.list_all_nodes():
            for _, proc in node.live_processes():
                pids.add(proc.pid)
                try:
                    pids |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
                except psutil.Error:
                    pass
        self.seen |= pids
        return pids

    def alive_actors(self) -> set[str]:
        return {a for a, info in ray._private.state.actors().items() if info["State"] != "DEAD"}

    def shutdown(self) -> None:
        """Stop everything and check that no process of the cluster is left."""
        self.processes()
        ray.shutdown()
        self.cluster.shutdown()
        if self._pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self._pythonpath
        left = _wait(lambda: {p for p in self.seen if _running(p)})
        assert not left, f"Ray processes outlived the cluster: {sorted(left)}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait(what, bound: float = BOUND):
    deadline = time.monotonic() + bound
    while True:
        left = what()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def cluster_fixture():
    """The body of a module-scoped fixture: one cluster for the module, shut down after it."""
    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def leak_check(cluster: LocalCluster):
    """The body of the Ray modules' ``no_leaks`` (see the module docstring)."""
    actors, kids, shm = cluster.alive_actors(), _other_children(cluster), conftest._shm_segments()
    yield
    gc.collect()  # a loader in a reference cycle closes its workers when the collector frees it
    left = _wait(lambda: (cluster.alive_actors() - actors) | {str(p) for p in _other_children(cluster) - kids}
                 | (conftest._shm_segments() - shm))
    assert not left, f"Ray actors, processes or segments outlived the test: {sorted(left)}"


def _other_children(cluster: LocalCluster) -> set[int]:
    ours = cluster.processes()
    return {p for p in conftest._children() if p not in ours and _running(p)}
