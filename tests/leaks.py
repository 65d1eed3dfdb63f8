"""The leak check of multiprocessing tests, importable by any test module (``tests/conftest.py``'s
``no_leaks`` fixture is its body; the Ray and contract suites build their own fixtures on it): no
child process of the test process, and no ``/dev/shm`` segment with seqloader's prefix, outlives a
test, within a bounded wait. A module of its own, not ``conftest``: ``import conftest`` finds
whichever ``conftest.py`` was imported last."""

from __future__ import annotations

import gc
import os
import time

import psutil

from seqloader.prefetcher.processes.shm import SHM_PREFIX

__all__ = ["children", "leak_free", "shm_segments"]


def shm_segments() -> set[str]:
    """Our segments: named ``seqloader_<pid>_...`` by this process, a descendant of it, or a
    process that is gone (a crashed worker's reader). Other live processes' segments (another
    test run on the same machine) are not this test's business."""
    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)]
    except FileNotFoundError:  # pragma: no cover - no /dev/shm
        return set()
    ours = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    out = set()
    for n in names:
        pid = n[len(SHM_PREFIX):].split("_", 1)[0]
        if not pid.isdigit() or int(pid) in ours or not psutil.pid_exists(int(pid)):
            out.add(n)
    return out


def children() -> set[int]:
    me = psutil.Process()
    kids = set()
    for p in me.children(recursive=True):
        try:
            # multiprocessing's resource tracker and forkserver are shared helpers, not workers.
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        kids.add(p.pid)
    return kids


def _wait_until_clean(before_kids, before_shm, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        kids = {p for p in children() - before_kids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        shm = shm_segments() - before_shm
        if (not kids and not shm) or time.monotonic() > deadline:
            return kids, shm
        time.sleep(0.05)


def leak_free():
    """The body of ``no_leaks`` (a generator: a fixture elsewhere may ``yield from`` it)."""
    before_kids, before_shm = children(), shm_segments()
    yield
    # A loader left in a reference cycle shuts its workers down when the collector frees it. The
    # young generations are collected always (the test's own garbage, ~1 ms); a full collection
    # (~0.1-0.3 s once torch and the frameworks are imported: too much after each of the ~800
    # tests under this check) only when something is left, before waiting for it to go.
    gc.collect(1)
    kids, shm = _wait_until_clean(before_kids, before_shm, timeout=0)
    if kids or shm:
        gc.collect()
        kids, shm = _wait_until_clean(before_kids, before_shm)
    for pid in kids:  # do not let one leak poison the following tests
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    for name in shm:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
    assert not kids, f"worker processes outlived the test: {sorted(kids)}"
    assert not shm, f"shared-memory segments outlived the test: {sorted(shm)}"
