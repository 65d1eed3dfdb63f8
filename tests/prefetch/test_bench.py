"""Smoke test of ``python -m seqloader.bench``: it runs and prints rows (timings are never checked)."""

from __future__ import annotations

from seqloader import bench


def test_bench_quick_prints_a_row_per_loader(capsys):
    assert bench.main(["--workloads", "tiny,cpu", "--quick", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| workload | loader |")
    rows = [line for line in out[2:] if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows] == ["tiny", "tiny", "cpu", "cpu", "cpu", "cpu"]
    assert {r.split("|")[2].strip() for r in rows} == {"seqloader", "torch"}


def test_bench_workloads_are_a_registry_of_row_functions():
    assert {"tiny", "images", "cpu", "first_batch"} <= set(bench.WORKLOADS)
    rows = bench.WORKLOADS["images"](bench.Options(quick=True))
    assert {r.loader for r in rows} >= {"seqloader", "torch"} and all(r.value > 0 for r in rows)
    assert bench.first_batch("seqloader", bench.ImageDataset(8), 4, 1) > 0
    assert bench.first_batch("torch", bench.ImageDataset(8), 4, 1) > 0
    text = bench.format_rows(rows, markdown=False)
    assert text.splitlines()[0].split()[:2] == ["workload", "loader"]
