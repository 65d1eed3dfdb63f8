"""The contract suite's fixtures: one executor per case (``executor``, ``process_executor``), the
module's Ray cluster, and the check that nothing a case started outlives it.

Each test module imports them (``from contract_fixtures import ...``) rather than finding them in a
``conftest.py``: a second ``conftest.py`` in a folder without ``__init__.py`` clashes with the
others (``tests/sources/``, ``tests/packing/``) when pytest is given several folders at once.
``tests/prefetcher/test_promises.py`` imports ``no_leaks`` and ``ray_cluster`` too (``tests/conftest.py``
puts this folder on ``sys.path``).
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import leaks
import seqloader
from contract_executors import EXECUTORS, PROCESS_BASED
from forking import wait_until

_cluster: dict = {}  # the module's Ray cluster, once a Ray case started it
_ORIGINAL_CODE = {"initial_seed": torch.random.initial_seed.__code__,
                  "get_worker_info": torch.utils.data.get_worker_info.__code__}


@pytest.fixture(scope="module")
def ray_cluster():
    from ray_cluster import cluster_fixture  # imports Ray only when a Ray case runs

    gen = cluster_fixture()
    _cluster["cluster"] = next(gen)
    try:
        yield _cluster["cluster"]
    finally:
        _cluster.clear()
        next(gen, None)


def running_cluster():
    """The module's Ray cluster if a Ray case started it, else ``None``."""
    return _cluster.get("cluster")


@pytest.fixture
def no_leaks(request):
    """No worker process, shared-memory segment, Ray actor or thread worker outlives a test; once
    the module's cluster runs, its own processes are not the test's (``tests/ray_cluster.py``). A
    Ray case's cluster starts first, however the fixtures are ordered (``tests/conftest.py`` puts
    ``no_leaks`` first in the folders it checks)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "ray" in (callspec.params.get("executor"), callspec.params.get("process_executor")):
        request.getfixturevalue("ray_cluster")  # first: its processes are not the test's leaks
    if "cluster" in _cluster:
        from ray_cluster import leak_check

        yield from leak_check(_cluster["cluster"])
    else:
        yield from leaks.leak_free()
    gc.collect()  # an error's traceback may hold the iterator, hence its thread workers, in a cycle
    assert wait_until(lambda: not _thread_workers(), 60), f"thread workers outlived the test: {_thread_workers()}"
    # ... and so did what they changed process-wide (torch's code objects, patched while they live)
    assert torch.random.initial_seed.__code__ is _ORIGINAL_CODE["initial_seed"]
    assert torch.utils.data.get_worker_info.__code__ is _ORIGINAL_CODE["get_worker_info"]


def thread_workers() -> set:
    """The live thread workers (threads named ``seqloader-worker-*``) and decode threads (``seqloader-ahead-*``)."""
    return {t for t in threading.enumerate() if t.name.startswith(("seqloader-worker-", "seqloader-ahead-"))
            and t.is_alive()}


def _thread_workers() -> list:
    return sorted(t.name for t in thread_workers())


@pytest.fixture(params=list(EXECUTORS))
def executor(request):
    """The DataLoader keywords of one executor (``request.param``), checked for leaks."""
    return _keywords(request)


def _keywords(request) -> dict:
    kw = dict(EXECUTORS[request.param])
    if request.param == "ray":  # the cluster first: its processes are not the test's leaks
        cluster = request.getfixturevalue("ray_cluster")
        kw["worker_method"] = seqloader.RayWorkers(address=cluster.address)
    request.getfixturevalue("no_leaks")
    return kw


@pytest.fixture(params=PROCESS_BASED)
def process_executor(request):
    """The executors whose workers are processes (threads share the training process)."""
    return _keywords(request)
