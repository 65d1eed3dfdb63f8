"""Shared fixtures: hypothesis profiles and the leak check every multiprocessing test runs under.

Every test gets a timeout from ``setup.cfg`` (pytest-timeout). Tests marked ``mp`` (and every test
in ``tests/prefetcher``, ``tests/loader`` and ``tests/integrations``) also run under ``no_leaks``:
it fails the test if a child process or a ``/dev/shm`` segment with seqloader's prefix outlives it.

The plain routes (``seqloader/loader/plain_routes.py``): ``--plain-routes=probe,snapshots,worker_info``
(or the environment variable ``SEQLOADER_PLAIN_ROUTES``, which the option sets for worker processes
too) runs the suite with those mechanisms on their plain route. Two kinds of test then cannot pass
as written, and are reported as skipped with the reason, never passed:

* on the plain ``worker_info`` route, a test whose loader (or doctest) opens thread workers meets
  the route's refusal (``PlainRouteRefused``, a ``ValueError`` naming the switch): a failure whose
  report carries the refusal's words (raised here, relayed from a subprocess, or raised in a thread:
  an unhandled thread exception fails the test on that route) is reported as skipped;
* on the plain ``probe`` route, the tests that expect the global-draw warning of thread workers
  (:data:`_PROBE_WARNING_TESTS`): skipped, since that route's documented cost is the warning.

``tests/loader/rngs/test_plain_routes.py`` checks the refusal, the silence and the batches on each route.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from leaks import leak_free

# the contract suite's fixtures module (tests/contract/contract_fixtures.py) is imported by modules of
# other folders too (tests/prefetcher/test_promises.py); appended, so a folder's own modules come first
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "contract"))

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

_MP_DIRS = ("prefetcher", "loader", "integrations")


@pytest.fixture
def sigint_raises():
    """Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` in this process during the test, however the
    test run was started.

    Python installs its ``KeyboardInterrupt`` handler only over the *default* disposition: a process
    started with SIGINT ignored keeps ignoring it, and that is how a background job of a
    non-interactive shell starts (``bash .ci/run &``, CI runners, ``python -m tools.stress``). A
    test that sends SIGINT to itself then sees nothing ("DID NOT RAISE KeyboardInterrupt"). And a
    ``KeyboardInterrupt`` raised while the garbage collector runs a finalizer is printed and
    ignored, so the collector is run first and paused during the test.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def no_leaks():
    """Fail the test if worker processes or shared-memory segments outlive it."""
    yield from leak_free()


#: tests that expect the thread workers' global-draw warning (``originalname``, and for a
#: parametrized contract test the parameter that draws): skipped on the plain ``probe`` route
_PROBE_WARNING_TESTS = {
    "test_a_global_draw_in_a_thread_worker_warns_once_naming_the_generator_and_the_fix": "",
    "test_seeded_batches_are_the_main_process_batches": "global_draws",
}


def pytest_addoption(parser):
    parser.addoption("--plain-routes", default=None, metavar="ROUTES",
                     help="run with these of seqloader's process-wide mechanisms on their plain route "
                          "(comma-separated: probe, snapshots, worker_info, all; default: $SEQLOADER_PLAIN_ROUTES)")


def _routes():
    """The plain routes in force (the module is imported after pytest_configure set the environment)."""
    from seqloader.loader.plain_routes import plain_routes
    return plain_routes()


def pytest_collection_modifyitems(config, items):
    probe_plain = _routes().probe
    for item in items:
        parts = item.path.parts
        if "tests" in parts and any(d in parts for d in _MP_DIRS) or item.get_closest_marker("mp"):
            item.fixturenames.insert(0, "no_leaks")
        param = _PROBE_WARNING_TESTS.get(getattr(item, "originalname", item.name))
        if probe_plain and param is not None and param in item.name:
            item.add_marker(pytest.mark.skip(reason="the plain probe route reports no global draws in thread "
                                                    "workers (its documented cost; tests/loader/rngs/test_plain_routes.py)"))


def pytest_configure(config):
    config.addinivalue_line("markers", "mp: runs worker processes; checked for leaked processes and shm")
    routes = config.getoption("--plain-routes")
    if routes is not None:
        if "seqloader.loader.plain_routes" in sys.modules:  # pragma: no cover - read already: too late
            raise pytest.UsageError("--plain-routes: seqloader.loader.plain_routes was imported before the option "
                                    "was read; set SEQLOADER_PLAIN_ROUTES in the environment instead")
        os.environ["SEQLOADER_PLAIN_ROUTES"] = routes  # worker processes read it too
    config.pluginmanager.register(_DoctestFolders(), "seqloader-doctest-folders")
    try:
        _routes()
    except ValueError as error:  # an unknown route name: before any test
        raise pytest.UsageError(str(error)) from None
    if _routes().worker_info:
        config.pluginmanager.register(_RefusalsSkip(), "seqloader-plain-routes-refusals")
        # a refusal in a thread fails its test (then skipped), never lets it pass unseen
        config.addinivalue_line("filterwarnings", "error::pytest.PytestUnhandledThreadExceptionWarning")


def pytest_report_header(config):
    return f"seqloader plain routes: {str(_routes()) or 'none (the default routes)'}"


#: the words of the plain worker_info route's refusal (``torch_compat.refuse_thread_workers_on_plain_route``;
#: its class is ``PlainRouteRefused``)
_REFUSAL = "refused on the plain worker_info route"


class _RefusalsSkip:
    """On the plain ``worker_info`` route, a failure whose report carries the route's refusal is
    reported as skipped, naming the refusal. A plugin of its own (registered by ``pytest_configure``),
    not a hook of this conftest: it covers the package's doctests too, outside ``tests/``."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if not report.failed:
            return
        text = report.longreprtext
        if _REFUSAL not in text and "PlainRouteRefused" not in text:  # (a relayed message may be shortened)
            return
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: thread workers are {_REFUSAL} (SEQLOADER_PLAIN_ROUTES={_routes()})")


class _DoctestFolders:
    """The folders a doctest makes with ``tempfile.mkdtemp()`` are removed when it ends.

    The examples call ``tempfile.mkdtemp()`` so that they read as a user would write them; without
    this, every run of the suite left a few thousand folders in the temporary directory. Only the
    folders made by the example's own lines (a frame whose file is the doctest) are recorded: one
    that a library makes and keeps for the process (``multiprocessing``'s ``pymp-`` folder) stays.
    A plugin of its own, like ``_RefusalsSkip``: it covers the package's doctests, outside ``tests/``.
    """

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        if not isinstance(item, pytest.DoctestItem):
            yield
            return
        made: list[str] = []
        mkdtemp = tempfile.mkdtemp

        def recorded(*args, **kwargs):
            folder = mkdtemp(*args, **kwargs)
            if sys._getframe(1).f_code.co_filename.startswith("<doctest"):
                made.append(folder)
            return folder

        tempfile.mkdtemp = recorded
        try:
            yield
        finally:
            tempfile.mkdtemp = mkdtemp
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
