"""``tools/stress.py``: the suite run several times under CPU load, failures counted per test."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap

import psutil

from tools import stress


def test_counts_failures_per_test_over_runs_and_fails_if_any_run_failed(tmp_path, capsys):
    # A test that fails in the first run only (it leaves a marker), and one that always passes.
    marker = tmp_path / "ran-once"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_flaky.py").write_text(textwrap.dedent(f"""
        import os
        def test_fails_the_first_time():
            first = not os.path.exists({str(marker)!r})
            open({str(marker)!r}, "w").close()
            assert not first, "first run"
        def test_always_passes():
            pass
    """))
    code = stress.main(["--runs", "2", "--load", "1", "--workdir", str(tmp_path / "work"), "--",
                        str(suite), "-q", "-p", "no:randomly"])
    out = capsys.readouterr().out
    assert code == 1
    # the JUnit class name is the module's dotted path from pytest's rootdir, which depends on where it runs
    assert re.search(r"1/2  \S*test_flaky::test_fails_the_first_time", out), out
    assert "test_always_passes" not in out.split("failures per test")[1]
    assert "1 of 2 runs passed" in out
    assert (tmp_path / "work" / "run1.xml").exists() and (tmp_path / "work" / "run2.log").exists()


def test_all_runs_passing_exits_zero(tmp_path, capsys):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_ok.py").write_text("def test_ok():\n    pass\n")
    assert stress.main(["--runs", "1", "--load", "0", "--workdir", str(tmp_path / "w"), "--", str(suite)]) == 0
    assert "1 of 1 runs passed" in capsys.readouterr().out


def test_runs_start_with_sigint_ignored_as_a_ci_background_job_does(tmp_path, capsys):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_sigint.py").write_text(
        "import signal\ndef test_ignored():\n    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n")
    assert stress.main(["--runs", "1", "--load", "0", "--workdir", str(tmp_path / "w"), "--", str(suite)]) == 0


def test_a_killed_tool_leaves_no_hog_and_no_run_behind(tmp_path):
    """SIGTERM (``kill``) while a run waits: the tool exits and takes its hogs and the run with it."""
    suite = tmp_path / "suite"
    suite.mkdir()
    started = tmp_path / "started"
    (suite / "test_wait.py").write_text(
        "import pathlib, time\n"
        f"def test_waits():\n    pathlib.Path({str(started)!r}).write_text('x')\n    time.sleep(600)\n")
    root = pathlib.Path(stress.__file__).resolve().parents[1]
    tool = subprocess.Popen([sys.executable, "-m", "tools.stress", "--runs", "1", "--load", "1",
                             "--workdir", str(tmp_path / "w"), "--", str(suite)], cwd=root)
    try:
        me = psutil.Process(tool.pid)
        for _ in range(1200):   # (bounded: 120 s) until the run's test is running
            if started.exists():
                break
            psutil.wait_procs([me], timeout=0.1)
        assert started.exists(), "the run never started its test"
        children = me.children(recursive=True)
        assert len(children) >= 2   # a hog and the run
        os.kill(tool.pid, signal.SIGTERM)
        assert tool.wait(60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(children, timeout=60)
        assert not alive
    finally:
        tool.kill()
        tool.wait(60)
