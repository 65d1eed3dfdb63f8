"""The docs build with ``-W`` (every warning is an error), cover the public API, and their examples run.

* ``python -m sphinx -W --keep-going -b html docs <tmp>`` must exit 0; autodoc imports seqloader.
* Every name in ``seqloader.__all__`` appears in an ``auto*::`` directive of ``docs/api/*.rst``.
* Every ```` ```python ```` block of the narrative pages and of README.md runs, page by page, in a fresh
  interpreter (blocks of one page share a namespace, in order). A block preceded by a line
  ``<!-- not-run: <reason> -->`` is shown but not run (e.g. it needs ``torchrun``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import seqloader
from tmpdirs import short_tmpdir

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

pytestmark = pytest.mark.mp  # examples start worker processes: check that nothing outlives them

_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
_NOT_RUN = "<!-- not-run:"


def python_blocks(text: str) -> list[str]:
    """The runnable ```` ```python ```` blocks of a markdown text, in order."""
    blocks = []
    for m in _FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        before = text[: m.start()].rstrip().splitlines()
        if before and before[-1].strip().startswith(_NOT_RUN):
            continue
        blocks.append(m.group(2))
    return blocks


def _pages_with_examples() -> list[Path]:
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
    return [p for p in pages if p.exists() and python_blocks(p.read_text(encoding="utf-8"))]


def test_sphinx_build_has_no_warnings(tmp_path):
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        pytest.skip("sphinx and myst-parser are in the 'test' extra; install it to build the docs")
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=110, cwd=ROOT,
    )
    assert proc.returncode == 0, f"sphinx failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert (out / "index.html").exists()


def test_every_public_name_has_an_api_entry():
    documented = set()
    for page in (DOCS / "api").glob("*.rst"):
        documented |= set(re.findall(r"^\.\. auto\w+:: seqloader\.(\w+)\s*$", page.read_text(), re.M))
    public = {name for name in seqloader.__all__ if not name.startswith("__")}
    missing = sorted(public - documented)
    assert not missing, f"public names without an entry in docs/api/*.rst: {missing}"
    unknown = sorted(documented - public)
    assert not unknown, f"docs/api/*.rst document names that are not in seqloader.__all__: {unknown}"


def test_readme_comparison_torch_dataloader_has_no_resume_state():
    """Backs the README's table: torch's DataLoader has no state_dict/load_state_dict; ours does."""
    import torch.utils.data

    for method in ("state_dict", "load_state_dict"):
        assert not hasattr(torch.utils.data.DataLoader, method)
        assert callable(getattr(seqloader.DataLoader, method))


def test_python_blocks_skips_other_languages_and_not_run_blocks():
    sample = "a\n```python\nx = 1\n```\n<!-- not-run: needs torchrun -->\n```python\ny\n```\n```bash\nls\n```\n"
    assert python_blocks(sample) == ["x = 1\n"]


@pytest.mark.timeout(300)  # distributed.md starts gloo worlds of spawned processes
@pytest.mark.parametrize("page", _pages_with_examples(), ids=lambda p: p.name)
def test_examples_run(page, tmp_path):
    code = "\n\n".join(python_blocks(page.read_text(encoding="utf-8")))
    script = tmp_path / f"example_{page.stem}.py"
    script.write_text(code, encoding="utf-8")
    with short_tmpdir() as tmp:   # (the examples' tempfile.mkdtemp() folders are removed with it)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   MPLBACKEND="Agg", TMPDIR=tmp)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=280,
                              cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"the examples of {page.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
