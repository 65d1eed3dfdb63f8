"""``tools/stress.py``: the suite run several times under CPU load, failures counted per test."""

from __future__ import annotations

import re
import textwrap

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
