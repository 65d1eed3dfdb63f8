"""Test what users install: build the sdist and the wheel, install the wheel, run the suite against it.

The README's test command. From the repository root::

    python -m tools.test_installed                 # build, install (test + integrations extras), run it all
    python -m tools.test_installed --no-build --pin numpy==1.26.4 --subset versions  # the same wheel, numpy 1.x
    python -m tools.test_installed -- -x tests/loader              # pytest's own arguments after --

Steps, each one a plain command (printed before it runs):

1. ``python -m build`` makes the sdist and, from the sdist, the wheel (into ``build/dist/``), so a file
   the sdist drops is missing from the wheel too.
2. ``pip install "<wheel>[test,integrations]" -c constraints.txt`` (the torch already installed stays),
   then the packages an extra needs without their own requirements (:data:`NO_DEPS`: torchtitan) with
   ``--no-deps``, then the wheel itself again with ``--force-reinstall --no-deps`` (an editable or
   older install of the same version would otherwise be kept).
3. The checkout is copied to ``build/installed-tests/`` *without* ``seqloader/`` and pytest runs there:
   ``import seqloader`` can only find the installed wheel, while the tests still import their own helpers
   (``tests.``, ``benchmarks``, ``tools``). The doctests of the installed package run too.

The run tells the tests what it is through the environment: ``SEQLOADER_INSTALLED_RUN=1``,
``SEQLOADER_WHEEL`` and ``SEQLOADER_SDIST`` (the files built) and ``SEQLOADER_CHECKOUT`` (the source
tree, which ``tests/test_packaging.py`` compares with the wheel; nothing imports from it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
DIST = REPO / "build" / "dist"
STAGE = REPO / "build" / "installed-tests"

#: packages installed with ``--no-deps`` after an extra named here: their own requirements do not
#: resolve beside the test extra and are not what seqloader imports (setup.cfg, the ``torchtitan``
#: extra, which lists what ``import torchtitan.components.dataloader`` does need)
NO_DEPS: dict[str, tuple[str, ...]] = {
    "torchtitan": ("torchtitan==0.3.0",),
    "integrations": ("torchtitan==0.3.0",),
}

#: top-level names of the checkout that the staged copy leaves out
_LEFT_OUT = {"seqloader", ".git", "build", "dist", ".venv", "venv", ".mypy_cache", ".hypothesis"}

#: ``--subset versions``: the tests that fail first when a torch, numpy or CPython detail that
#: seqloader depends on changes (docs/design.md, "Private details we depend on"), run on every
#: torch and numpy version the package declares. Paths are relative to the repository root.
SUBSETS: dict[str, tuple[str, ...]] = {
    "versions": (
        "tests/test_packaging.py",
        "tests/test_rng.py",
        "tests/loader/rngs/test_global_rngs.py",
        "tests/loader/rngs/test_worker_info_patch.py",
        "tests/loader/test_torch_compat.py",
        "tests/loader/test_parity.py",
        "tests/loader/test_dropin.py",
        "tests/loader/test_args.py",
        "tests/loader/test_resume.py",
        "tests/loader/workers/test_thread_workers.py",
        "tests/loader/epoch/test_slot_collate.py",
        "tests/loader/state/test_old_states.py",
        "tests/prefetcher/test_faults.py",
        "{package}/loader/torch_compat",
        "{package}/loader/rngs/snapshots.py",
    ),
    # ``--subset interpreters``: what another CPython changes first (issue 44: forked workers after
    # Ray on 3.13, the raw RNG copies, the private C functions, exceptions and pickling): the
    # versions subset and every executor's contract and prefetcher promises, Ray's included, in one
    # session (a Ray epoch before process workers is the case 3.13 broke). CI runs it on 3.13.
    "interpreters": (
        "tests/test_packaging.py",
        "tests/test_rng.py",
        "tests/loader/rngs",
        "tests/loader/test_torch_compat.py",
        "tests/loader/test_parity.py",
        "tests/loader/test_dropin.py",
        "tests/loader/test_resume.py",
        "tests/loader/workers",
        "tests/loader/state/test_old_states.py",
        "tests/contract",
        "tests/prefetcher",
        "tests/sources/test_table.py",
        "{package}/loader/torch_compat",
        "{package}/loader/rngs",
    ),
    # ``--subset plain_routes``: the tests of the three process-wide mechanisms and of what rests
    # on them (num_workers=0 snapshots, thread workers, the worker-info patch, every executor's
    # contract but Ray's, whose actors none of the three touch), run by CI with
    # SEQLOADER_PLAIN_ROUTES=probe,snapshots,worker_info (docs/design.md, "The plain routes").
    # "-k", "not ray": pytest's own arguments, passed with the paths.
    "plain_routes": (
        "tests/loader/rngs/test_plain_routes.py",
        "tests/loader/rngs/test_global_rngs.py",
        "tests/loader/workers/test_thread_workers.py",
        "tests/loader/rngs/test_worker_info_patch.py",
        "tests/loader/workers/test_executor_edges.py",
        "tests/contract/test_executors.py",
        "tests/loader/test_resume.py",
        "tests/loader/test_torch_compat.py",
        "{package}/loader/plain_routes.py",
        "{package}/loader/rngs/snapshots.py",
        "{package}/loader/rngs/seeding.py",
        "{package}/loader/workers/threads.py",
        "{package}/loader/torch_compat/worker_info.py",
        "-k", "not ray",
    ),
}


def run(cmd: Sequence[str], **kwargs: object) -> None:
    """Run ``cmd``, printing it first; a failure ends this script with the command's exit code."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    proc = subprocess.run(list(cmd), **kwargs)  # type: ignore[call-overload]
    if proc.returncode:
        sys.exit(proc.returncode)


def build() -> tuple[Path, Path]:
    """``python -m build`` into :data:`DIST`; returns ``(sdist, wheel)``."""
    if subprocess.run([sys.executable, "-c", "import build"], capture_output=True).returncode:
        run([sys.executable, "-m", "pip", "install", "-q", "build>=1"])
    shutil.rmtree(DIST, ignore_errors=True)
    log = REPO / "build" / "build.log"
    log.parent.mkdir(exist_ok=True)
    print(f"+ {sys.executable} -m build --outdir {DIST} {REPO}  (output in {log})", flush=True)
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(DIST), str(REPO)], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        print(log.read_text()[-5000:])
        sys.exit(proc.returncode)
    return built()


def built() -> tuple[Path, Path]:
    """The sdist and the wheel in :data:`DIST` (exactly one of each, or exit naming what is there)."""
    sdists, wheels = sorted(DIST.glob("seqloader-*.tar.gz")), sorted(DIST.glob("seqloader-*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        sys.exit(f"test_installed: expected one sdist and one wheel in {DIST}, found "
                 f"{[p.name for p in sdists + wheels]}; run without --no-build")
    return sdists[0], wheels[0]


def install(wheel: Path, extras: str, constraints_file: Path, pins: Sequence[str] = ()) -> None:
    """The wheel with ``extras`` and their dependencies, then the wheel itself over any other install.
    ``pins`` (``"numpy==1.26.4"``) constrain the resolution further: pip then picks versions of the
    other dependencies that work with them (a pyarrow and a pandas that accept numpy 1.x)."""
    constraints = ["-c", str(constraints_file)]
    if pins:
        pinned = REPO / "build" / "pins.txt"
        pinned.parent.mkdir(exist_ok=True)
        pinned.write_text("".join(f"{p}\n" for p in pins))
        constraints += ["-c", str(pinned)]
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    run([*pip, f"{wheel}[{extras}]" if extras else str(wheel), *constraints])
    no_deps = sorted({spec for extra in extras.split(",") for spec in NO_DEPS.get(extra.strip(), ())})
    if no_deps:
        run([*pip, "--no-deps", *no_deps, *constraints])
    run([*pip, "--force-reinstall", "--no-deps", str(wheel)])


def stage() -> Path:
    """A copy of the checkout without ``seqloader/`` (and without builds, caches and venvs)."""
    shutil.rmtree(STAGE, ignore_errors=True)
    STAGE.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "_build", ".ipynb_checkpoints")
    for entry in sorted(REPO.iterdir()):
        if entry.name in _LEFT_OUT or entry.name.endswith(".egg-info") or entry.name.startswith(".venv"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, STAGE / entry.name, ignore=skip, symlinks=True)
        else:
            shutil.copy2(entry, STAGE / entry.name)
    return STAGE


def installed_package() -> Path:
    """Where the installed ``seqloader`` lives (asked of a fresh interpreter outside the checkout)."""
    out = subprocess.run([sys.executable, "-c", "import seqloader, os; print(os.path.dirname(seqloader.__file__))"],
                         cwd=sysconfig.get_paths()["purelib"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Build, install and test; returns pytest's exit code."""
    parser = argparse.ArgumentParser(prog="python -m tools.test_installed", description=__doc__.split("\n")[0])
    parser.add_argument("--no-build", action="store_true", help="test the wheel already in build/dist (no build)")
    parser.add_argument("--no-install", action="store_true", help="test what is installed (no pip install)")
    parser.add_argument("--pin", action="append", default=[], metavar="SPEC",
                        help="a further constraint for the install, e.g. numpy==1.26.4 (repeatable)")
    parser.add_argument("--extras", default="test,integrations", help="extras installed with the wheel")
    parser.add_argument("--constraints", type=Path, default=REPO / "constraints.txt",
                        help="pip constraints for the install (default: constraints.txt, the torch CI installs)")
    parser.add_argument("--subset", choices=sorted(SUBSETS), help="run only this named subset of the suite")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)

    sdist, wheel = built() if args.no_build else build()
    if not args.no_install:
        install(wheel, args.extras, args.constraints, args.pin)
    root, package = stage(), installed_package()
    if package.is_relative_to(REPO / "seqloader"):
        sys.exit(f"test_installed: 'import seqloader' resolves to {package}, the checkout's")
    if args.pytest_args:
        targets = list(args.pytest_args)
    elif args.subset:
        targets = [t.format(package=package) for t in SUBSETS[args.subset]]
    else:  # setup.cfg's testpaths, with the installed package for the checkout's seqloader/
        targets = ["tests", "tools", str(package)]
    env = dict(os.environ, SEQLOADER_INSTALLED_RUN="1", SEQLOADER_WHEEL=str(wheel), SEQLOADER_SDIST=str(sdist),
               SEQLOADER_CHECKOUT=str(REPO))
    cmd = [sys.executable, "-m", "pytest", "-c", str(root / "setup.cfg"), f"--rootdir={root}",
           f"--ignore={package / 'demo.py'}", *targets]
    print("+ (in", root, ")", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=root, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
