"""``python -m seqloader.demo`` crashes a trainer mid-epoch, resumes it, and prints PASS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqloader.demo import Progress, parse_args

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.mp  # the demo starts (and crashes) worker processes: check nothing outlives it


def _demo(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "seqloader.demo", *args], capture_output=True, text=True,
                          timeout=110, env=env, cwd=ROOT)


def test_demo_resumes_exactly_after_a_crash():
    proc = _demo("--size", "320", "--batch-size", "16", "--workers", "2", "--seed", "3",
                 "--steps-before-crash", "7")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASS" in proc.stdout and "FAIL" not in proc.stdout, out
    assert "bit-identical batches: 20/20" in proc.stdout, out
    assert "\r" not in out, out  # a redirected log: no progress-bar frames (tqdm is installed here)


def test_demo_rejects_a_crash_point_past_the_epoch(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--size", "64", "--batch-size", "16", "--steps-before-crash", "4"])
    assert exit_info.value.code == 2
    assert "--steps-before-crash must be in [1, 3] for 4 batches per epoch (got 4)" in capsys.readouterr().err


def test_demo_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--size", "--batch-size", "--workers", "--seed", "--steps-before-crash"):
        assert option in out


def test_progress_writes_plain_lines_when_not_on_a_terminal(capsys):
    pytest.importorskip("tqdm")  # with tqdm installed, its bar would write frames into the log
    bar = Progress(20, "epoch")
    for _ in range(20):
        bar.update("loss 0.1")
    bar.close()
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err
    lines = captured.out.splitlines()
    assert len(lines) <= 11 and lines[-1].endswith("20/20 batches loss 0.1"), lines
