"""Layers: L0 (sequences, errors) and L1 (rng, permutation) import neither torch nor multiprocessing."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "seqloader"
FORBIDDEN = {"torch", "multiprocessing"}
L0_L1 = sorted((ROOT / "sequences").glob("*.py")) + [ROOT / "errors.py", ROOT / "rng.py", ROOT / "permutation.py"]


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value))
    return names


def test_the_layer_list_is_not_empty():
    names = {p.name for p in L0_L1}
    assert {"base.py", "mapping.py", "reorder.py", "shape.py", "shard.py", "errors.py", "rng.py",
            "permutation.py"} <= names
    assert all(p.exists() for p in L0_L1)


@pytest.mark.parametrize("path", L0_L1, ids=lambda p: str(p.relative_to(ROOT)))
def test_l0_and_l1_import_neither_torch_nor_multiprocessing(path):
    bad = {m for m in imported_modules(path) if m.split(".")[0] in FORBIDDEN}
    assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}; L0/L1 must not"


@pytest.mark.parametrize("path", L0_L1, ids=lambda p: str(p.relative_to(ROOT)))
def test_l0_and_l1_import_only_l0_and_l1_of_seqloader(path):
    allowed = ("seqloader.sequences", "seqloader.errors", "seqloader.rng", "seqloader.permutation")
    ours = {m for m in imported_modules(path) if m.split(".")[0] == "seqloader"}
    assert all(m.startswith(allowed) for m in ours), sorted(ours)


def test_the_checker_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.nn\nfrom multiprocessing import shared_memory\n__import__('torch')\n")
    assert imported_modules(probe) == {"torch.nn", "multiprocessing", "torch"}
