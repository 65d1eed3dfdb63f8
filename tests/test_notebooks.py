"""Every notebook in ``notebooks/`` runs top to bottom, and is committed without outputs.

Notebooks are executed with nbclient in a ``python3`` kernel from the current environment, with the
notebooks folder as working directory. There is no exclude list: a notebook that cannot run in CI
does not belong in ``notebooks/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))

pytestmark = pytest.mark.mp  # notebooks start worker processes: check that nothing outlives them


def test_there_are_notebooks():
    assert [p.name for p in PATHS][:3] == ["01_quickstart.ipynb", "02_resume.ipynb", "03_throughput.ipynb"]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=100, startup_timeout=60,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    # The kernel imports the seqloader under test, installed or not.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    client.execute(env=env)  # raises CellExecutionError naming the cell and the traceback
