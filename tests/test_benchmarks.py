"""Smoke test of ``python -m benchmarks``: it runs and prints rows (timings are never checked)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import benchmarks
from benchmarks import common, prefetch
from benchmarks.__main__ import main

BENCHMARKS = pathlib.Path(benchmarks.__file__).resolve().parent

pytestmark = pytest.mark.mp  # the workloads start worker processes: check that nothing outlives them


def test_quick_run_prints_a_row_per_loader(capsys):
    assert main(["--workloads", "tiny,cpu,state_size", "--quick", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| workload | loader |")
    rows = [line.split("|") for line in out[2:] if line.startswith("| ")]
    assert [r[1].strip() for r in rows] == ["tiny", "tiny", "cpu", "cpu", "cpu", "cpu", "state_size"]
    assert [r[2].strip() for r in rows[:6]] == ["seqloader", "torch"] * 3
    assert [r[3].strip() for r in rows[:6]] == ["2", "2", "0", "0", "2", "2"]


def test_unknown_workloads_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--workloads", "tiny,nope"])
    assert "unknown workload(s) nope" in capsys.readouterr().err


def test_workloads_are_a_registry_of_row_functions():
    assert list(benchmarks.WORKLOADS) == ["tiny", "images", "cpu", "first_batch",
                                          "resume", "state_size", "loader_tiny", "loader_images"]
    rows = benchmarks.WORKLOADS["images"](common.Options(quick=True))
    assert [r.loader for r in rows] == ["seqloader", "torch"]
    assert all(r.value > 0 and r.mb_per_s > 0 for r in rows) and rows[0].ratio > 0
    assert prefetch.first_batch("seqloader", common.ImageDataset(8), 4, 1) > 0
    assert prefetch.first_batch("torch", common.ImageDataset(8), 4, 1) > 0
    text = common.format_rows(rows, markdown=False)
    assert text.splitlines()[0].split()[:2] == ["workload", "loader"]


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", ["prefetch.py", "loader.py"])
def test_a_workload_module_imports_only_common_seqloader_and_third_parties(name):
    ours = {m for m in _imports(BENCHMARKS / name) if m.split(".")[0] == "benchmarks"}
    assert ours == {"benchmarks.common"}
    assert not {m for m in _imports(BENCHMARKS / "common.py") if m.split(".")[0] in ("benchmarks", "seqloader")}
