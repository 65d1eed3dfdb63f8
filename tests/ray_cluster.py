"""The Ray tests' cluster fixture and leak check, over :class:`seqloader.testing.LocalRayCluster`
(a head and two "data" nodes, each its own raylet, all on loopback).

Importing this module skips the importing test module when Ray is not installed (the ``test``
extra installs it).

**Why the Ray tests replace the conftest's ``no_leaks``.** That check fails a test if a child
process of the test process outlives it. The cluster's processes (its GCS, raylets, and the worker
processes each raylet starts and keeps in a pool for reuse: their number changes with Ray's
pooling, not with what a test did) are children of this process, started by the module's cluster
fixture and owned by it, not by a test. So :func:`leak_check` checks what a test does own: every
Ray actor created during the test is dead (Ray's actor table) and no other child process (outside
the cluster's process trees) or shared-memory segment of seqloader outlived it, each within a
bounded wait. The cluster fixture shuts the cluster down at the end of the module, and
``LocalRayCluster.shutdown`` checks that every process it ever had (removed nodes' included) is gone.
"""

from __future__ import annotations

import gc
import pathlib
import time

import pytest

ray = pytest.importorskip("ray")

import leaks  # noqa: E402  # the leak helpers
from seqloader.testing import LocalRayCluster  # noqa: E402
from seqloader.testing.ray_cluster import DATA  # noqa: E402

__all__ = ["DATA", "cluster_fixture", "leak_check"]

BOUND = 120.0
_TESTS = pathlib.Path(__file__).resolve().parent
#: The repository and the test folders whose modules the tests' items come from.
TEST_PATHS = [str(_TESTS.parent), str(_TESTS), str(_TESTS / "prefetcher"), str(_TESTS / "loader"),
              str(_TESTS / "contract")]


def cluster_fixture():
    """The body of a module-scoped fixture: one cluster for the module, shut down after it."""
    cluster = LocalRayCluster(data_nodes=2, cpus=2, pythonpath=TEST_PATHS)
    try:
        yield cluster
    finally:
        cluster.shutdown(BOUND)


def leak_check(cluster: LocalRayCluster):
    """The body of the Ray modules' ``no_leaks`` (see the module docstring)."""
    actors, kids, shm = cluster.alive_actors(), _other_children(cluster), leaks.shm_segments()
    yield
    gc.collect()  # a loader in a reference cycle closes its workers when the collector frees it
    deadline = time.monotonic() + BOUND
    while True:
        left = ((cluster.alive_actors() - actors) | {str(p) for p in _other_children(cluster) - kids}
                | (leaks.shm_segments() - shm))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"Ray actors, processes or segments outlived the test: {sorted(left)}"


def _other_children(cluster: LocalRayCluster) -> set[int]:
    ours = cluster.processes()
    return {p for p in leaks.children() if p not in ours and cluster._running(p)}
