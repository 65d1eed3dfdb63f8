"""``python -m tools.house``: the shape of seqloader's import graph, as a newcomer reads it.

The package is read as a house: rooms, the floors they stand on, the arrows between them, and
the arrows that point the wrong way. Everything is computed from the source text (``ast``; nothing
is imported), so it runs on any checkout, on a branch before and after a restructure.

Definitions (the numbers the tool prints are counts of these):

- **module**: every ``.py`` file under the package directory, named as Python names it
  (``seqloader/loader/state/state.py`` is ``seqloader.loader.state.state``; a package's ``__init__.py`` is the
  package's name).
- **import**: an ``import`` or ``from ... import`` statement anywhere in a module (function bodies
  and ``if TYPE_CHECKING:`` blocks included, as ``tests/test_layers.py`` reads them; relative
  imports resolved), or an ``importlib.import_module``/``__import__`` call with a literal name. An
  imported name is resolved to the longest module name it starts with, so ``from seqloader.loader
  import state`` imports ``seqloader.loader.state.state``. Imports of modules outside the package are
  ignored.
- **room**: each package directly under the package root is one room with everything below it
  (``loader/``, ``prefetcher/`` including ``prefetcher/processes/``; printed with a trailing
  ``/``), and each loose module at the root is a room of its own (``rng``, ``errors``). The
  root's ``__init__.py`` is the front door, not a room: it names the public API and resolves it
  lazily, and its only imports are for type checkers.
- **arrow**: an ordered pair of distinct rooms ``A -> B`` such that some module of ``A`` imports
  some module of ``B``. Its *weight* is the number of such (module, module) pairs.
- **circle**: a set of two or more rooms that all reach each other along arrows (a strongly
  connected component of the room graph).
- **arrow back up**: an arrow that points against the layering. Either (a) some module of ``A``
  imports a module of ``B`` that sits on a higher layer of ``tests/test_layers.py``'s ``LAYERS``
  (longest matching prefix), or (b) the arrow closes a circle: the room it points to imports the
  room it starts from back (directly or through other rooms). Within each circle the tool picks
  which arrows are the ones back up by removing, one at a time, the lightest arrow that still lies
  on a cycle (ties: by name) until the circle is broken; for two rooms that import each other
  this is the thinner of the two arrows.
- **floor**: a room's floor is the length of the longest path of arrows from it, arrows back up
  left out (those would make it infinite): floor 0 holds the rooms that import no other room;
  ``floors`` is the number of distinct floors.

Usage::

    python -m tools.house                     # seqloader/ against tests/test_layers.py
    python -m tools.house --arrows            # ... and list every arrow with its weight
    python -m tools.house --inside loader     # seqloader/loader/ as a house: its folders and modules are rooms
    python -m tools.house --package path/to/pkg --layers path/to/test_layers.py

Example:
    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp()) / "pkg"
    >>> (root / "low").mkdir(parents=True)
    >>> for name, text in {"__init__.py": "", "low/__init__.py": "", "low/x.py": "",
    ...                    "top.py": "from pkg.low import x"}.items():
    ...     _ = (root / name).write_text(text)
    >>> h = survey(root, layers=[("pkg.low", 0), ("pkg.top", 1)])
    >>> h.rooms, h.floors, sorted(h.arrows), h.back_up
    (['low/', 'top'], {'low/': 0, 'top': 1}, [('top', 'low/')], {})
    >>> survey(root, layers=[("pkg.low", 2), ("pkg.top", 1)]).back_up  # an edge case: up a layer
    {('top', 'low/'): 'pkg.top (layer 1) imports pkg.low.x (layer 2)'}
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

__all__ = ["House", "main", "module_imports", "read_layers", "report", "survey"]

REPO = Path(__file__).resolve().parents[1]
#: the package ``import seqloader`` finds (this checkout's, or an installed wheel's), found without importing it
PACKAGE = Path(importlib.util.find_spec("seqloader").origin).resolve().parent  # type: ignore[union-attr,arg-type]

Arrow = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class House:
    """The surveyed package: rooms, arrows (with the module imports behind each), circles, floors.

    ``arrows`` maps ``(room, room)`` to the sorted ``(module, module)`` imports that make it;
    ``back_up`` maps each arrow back up to the reason it is one; ``floors`` maps each room to its
    floor; ``circles`` lists each circle's rooms, sorted.
    """

    package: str
    rooms: list[str]
    arrows: dict[Arrow, list[tuple[str, str]]]
    circles: list[list[str]]
    back_up: dict[Arrow, str]
    floors: dict[str, int]

    @property
    def floor_count(self) -> int:
        """The number of distinct floors."""
        return len(set(self.floors.values()))


def _module_names(root: Path, name: str) -> dict[str, Path]:
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [*name.split("."), *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def module_imports(path: Path, name: str, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` (source at ``path``) imports.

    Args:
        path: The module's source file.
        name: Its dotted name (needed to resolve relative imports).
        known: The package's module names; imports are resolved to the longest one they start with.

    Returns:
        The imported modules of ``known``, without ``name`` itself.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.py"
        >>> _ = p.write_text("import os\\nfrom . import b\\nfrom pkg.c import thing\\n")
        >>> sorted(module_imports(p, "pkg.a", {"pkg", "pkg.a", "pkg.b", "pkg.c"}))
        ['pkg.b', 'pkg.c']
        >>> module_imports(p, "pkg.a", set())  # nothing known: nothing imported
        set()
    """
    known = set(known)
    is_package = path.name == "__init__.py"
    raw: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            raw.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            for alias in node.names:  # ``from pkg import mod`` imports ``pkg.mod``; else ``pkg`` itself
                raw.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
              in ("__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant)):
            raw.add(str(node.args[0].value))
    out = set()
    for imported in raw:
        while imported and imported not in known:
            imported = imported.rpartition(".")[0]
        if imported and imported != name:
            out.add(imported)
    return out


def read_layers(test_file: Path) -> list[tuple[str, int]]:
    """``LAYERS`` from ``tests/test_layers.py``, read as a literal (the test file is not imported).

    Args:
        test_file: The layer test.

    Returns:
        Its ``(module prefix, layer)`` pairs.

    Raises:
        ValueError: If the file assigns no literal ``LAYERS``.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.py"
        >>> _ = p.write_text("LAYERS = [('pkg.a', 1)]\\n")
        >>> read_layers(p)
        [('pkg.a', 1)]
        >>> _ = p.write_text("X = 1\\n")
        >>> read_layers(p)
        Traceback (most recent call last):
        ValueError: house: no literal LAYERS = [...] in ...
    """
    for node in ast.parse(test_file.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "LAYERS" and node.value is not None:
            return [(str(p), int(n)) for p, n in ast.literal_eval(node.value)]
    raise ValueError(f"house: no literal LAYERS = [...] in {test_file}")


def _layer_of(module: str, layers: Sequence[tuple[str, int]]) -> Optional[int]:
    best: Optional[tuple[str, int]] = None
    for prefix, layer in layers:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def _room_of(module: str, package: str, packages: set[str]) -> Optional[str]:
    parts = module[len(package) + 1:].split(".") if module != package else []
    if not parts:
        return None  # the front door
    return parts[0] + "/" if f"{package}.{parts[0]}" in packages else parts[0]


def _components(nodes: Iterable[str], edges: Iterable[Arrow]) -> list[list[str]]:
    """Strongly connected components (Tarjan), each sorted; singletons included."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


def survey(root: Path, layers: Sequence[tuple[str, int]], name: Optional[str] = None) -> House:
    """Read the package at ``root`` and compute its rooms, arrows, circles, arrows back up and floors.

    Args:
        root: The package directory.
        name: its dotted name (default: the directory's name): a subpackage is surveyed as a
            house of its own (``survey(PACKAGE / "loader", layers, "seqloader.loader")``: its
            folders and loose modules are the rooms).
        layers: ``(module prefix, layer)`` pairs, as ``tests/test_layers.py``'s ``LAYERS``; a module
            no prefix matches has no layer and takes part in no layer check.

    Returns:
        The :class:`House` (see the module docstring for the definitions).

    Example:
        >>> import pathlib, tempfile
        >>> root = pathlib.Path(tempfile.mkdtemp()) / "pkg"
        >>> root.mkdir()
        >>> _ = (root / "a.py").write_text("import pkg.b")
        >>> _ = (root / "b.py").write_text("import pkg.a")  # an edge case: a circle of two rooms
        >>> h = survey(root, layers=[])
        >>> h.circles, h.back_up, h.floors
        ([['a', 'b']], {('a', 'b'): 'closes a circle: b imports a back'}, {'a': 0, 'b': 1})
    """
    package = root.name if name is None else name
    names = _module_names(root, package)
    packages = {n for n, p in names.items() if p.name == "__init__.py"}
    imports = {m: module_imports(p, m, names) for m, p in names.items()}
    rooms = sorted({r for m in names if (r := _room_of(m, package, packages)) is not None})
    arrows: dict[Arrow, list[tuple[str, str]]] = {}
    back_up: dict[Arrow, str] = {}
    for m in sorted(imports):
        a = _room_of(m, package, packages)
        for n in sorted(imports[m]):
            b = _room_of(n, package, packages)
            if a is None or b is None or a == b:
                continue
            arrows.setdefault((a, b), []).append((m, n))
            lm, ln = _layer_of(m, layers), _layer_of(n, layers)
            if lm is not None and ln is not None and ln > lm and (a, b) not in back_up:
                back_up[(a, b)] = f"{m} (layer {lm}) imports {n} (layer {ln})"
    circles = [c for c in _components(rooms, arrows) if len(c) > 1]
    # Break each circle: drop the lightest arrow still on a cycle until none is left.
    kept = {e for e in arrows if e not in back_up}
    while True:
        comp_of = {r: i for i, c in enumerate(_components(rooms, kept)) for r in c}
        on_cycle = sorted((e for e in kept if comp_of[e[0]] == comp_of[e[1]]),
                          key=lambda e: (len(arrows[e]), e))
        if not on_cycle:
            break
        a, b = on_cycle[0]
        back_up[(a, b)] = f"closes a circle: {b} imports {a} back"
        kept.discard((a, b))
    floors: dict[str, int] = {}

    def floor(r: str) -> int:
        if r not in floors:
            floors[r] = 1 + max((floor(b) for a, b in kept if a == r), default=-1)
        return floors[r]

    for r in rooms:
        floor(r)
    return House(package, rooms, arrows, circles, dict(sorted(back_up.items())), dict(sorted(floors.items())))


def report(house: House, show_arrows: bool = False) -> str:
    """The survey as text: a summary line, the floors from the top, arrows back up, circles.

    Args:
        house: A survey.
        show_arrows: Also list every arrow with the module imports behind it.

    Returns:
        The text, one line per room, arrow back up and circle.

    Example:
        >>> h = House("pkg", ["a", "b"], {("a", "b"): [("pkg.a", "pkg.b")]}, [], {}, {"a": 1, "b": 0})
        >>> print(report(h))
        pkg: 2 rooms, 2 floors, 1 arrows, 0 circles, 0 arrows back up
          floor 1: a
          floor 0: b
        >>> print(report(House("pkg", [], {}, [], {}, {})))  # an edge case: an empty package
        pkg: 0 rooms, 0 floors, 0 arrows, 0 circles, 0 arrows back up
    """
    lines = [f"{house.package}: {len(house.rooms)} rooms, {house.floor_count} floors, {len(house.arrows)} arrows, "
             f"{len(house.circles)} circles, {len(house.back_up)} arrows back up"]
    for f in sorted(set(house.floors.values()), reverse=True):
        lines.append(f"  floor {f}: " + ", ".join(r for r, g in house.floors.items() if g == f))
    if house.back_up:
        lines.append("arrows back up:")
        for (a, b), why in house.back_up.items():
            via = ", ".join(f"{m} -> {n}" for m, n in house.arrows[(a, b)])
            lines.append(f"  {a} -> {b}: {why} ({via})")
    if house.circles:
        lines.append("circles:")
        lines.extend("  " + " <-> ".join(c) for c in house.circles)
    if show_arrows:
        lines.append("arrows (weight: module imports):")
        for (a, b), pairs in sorted(house.arrows.items()):
            lines.append(f"  {a} -> {b} ({len(pairs)}): " + ", ".join(f"{m} -> {n}" for m, n in pairs))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the survey of ``--package`` (default: the ``seqloader`` package Python finds: the checkout's, or an installed wheel's).

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        0 (the tool reports; it checks nothing).

    Example:
        >>> main(["--package", str(PACKAGE)]) == 0  # doctest: +ELLIPSIS
        seqloader: ... rooms, ... floors, ... arrows, ... circles, ... arrows back up
        ...
        True
    """
    parser = argparse.ArgumentParser(prog="python -m tools.house", description=__doc__.split("\n")[0])
    parser.add_argument("--package", type=Path, default=PACKAGE)
    parser.add_argument("--layers", type=Path, default=None,
                        help="the layer test whose LAYERS to read (default: <package>/../tests/test_layers.py)")
    parser.add_argument("--arrows", action="store_true", help="list every arrow")
    parser.add_argument("--inside", default=None, metavar="FOLDER",
                        help="survey one folder of the package as a house of its own (e.g. loader)")
    args = parser.parse_args(argv)
    layers_file = args.layers or args.package.resolve().parent / "tests" / "test_layers.py"
    layers: Mapping[str, int] | list[tuple[str, int]] = read_layers(layers_file) if layers_file.exists() else []
    root = args.package.resolve()
    if args.inside is None:
        print(report(survey(root, list(layers)), show_arrows=args.arrows))
    else:
        inside = root / args.inside
        print(report(survey(inside, list(layers), ".".join([root.name, *Path(args.inside).parts])),
                     show_arrows=args.arrows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
