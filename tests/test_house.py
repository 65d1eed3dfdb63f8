"""``tools/house.py``: rooms, floors, arrows, circles and arrows back up of a package's import graph."""

from __future__ import annotations

import textwrap

from tools import house


def _tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_tiny_house(tmp_path, capsys):
    pkg = tmp_path / "pkg"
    _tree(pkg, {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import go\n",
        "errors.py": "",
        "core/__init__.py": "",
        "core/a.py": "from pkg import errors\n",
        "core/deep/__init__.py": "",
        "core/deep/b.py": "from ..a import thing\n",           # relative, inside one room
        "mid/__init__.py": "",
        "mid/m.py": "import pkg.core.a\nfrom pkg.core.deep import b\n",
        "mid/n.py": "def later():\n    from pkg import side\n",  # a function-level import counts
        "side.py": "from pkg.mid import m\n",                   # side <-> mid: a circle
        "top.py": "import importlib\nimportlib.import_module('pkg.mid.m')\nimport pkg.core\n",
        "sneaky.py": "import pkg.top\n",                        # layer 1 imports layer 3
    })
    layers = [("pkg.errors", 0), ("pkg.core", 1), ("pkg.sneaky", 1), ("pkg.mid", 2), ("pkg.side", 2),
              ("pkg.top", 3)]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_layers.py").write_text(f"LAYERS = {layers!r}\n")

    h = house.survey(pkg, house.read_layers(tmp_path / "tests" / "test_layers.py"))

    # the front door (pkg/__init__.py) is no room; a package is one room with its subpackages
    assert h.rooms == ["core/", "errors", "mid/", "side", "sneaky", "top"]
    assert sorted(h.arrows) == [("core/", "errors"), ("mid/", "core/"), ("mid/", "side"), ("side", "mid/"),
                                ("sneaky", "top"), ("top", "core/"), ("top", "mid/")]
    assert h.arrows[("mid/", "core/")] == [("pkg.mid.m", "pkg.core.a"), ("pkg.mid.m", "pkg.core.deep.b")]
    assert h.circles == [["mid/", "side"]]
    # the thinner arrow of the circle (mid -> side: 1 import, side -> mid: 1; ties by name) and the layer breach
    assert h.back_up == {("mid/", "side"): "closes a circle: side imports mid/ back",
                         ("sneaky", "top"): "pkg.sneaky (layer 1) imports pkg.top (layer 3)"}
    assert h.floors == {"core/": 1, "errors": 0, "mid/": 2, "side": 3, "sneaky": 0, "top": 3}
    assert h.floor_count == 4

    assert house.main(["--package", str(pkg), "--arrows"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pkg: 6 rooms, 4 floors, 7 arrows, 1 circles, 2 arrows back up\n")
    assert "  floor 3: side, top\n" in out and "  mid/ <-> side\n" in out
    assert "  sneaky -> top: pkg.sneaky (layer 1) imports pkg.top (layer 3) (pkg.sneaky -> pkg.top)\n" in out


def test_the_heavier_arrow_of_a_circle_stays(tmp_path):
    pkg = tmp_path / "pkg"
    _tree(pkg, {"__init__.py": "", "a.py": "import pkg.b\n",
                "b/__init__.py": "", "b/x.py": "import pkg.a\n", "b/y.py": "import pkg.a\n"})
    h = house.survey(pkg, [])
    assert h.back_up == {("a", "b/"): "closes a circle: b/ imports a back"}
    assert h.floors == {"a": 0, "b/": 1}


def test_the_real_package_is_surveyed():
    h = house.survey(house.PACKAGE, house.read_layers(house.REPO / "tests" / "test_layers.py"))
    assert {"loader/", "sequences/", "errors"} <= set(h.rooms) and h.floors["errors"] == 0


def test_the_loader_is_rooms_without_a_circle():
    """``seqloader/loader/``: a face of at most about eight modules before rooms (folders) that
    import each other without a circle (issue 42: it was 41 flat rooms on 11 floors)."""
    loader = house.survey(house.PACKAGE / "loader", [], "seqloader.loader")
    assert loader.circles == [] and loader.back_up == {}, (loader.circles, loader.back_up)
    face = [r for r in loader.rooms if not r.endswith("/")]
    assert len(face) <= 8, face
    assert {"recipe/", "state/", "epoch/", "workers/", "rngs/", "tuning/", "torch_compat/"} <= set(loader.rooms)
