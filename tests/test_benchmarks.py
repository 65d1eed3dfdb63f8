"""Smoke test of ``python -m benchmarks``: it runs and prints rows (timings are never checked)."""

from __future__ import annotations

import ast
import importlib.util
import math
import pathlib

import pytest

import benchmarks
from benchmarks import common, features, prefetch
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
                                          "resume", "state_size", "loader_tiny", "loader_images", "main_cpu",
                                          "iterable_tiny", "iterable_images", "straggler", "stats_overhead",
                                          "stages_overhead", "resume_scale", "mix", "state_dict", "sources_parquet",
                                          "sources_tar", "sources_index", "sources_latency", "packing_padding",
                                          "packing_throughput", "packing_resume", "threads_parquet", "threads_tar",
                                          "threads_memory", "threads_tiny", "threads_latency", "columnar_budget",
                                          "columnar_workers", "columnar_costs", "pretraining_windows"]
    assert list(benchmarks.OPT_IN) == ["ray_overhead", "ray_scaling", "ray_node_loss",  # only when named
                                       "autotune_latency", "autotune_python", "autotune_parquet", "autotune_tar"]
    rows = benchmarks.WORKLOADS["images"](common.Options(quick=True))
    assert [r.loader for r in rows] == ["seqloader", "torch"]
    assert all(r.value > 0 and r.mb_per_s > 0 for r in rows) and rows[0].ratio > 0
    assert prefetch.first_batch("seqloader", common.ImageDataset(8), 4, 1) > 0
    assert prefetch.first_batch("torch", common.ImageDataset(8), 4, 1) > 0
    text = common.format_rows(rows, markdown=False)
    assert text.splitlines()[0].split()[:2] == ["workload", "loader"]


def _quick_rows(name: str) -> list[common.Row]:
    rows = benchmarks.WORKLOADS[name](common.Options(quick=True))
    assert rows and {r.workload for r in rows} == {name}
    return rows


@pytest.mark.parametrize("name", ["iterable_tiny", "iterable_images"])
def test_iterable_workloads_compare_with_torch(name):
    rows = _quick_rows(name)
    assert [(r.loader, r.num_workers) for r in rows] == [("seqloader.DataLoader", 2), ("torch DataLoader", 2)]
    assert all(r.value > 0 and r.unit == "samples/s" for r in rows) and rows[0].ratio > 0
    assert (rows[0].mb_per_s is None) == (name == "iterable_tiny")


def test_straggler_has_a_row_per_order():
    rows = _quick_rows("straggler")
    assert [r.loader for r in rows] == ["seqloader.DataLoader in_order=False", "seqloader.DataLoader in_order=True",
                                        "torch DataLoader in_order=False"]
    assert all(r.value > 0 and r.num_workers == 2 for r in rows) and rows[0].ratio > 0
    assert "x seqloader in_order=True" in rows[0].notes
    assert features.StragglerDataset(101, sleep_s=0.0).slow_items == 3


def test_loader_tiny_reports_0_and_2_workers():
    rows = _quick_rows("loader_tiny")
    assert [r.num_workers for r in rows] == [0, 0, 2, 2]
    assert all(r.value > 0 for r in rows) and rows[0].ratio > 0 and rows[2].ratio > 0


def test_resume_scale_measures_torch_at_every_quick_size():
    rows = _quick_rows("resume_scale")
    assert [r.loader for r in rows] == ["seqloader n=10**5", "torch skip n=10**5",
                                        "seqloader n=10**6", "torch skip n=10**6"]
    assert all(r.value > 0 and r.unit == "s" for r in rows)
    assert rows[0].ratio > 0 and rows[2].ratio > 0 and "the time at n=10**5" in rows[2].notes


def test_mix_rows_have_no_torch_ratio():
    rows = _quick_rows("mix")
    assert len(rows) == 4 and all(r.value > 0 and r.unit == "µs" and r.ratio is None for r in rows)
    assert all("no torch counterpart" in r.notes for r in rows)


def test_stats_overhead_reports_a_percentage_and_restores_the_stats():
    start, returned = features.LoaderStats.start, features.LoaderStats.returned
    rows = _quick_rows("stats_overhead")
    assert [r.unit for r in rows] == ["samples/s"] * 3 + ["%"]
    assert all(r.value > 0 for r in rows[:3]) and rows[0].ratio > 0
    assert math.isfinite(rows[3].value) and "target <= 1%" in rows[3].notes  # a difference: may be < 0 in noise
    assert (features.LoaderStats.start, features.LoaderStats.returned) == (start, returned)


def test_stages_overhead_reports_on_off_and_a_percentage_per_pipeline():
    rows = _quick_rows("stages_overhead")
    assert [r.unit for r in rows] == ["samples/s", "samples/s", "%"] * 3
    assert [r.num_workers for r in rows] == [0] * 6 + [2] * 3
    assert all(r.value > 0 for r in rows if r.unit == "samples/s")
    assert all(math.isfinite(r.value) and "target <= 2%" in r.notes for r in rows if r.unit == "%")


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", ["prefetch.py", "loader.py", "iterable.py", "features.py", "scale.py"])
def test_a_workload_module_imports_only_common_seqloader_and_third_parties(name):
    ours = {m for m in _imports(BENCHMARKS / name) if m.split(".")[0] == "benchmarks"}
    assert ours == {"benchmarks.common"}
    assert not {m for m in _imports(BENCHMARKS / "common.py") if m.split(".")[0] in ("benchmarks", "seqloader")}


def test_packing_workloads_report_padding_throughput_and_resume():
    rows = _quick_rows("packing_padding")
    assert [r.loader for r in rows][:4] == ["seqloader.pack best_fit, window=256 documents",
                                           "seqloader.pack best_fit, window=1024 documents",
                                           "seqloader.pack best_fit, window=4096 documents",
                                           "seqloader.pack first_fit, window=1024 documents"]
    assert all(0 <= r.value < 100 and r.unit == "%" for r in rows)
    rows = _quick_rows("packing_resume")
    assert [r.unit for r in rows] == ["s", "s", "s"] and all(r.value > 0 for r in rows)
    assert "bit-identical" in rows[1].notes


def test_the_main_cpu_guard_reports_microseconds_per_batch_against_torch():
    rows = _quick_rows("main_cpu")
    assert [r.loader for r in rows] == ["torch DataLoader", "seqloader.DataLoader (processes)",
                                        "seqloader.DataLoader (threads)"] * 2
    assert all(r.unit == "µs" and r.value > 0 for r in rows)
    assert all(r.ratio is not None and r.ratio > 0 for r in rows if r.loader.startswith("seqloader"))


def test_the_threads_workloads_report_every_executor_against_its_baselines():
    rows = _quick_rows("threads_parquet")
    assert [r.loader for r in rows] == ["pyarrow scan: iter_batches(64) -> tensors",
                                        "torch DataLoader over a map-style row index", "seqloader, 0 workers",
                                        "seqloader, processes", "seqloader, threads",
                                        "seqloader, 2 processes x 2 threads"] + (
        ["SPDL pipeline over the row groups, 2 threads"] if importlib.util.find_spec("spdl") else []) + [
        "seqloader columnar batch: Python per batch beyond the gather"]
    python = rows.pop()
    assert python.unit == "us" and "the gather" in python.notes
    assert all(r.value > 0 and r.unit == "rows/s" for r in rows)
    assert all("x the pyarrow scan" in r.notes and "CPU-s" in r.notes for r in rows[2:])
    assert all("bytes decoded / dataset 1.00" in r.notes for r in rows[2:6])  # the quick files: seams on block ends
    assert all("sized by the loader" in r.notes for r in rows[2:6])   # the docs' defaults, no cache_blocks
    rows = _quick_rows("threads_tar")
    assert [r.loader.split(",")[0] for r in rows][:2] == ["seqloader.tar_shards"] * 2
    assert all(r.value > 0 and r.unit == "samples/s" for r in rows) and "the offset index" in rows[0].notes
    rows = _quick_rows("threads_tiny")
    assert [r.loader for r in rows][:5] == ["seqloader, 0 workers", "torch DataLoader, 0 workers",
                                            "seqloader, threads", "seqloader, processes", "torch DataLoader"]
    assert len(rows) == 8 and all(r.value > 0 for r in rows)


def test_the_memory_workload_measures_each_loader_in_a_fresh_process():
    rows = _quick_rows("threads_memory")
    assert [r.unit for r in rows] == ["MiB"] * 3 + ["s"] * 3
    assert all(r.value > 0 for r in rows) and "the processes' PSS" in rows[0].notes


def test_the_columnar_budget_reports_the_scan_the_epochs_and_each_part_of_a_batch():
    rows = _quick_rows("columnar_budget")
    assert [r.unit for r in rows[:3]] == ["rows/s"] * 3 and all(r.value > 0 for r in rows[:3])
    assert "CPU-s" in rows[1].notes and rows[1].ratio > 0 and rows[2].num_workers == 2
    assert [r.unit for r in rows[3:]] == ["us"] * 7 and "gather" in rows[6].loader


def test_columnar_workers_reports_every_executor_against_torch_and_num_workers_0():
    rows = _quick_rows("columnar_workers")
    assert [r.loader for r in rows][-2:] == ["torch DataLoader over a map-style row index",
                                             "pyarrow scan: iter_batches(64) -> tensors"]
    assert all(r.unit == "rows/s" and r.value > 0 for r in rows) and rows[-2].ratio is None
    assert all(r.ratio > 0 and "x num_workers=0" in r.notes for r in rows[:5])


def test_columnar_costs_reports_each_executors_cpu_and_context_switches_per_batch():
    rows = _quick_rows("columnar_costs")
    assert [r.num_workers for r in rows] == [0, 2, 2, 2, 2]
    assert all(r.unit == "CPU us/batch" and r.value > 0 for r in rows)
    assert all("training thread" in r.notes and "context switches/batch" in r.notes for r in rows)


def test_pretraining_windows_reports_the_memmap_loop_and_the_loader_at_0_and_2_workers():
    rows = _quick_rows("pretraining_windows")
    assert [(r.loader, r.num_workers) for r in rows[:3]] == [
        ("np.memmap slice loop", 0), ("seqloader.DataLoader(token_windows)", 0), ("seqloader.DataLoader(token_windows)", 2)]
    assert all(r.unit == "µs" and r.value > 0 for r in rows) and all(r.ratio > 0 for r in rows[1:])
    assert all("vs the memmap loop" in r.notes for r in rows[1:])
