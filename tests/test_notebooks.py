"""Every notebook in ``notebooks/`` runs top to bottom, and is committed without outputs.

Notebooks are executed with nbclient in a ``python3`` kernel running the interpreter of the test run
(not whatever ``python3`` kernelspec is installed), with the notebooks folder as working directory. There is no exclude list: a notebook that cannot run in CI
does not belong in ``notebooks/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from tmpdirs import short_tmpdir

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


def _kernel_manager(tmp_path):
    """A ``python3`` kernel that runs this interpreter, whatever kernelspecs the user has installed."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    write_kernel_spec(str(tmp_path / "kernels" / "python3"))  # argv[0] is sys.executable
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    km = _kernel_manager(tmp_path)
    client = NotebookClient(nb, km=km, timeout=100, startup_timeout=60,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    # The kernel imports the seqloader under test, installed or not.
    with short_tmpdir() as tmp:   # (the cells' tempfile.mkdtemp() folders are removed with it)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   MPLBACKEND="Agg", TMPDIR=tmp)
        try:
            client.execute(env=env)  # raises CellExecutionError naming the cell and the traceback
        finally:
            if km.has_kernel:  # the client shuts down only kernels it started itself
                km.shutdown_kernel(now=True)
