"""seqloader passes mypy (strict on the core), and the item types of the sequence ops reach users.

* ``python -m mypy`` with setup.cfg's ``[mypy]`` sections must exit 0: all of ``seqloader/``, strict
  on the torch-free core and the loader's pure parts (state, orders, plans, recipe), every function
  body checked in the prefetcher, the loader, the sources and the integrations.
* A snippet that uses the public ops sees precise item types (``shuffle(list_of_ints, seed)[0]`` is
  an ``int``, a slice a ``LazySequence[int]``, ...), and misusing an item is an error.

mypy keeps its incremental caches in ``.mypy_cache/`` at the repository root (git-ignored), so a
warm run takes a second or two; a cold one (it reads numpy's and torch's stubs) about 20 s.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: mypy's cache for the snippets, apart from the default ``.mypy_cache/3.10`` of the main run
SNIPPET_CACHE = ROOT / ".mypy_cache" / "snippets"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                       reason="mypy is in the 'test' extra; install it to type-check the core"),
    pytest.mark.timeout(600),
]


def run_mypy(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m mypy`` in the repository root with setup.cfg's configuration."""
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def check_snippet(code: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """Type-check ``code`` as a user module ``snippet.py`` importing ``seqloader`` (found from the
    repository root), under the same strict options (strict users see seqloader's public names:
    ``seqloader/__init__.py`` re-exports them explicitly under ``TYPE_CHECKING``). The snippets
    are extra files on the command line, hence a cache of their own.
    """
    path = tmp_path / "snippet.py"
    path.write_text(textwrap.dedent(code))
    return run_mypy("--cache-dir", str(SNIPPET_CACHE), str(path))


def test_seqloader_passes_mypy(tmp_path):
    package = pathlib.Path(importlib.util.find_spec("seqloader").origin).resolve().parent  # type: ignore[arg-type,union-attr]
    if package.parent == ROOT:
        proc = run_mypy()  # setup.cfg's ``files = seqloader``: the checkout
    else:  # the installed wheel (``python -m tools.test_installed``): its files, copied out of site-packages
        shutil.copytree(package, tmp_path / "seqloader", ignore=shutil.ignore_patterns("__pycache__"))
        proc = run_mypy("--cache-dir", str(ROOT / ".mypy_cache" / "installed"), str(tmp_path / "seqloader"))
    assert proc.returncode == 0, f"mypy failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


#: expression -> the type mypy reveals for it (``builtins.`` and module paths stripped)
EXPECTED = {
    "seqloader.shuffle(ints, seed=0)[0]": "int",
    "seqloader.shuffle(ints, seed=0)[-1] + 1": "int",
    "seqloader.shuffle(ints, seed=0)[1:3]": "LazySequence[int]",
    "seqloader.shuffle(range(10), seed=0)[1:3][0]": "int",
    "seqloader.gather(words, [2, 0])": "LazySequence[str]",
    "seqloader.repeat(ints, 2)[0]": "int",
    "seqloader.shard(words, 0, 2)": "LazySequence[str]",
    "seqloader.concatenate([ints, ints])": "LazySequence[int]",
    "seqloader.smap(str, ints)": "LazySequence[str]",
    "seqloader.rng_map(jitter, ints, seed=0)": "LazySequence[float]",
    "seqloader.batch(ints, 2)": "LazySequence[list[int]]",
    "seqloader.batch(ints, 2, collate_fn=len)[0]": "int",
}


def _short(type_name: str) -> str:
    return re.sub(r"\b(builtins|seqloader\.sequences\.base)\.", "", type_name)


def test_item_types_reach_users(tmp_path):
    header = """\
        import numpy as np
        import seqloader

        ints: list[int] = [3, 1, 2]
        words = ["a", "b", "c"]

        def jitter(x: int, rng: np.random.Generator) -> float:
            return x + rng.random()

        total: int = seqloader.shuffle(ints, seed=0)[0] + 1
        part: seqloader.LazySequence[int] = seqloader.shuffle(ints, seed=0)[1:3]
        """
    exprs = list(EXPECTED)
    code = textwrap.dedent(header) + "".join(f"reveal_type({e})\n" for e in exprs)
    proc = check_snippet(code, tmp_path)
    assert proc.returncode == 0, f"mypy rejected the snippet (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    first = len(textwrap.dedent(header).splitlines()) + 1
    revealed = {int(m[1]): _short(m[2]) for m in re.finditer(r':(\d+): note: Revealed type is "(.*)"', proc.stdout)}
    got = {e: revealed.get(first + k) for k, e in enumerate(exprs)}
    assert got == EXPECTED, proc.stdout


def test_misused_item_is_a_type_error(tmp_path):
    proc = check_snippet("""\
        import seqloader
        seqloader.shuffle([1, 2], seed=0)[0].upper()
        """, tmp_path)
    assert proc.returncode == 1, f"expected one type error (rc=1), got rc={proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert re.search(r'"int" has no attribute "upper"', proc.stdout), proc.stdout
