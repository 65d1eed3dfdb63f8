"""The plain routes of the three process-wide mechanisms (``seqloader/loader/plain_routes.py``,
issue 35): with each switched, its process-wide effect never happens (no raw memory written or
read, no profile hook in a thread worker, no code object of torch's replaced) and the batches are
the default route's, compared with ``torch.equal``. The whole suite also runs on the plain routes
(``SEQLOADER_PLAIN_ROUTES=probe,snapshots,worker_info python -m tools.test_installed --no-build
--subset plain_routes``)."""

from __future__ import annotations

import ctypes
import os
import pickle
import random
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
import torch

import seqloader
from seqloader.loader.rngs import snapshots as global_rngs
from seqloader.loader.plain_routes import ENV, PlainRouteRefused, PlainRoutes, plain_routes, using_plain_routes
from seqloader.loader.rngs.probe import GlobalDrawProbe
from seqloader.loader.torch_compat import thread_worker_info, thread_worker_info_holders

_worker = torch.utils.data._utils.worker
GET_WORKER_INFO_CODE = _worker.get_worker_info.__code__
INITIAL_SEED_CODE = torch.random.initial_seed.__code__


class GlobalDraws(torch.utils.data.Dataset):
    """Items drawn from the three global generators (seeded per batch by seqloader)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(())), float(i)])


class ThreadSafeDraws(torch.utils.data.Dataset):
    """Items drawn from the worker's own generators: the same under every executor."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.rand(2, generator=torch.thread_safe_generator()) + i


class CodeUnchanged(GlobalDraws):
    """Fails an item if torch's code objects are not their own while it is computed."""

    def __getitem__(self, i):
        if (_worker.get_worker_info.__code__ is not GET_WORKER_INFO_CODE
                or torch.random.initial_seed.__code__ is not INITIAL_SEED_CODE):
            raise AssertionError(f"item {i}: torch's code objects are replaced")
        return super().__getitem__(i)


def batches(dataset, **kw):
    return list(seqloader.DataLoader(dataset, batch_size=4, shuffle=True, seed=7, **kw))


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def public_states():
    state = np.random.get_state()
    return (state[0], state[1].tolist(), *state[2:]), random.getstate(), torch.get_rng_state()


# -- the switch ---------------------------------------------------------------------------------------


def test_the_switch_is_read_from_the_environment_once_at_import():
    code = "from seqloader.loader.plain_routes import plain_routes; print(plain_routes())"
    env = dict(os.environ, **{ENV: " snapshots,probe "})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "probe,snapshots"
    env[ENV] = "snapshot"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "unknown route(s) ['snapshot']" in out.stderr


def test_the_context_manager_switches_and_puts_back():
    before = plain_routes()
    with using_plain_routes("all") as routes:
        assert routes == plain_routes() == PlainRoutes(probe=True, snapshots=True, worker_info=True)
    assert plain_routes() is before
    with pytest.raises(TypeError, match="routes must be a PlainRoutes or a str"):
        with using_plain_routes(3):  # type: ignore[arg-type]
            pass


# -- snapshots: the public get_state/set_state, no raw memory ------------------------------------------


def test_plain_snapshots_touch_no_raw_memory_and_give_the_same_batches_and_states(monkeypatch):
    with using_plain_routes(""):
        want_batches = batches(GlobalDraws())
    calls = []
    view = global_rngs._view   # every raw copy goes through a view made by _view (cached in _views)
    monkeypatch.setattr(global_rngs, "_views", None)
    monkeypatch.setattr(global_rngs, "_view", lambda *a: calls.append("view") or view(*a))
    if global_rngs.layout() is not None:  # the check can fail: the default route writes raw memory
        with using_plain_routes(""):
            batches(GlobalDraws())
        assert "view" in calls

    def untouchable(*args):
        raise AssertionError("raw memory touched on the plain snapshots route")

    monkeypatch.setattr(global_rngs, "_views", None)
    monkeypatch.setattr(global_rngs, "_view", untouchable)
    monkeypatch.setattr(ctypes, "memmove", untouchable)
    monkeypatch.setattr(ctypes, "string_at", untouchable)
    random.seed(3); np.random.seed(3); torch.manual_seed(3)
    np.random.randn(3); random.gauss(0, 1)  # cached Gaussians, which get_state/getstate keep too
    before = public_states()
    with using_plain_routes("snapshots"):
        got = batches(GlobalDraws())
        state = np.random.get_state()
        assert global_rngs.numpy_state() == (state[0], state[1].tobytes(), *state[2:])
    assert_same(got, want_batches)
    after = public_states()
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def test_a_snapshot_restores_by_the_route_it_was_taken_by(monkeypatch):
    random.seed(1)
    with using_plain_routes("snapshots"):
        snap = global_rngs.Snapshot()
    want = random.random()
    snap.restore()  # on the default route again: still the public set_state
    assert random.random() == want


# -- probe: no profile hook in thread workers ----------------------------------------------------------


def _profiled_threads(monkeypatch):
    """The threads other than this one that set a profile hook."""
    threads, real = [], sys.setprofile

    def recording(hook):
        if threading.current_thread() is not threading.main_thread():
            threads.append(threading.current_thread().name)
        real(hook)

    monkeypatch.setattr(sys, "setprofile", recording)
    return threads


def test_the_plain_probe_sets_no_profile_hook_and_gives_the_same_batches(monkeypatch):
    threads = _profiled_threads(monkeypatch)
    with using_plain_routes(""):
        with pytest.warns(RuntimeWarning, match="drew from the global"):
            batches(GlobalDraws(), num_workers=2, worker_method="thread")
        want = batches(ThreadSafeDraws(), num_workers=2, worker_method="thread")
    assert threads, "the check can fail: the default route's probe hooks the thread workers"
    threads.clear()
    with using_plain_routes("probe"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # the route's cost: a global draw goes unreported
            batches(GlobalDraws(), num_workers=2, worker_method="thread")
            got = batches(ThreadSafeDraws(), num_workers=2, worker_method="thread")
    assert threads == []
    assert_same(got, want)
    assert_same(got, batches(ThreadSafeDraws()))  # and the main process's


def test_the_probe_decides_when_it_is_made_and_a_copy_keeps_it():
    with using_plain_routes("probe"):
        probe = GlobalDrawProbe()
    assert probe.enabled is False and pickle.loads(pickle.dumps(probe)).enabled is False
    assert GlobalDrawProbe().enabled is not plain_routes().probe


# -- worker_info: nothing of torch's replaced; thread workers refused -------------------------------------


@pytest.mark.parametrize("executor", [dict(num_workers=2, worker_method="thread"),
                                      dict(num_workers=2, threads_per_worker=2)],
                         ids=["threads", "threads_per_worker"])
def test_the_plain_worker_info_route_refuses_thread_workers_naming_the_switch(executor):
    with using_plain_routes("worker_info"):
        loader = seqloader.DataLoader(ThreadSafeDraws(), batch_size=4, seed=7, **executor)
        with pytest.raises(ValueError, match=r"refused on the plain worker_info route \(SEQLOADER_PLAIN_ROUTES="
                                             r"worker_info\).*one thread's info to every thread") as caught:
            iter(loader)
        assert isinstance(caught.value, PlainRouteRefused)
        with pytest.raises(PlainRouteRefused):
            with thread_worker_info():
                pass
    assert thread_worker_info_holders() == 0
    assert _worker.get_worker_info.__code__ is GET_WORKER_INFO_CODE
    assert torch.random.initial_seed.__code__ is INITIAL_SEED_CODE


@pytest.mark.parametrize("executor", [dict(num_workers=0), dict(num_workers=2)], ids=["num_workers=0", "processes"])
def test_on_every_plain_route_torchs_code_stays_and_batches_are_the_default_routes(executor):
    with using_plain_routes(""):
        want = batches(GlobalDraws(), **executor)
    with using_plain_routes("all"):
        got = batches(CodeUnchanged(), **executor)
    assert_same(got, want)
    assert _worker.get_worker_info.__code__ is GET_WORKER_INFO_CODE
    assert torch.random.initial_seed.__code__ is INITIAL_SEED_CODE
