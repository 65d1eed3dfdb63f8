"""``python -m tools.stress``: run the test suite several times on a loaded machine; count failures per test.

A test that fails only when the machine is busy is a bug (CI runs on a shared 2-core machine). This
tool makes such tests fail here first: it starts ``--load`` CPU-bound processes (default: one per
core), runs the README's test command ``--runs`` times (default 3; ``--jobs`` of them at once, which
loads the machine further), and prints, for every test that failed at least once, in how many runs
it failed. The exit status is 0 only if every run passed.

The runs start the way a CI script's background job starts: with SIGINT ignored (a
non-interactive shell's ``cmd &``). Python then keeps ignoring Ctrl-C, so a test that relies on
Python's default ``KeyboardInterrupt`` handler without installing it fails here as it fails in
CI (that is what made two Ctrl-C tests of the prefetcher fail under load, and never alone).

Each run is ``python -m pytest -p no:cacheprovider --junitxml=<file> [pytest args]`` in the
repository's root (the README's command after its ``pip install``, which the caller has already
run); the per-test outcomes come from the JUnit XML files. Arguments after ``--`` go to pytest, so
``python -m tools.stress --runs 5 -- tests/prefetcher`` stresses one directory.

Example (in a checkout, with the test extra installed)::

    python -m tools.stress                      # 3 runs of the whole suite, 2 hogs on 2 cores
    python -m tools.stress --runs 10 --jobs 2 -- tests/prefetcher/test_faults.py
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable, Optional, Sequence

__all__ = ["RunResult", "main", "parse_junit", "summarize"]

ROOT = Path(__file__).resolve().parents[1]
#: The README's test command, after its ``pip install`` (``--junitxml`` is added per run).
TEST_COMMAND = (sys.executable, "-m", "pytest")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run of the suite: its exit code, the tests that failed or errored, and how many ran."""

    index: int
    returncode: Optional[int]  # None: killed after --timeout
    failed: frozenset
    tests: int
    seconds: float

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.failed


def parse_junit(path: Path) -> tuple[int, frozenset]:
    """``(tests run, node ids that failed or errored)`` from a pytest JUnit XML file.

    A test id is ``classname::name`` as pytest writes it (``tests.prefetch.test_faults::test_x``);
    a setup or teardown error counts as a failure of that test.

    Example:
        >>> import tempfile, pathlib
        >>> xml = ('<testsuites><testsuite tests="2"><testcase classname="tests.test_a" name="test_ok"/>'
        ...        '<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>'
        ...        '</testsuite></testsuites>')
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.xml"; _ = p.write_text(xml)
        >>> parse_junit(p)
        (2, frozenset({'tests.test_a::test_bad'}))
        >>> parse_junit(p.with_name("missing.xml"))
        (0, frozenset())
    """
    if not path.exists():
        return 0, frozenset()
    root = ET.parse(path).getroot()
    tests, failed = 0, set()
    for case in root.iter("testcase"):
        tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(f"{case.get('classname')}::{case.get('name')}")
    return tests, frozenset(failed)


def summarize(results: Sequence[RunResult]) -> str:
    """A table of the tests that failed in any run, with their failure counts, and a verdict.

    Example:
        >>> r = [RunResult(0, 0, frozenset(), 10, 1.0), RunResult(1, 1, frozenset({"t::a"}), 10, 1.0)]
        >>> print(summarize(r))
        run 1: passed, 10 tests in 1 s
        run 2: FAILED (exit code 1), 10 tests in 1 s
        failures per test (of 2 runs):
          1/2  t::a
        1 of 2 runs passed
    """
    lines = []
    for r in results:
        how = "passed" if r.passed else (
            "killed after the timeout" if r.returncode is None else f"FAILED (exit code {r.returncode})")
        lines.append(f"run {r.index + 1}: {how}, {r.tests} tests in {r.seconds:.0f} s")
    counts = collections.Counter(t for r in results for t in r.failed)
    if counts:
        lines.append(f"failures per test (of {len(results)} runs):")
        lines += [f"  {n}/{len(results)}  {t}" for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines.append(f"{sum(r.passed for r in results)} of {len(results)} runs passed")
    return "\n".join(lines)


def _start_load(k: int) -> list[subprocess.Popen]:
    """``k`` processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(k)]


def _stop(procs: Iterable[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:  # pragma: no cover - exited in between
                pass
        p.wait()


def _run_suite(index: int, workdir: Path, pytest_args: Sequence[str], timeout: float,
               log: bool) -> tuple[subprocess.Popen, Path, float]:
    xml = workdir / f"run{index + 1}.xml"
    out = open(workdir / f"run{index + 1}.log", "w") if log else subprocess.DEVNULL
    cmd = [*TEST_COMMAND, "-p", "no:cacheprovider", f"--junitxml={xml}", *pytest_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_as_a_background_job)
    return proc, xml, time.monotonic()


def _as_a_background_job() -> None:
    """In the child before ``exec``: SIGINT ignored, as for a non-interactive shell's ``cmd &``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait(proc: subprocess.Popen, deadline: float) -> Optional[int]:
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _stop([proc])
        return None


def stress(runs: int, load: int, jobs: int, pytest_args: Sequence[str], timeout: float,
           workdir: Path) -> list[RunResult]:
    """Run the suite ``runs`` times (``jobs`` at once) under ``load`` CPU hogs; return the results."""
    hogs = _start_load(load)
    results: list[RunResult] = []
    started: list = []
    # `kill <the tool>` (SIGTERM) stops the runs and the hogs too: it exits through the finally below
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        pending = list(range(runs))
        while pending:
            batch, pending = pending[:jobs], pending[jobs:]
            started = [(i, *_run_suite(i, workdir, pytest_args, timeout, log=True)) for i in batch]
            for i, proc, xml, t0 in started:
                code = _wait(proc, t0 + timeout)
                tests, failed = parse_junit(xml)
                results.append(RunResult(i, code, failed, tests, time.monotonic() - t0))
                print(f"run {i + 1}/{runs}: exit {code}, {tests} tests, {len(failed)} failed "
                      f"(log: {workdir / f'run{i + 1}.log'})", flush=True)
    finally:  # also on Ctrl-C and SIGTERM: no run and no hog outlives the tool
        _stop([proc for _, proc, _, _ in started])
        _stop(hogs)
        signal.signal(signal.SIGTERM, previous)
    return results


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the arguments, stress the suite, print the summary; 0 if every run passed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, pytest_args = argv[:k], argv[k + 1:]
    parser = argparse.ArgumentParser(prog="python -m tools.stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the suite (default 3)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1,
                        help="CPU-bound processes kept running meanwhile (default: the number of cores)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at the same time (default 1)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the JUnit XML and logs go (default: a new temporary directory)")
    args = parser.parse_args(argv)
    for name in ("runs", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1 (got {getattr(args, name)})")
    if args.load < 0:
        parser.error(f"--load must be >= 0 (got {args.load})")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="seqloader-stress-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"stress: {args.runs} run(s) of `{' '.join(['python -m pytest', *pytest_args])}`, {args.jobs} at a "
          f"time, under {args.load} CPU-bound process(es); logs in {workdir}", flush=True)
    results = stress(args.runs, args.load, args.jobs, pytest_args, args.timeout, workdir)
    print(summarize(results))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
