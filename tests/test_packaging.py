"""The package users install is the package we test.

* The wheel (and the sdist it is built from) holds exactly the files of ``seqloader/``: 0.3's wheel
  left out ``seqloader/prefetcher/processes/`` (a folder without ``__init__.py``), and every test
  imported the checkout, so no test saw it.
* In the README's test run (``python -m tools.test_installed``), ``import seqloader`` resolves to the
  installed wheel in site-packages, not to a checkout.
* One version: ``seqloader.__version__`` is what the build writes into the wheel's metadata.

The installed run passes the wheel, the sdist and the checkout through the environment; a run from
the checkout (``python -m pytest``) builds a wheel of its own here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import seqloader

ROOT = Path(__file__).resolve().parents[1]
INSTALLED_RUN = os.environ.get("SEQLOADER_INSTALLED_RUN") == "1"

pytestmark = pytest.mark.timeout(600)


def _checkout() -> Path:
    return Path(os.environ.get("SEQLOADER_CHECKOUT", ROOT))


def _package_files(checkout: Path) -> set[str]:
    """``seqloader/...`` paths of the source tree that belong in a wheel (no caches)."""
    tree = checkout / "seqloader"
    return {p.relative_to(checkout).as_posix() for p in tree.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """``(sdist, wheel)``: the installed run's, or built here with ``python -m build``."""
    if INSTALLED_RUN:
        return Path(os.environ["SEQLOADER_SDIST"]), Path(os.environ["SEQLOADER_WHEEL"])
    pytest.importorskip("build", reason="the 'build' package is in the 'test' extra")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return sdist, wheel


def test_the_wheel_holds_every_file_of_the_package(dists):
    _, wheel = dists
    with zipfile.ZipFile(wheel) as z:
        in_wheel = {n for n in z.namelist() if n.startswith("seqloader/")}
    tree = _package_files(_checkout())
    assert "seqloader/prefetcher/processes/executor.py" in tree
    assert in_wheel == tree, (f"missing from the wheel: {sorted(tree - in_wheel)}; "
                              f"in the wheel only: {sorted(in_wheel - tree)}")


def test_every_folder_of_the_package_is_a_package():
    checkout = _checkout()
    folders = [d for d in (checkout / "seqloader").rglob("*") if d.is_dir() and d.name != "__pycache__"]
    assert [str(d) for d in folders if not (d / "__init__.py").exists()] == []


def test_the_sdist_holds_every_file_of_the_package(dists):
    sdist, _ = dists
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    tree = _package_files(_checkout())
    assert tree <= names, f"missing from the sdist: {sorted(tree - names)}"


def test_the_wheel_has_the_package_version(dists):
    _, wheel = dists
    assert wheel.name.startswith(f"seqloader-{seqloader.__version__}-")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    assert f"\nVersion: {seqloader.__version__}\n" in text
    assert re.search(r"^Requires-Python: >=3\.11", text, re.M), text[:2000]


@pytest.mark.skipif(not INSTALLED_RUN, reason="a property of `python -m tools.test_installed` (the README's "
                    "test command): this run imports seqloader from the checkout")
def test_import_seqloader_resolves_to_the_installed_wheel():
    here = Path(seqloader.__file__).resolve()
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert any(here.is_relative_to(s) for s in site), f"seqloader imported from {here}, not from {site}"
    assert not here.is_relative_to((_checkout() / "seqloader").resolve())
    # ... and so do the process workers, which import the package afresh (spawned children)
    proc = subprocess.run([sys.executable, "-c", "import seqloader.prefetcher.processes.executor as m; print(m.__file__)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert Path(proc.stdout.strip()).resolve().is_relative_to(here.parent)


@pytest.mark.mp
def test_workers_run_from_the_package_that_was_imported():
    """num_workers=2 on whatever ``seqloader`` this run imports (0.3's wheel raised ModuleNotFoundError)."""
    import torch

    loader = seqloader.DataLoader(list(range(8)), batch_size=2, num_workers=2)
    batches = list(loader)
    assert all(isinstance(b, torch.Tensor) for b in batches)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("extras,no_deps", [("test,integrations", True), ("torchtitan", True), ("test", False)])
def test_the_install_step_adds_torchtitan_without_its_requirements_for_its_extras(monkeypatch, extras, no_deps):
    """torchtitan 0.3.0's own requirements do not resolve beside the test extra: CI's install
    (``tools/test_installed.py``) adds it with ``--no-deps`` after the extra that lists what it imports."""
    import configparser

    from tools import test_installed

    calls: list[list[str]] = []
    monkeypatch.setattr(test_installed, "run", lambda cmd, **kw: calls.append([str(c) for c in cmd]))
    test_installed.install(Path("seqloader-0-py3-none-any.whl"), extras, Path("constraints.txt"))
    titan = [c for c in calls if "torchtitan==0.3.0" in c]
    assert bool(titan) == no_deps
    if no_deps:
        assert "--no-deps" in titan[0] and calls.index(titan[0]) == 1  # after the extras, before the wheel again
    config = configparser.ConfigParser()
    config.read(_checkout() / "setup.cfg")
    extras_require = config["options.extras_require"]
    for name in ("torchtitan", "integrations"):
        assert {"torchdata>=0.11", "tyro>=0.9"} <= set(extras_require[name].split())
