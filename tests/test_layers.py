"""The layering rule, checked on the real tree: imports only point down, no cycles, a torch-free core.

``LAYERS`` assigns every module of ``seqloader`` to a layer (``docs/design.md`` has the same
table). A module may import modules of its own layer or below, never above; the import graph
between seqloader's modules has no cycle; the core (L0 sequences and errors, L1 rng and the
``orders`` wing) imports neither torch nor multiprocessing, and importing the public sequence ops
and the orders wing in a fresh interpreter leaves torch out of ``sys.modules`` and changes no
global state (such as how exceptions pickle).
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

#: the package this run imports: the checkout's, or the installed wheel's (``python -m tools.test_installed``)
ROOT = pathlib.Path(importlib.util.find_spec("seqloader").origin).resolve().parent  # type: ignore[union-attr,arg-type]

#: (module prefix, layer); the longest matching prefix wins. L0 and L1 form one torch-free core:
#: the sequence ops that need randomness (shuffle, rng_map) call rng and the orders wing.
LAYERS = [
    ("seqloader._version", 1),
    ("seqloader.errors", 1),
    ("seqloader.sequences", 1),
    ("seqloader.sources", 1),
    ("seqloader.packing", 1),
    ("seqloader.rng", 1),
    ("seqloader.orders", 1),
    ("seqloader.threads", 1),
    ("seqloader.sequences.blocks", 1),
    ("seqloader.prefetcher", 2),
    ("seqloader.loader", 3),
    ("seqloader.sampler", 3),
    ("seqloader.integrations", 4),
    ("seqloader.testing", 4),
    ("seqloader.demo", 4),
]
#: Layer names, for messages.
NAMES = {1: "L0/L1 core", 2: "L2 prefetcher", 3: "L3 loader", 4: "L4 integrations/tools"}
#: Third-party modules the core must not import.
NOT_IN_CORE = {"torch", "multiprocessing"}
#: Within the core, rng and the orders wing (permutations, block permutations, the loader's orders,
#: plans, steps and holes: pure index arithmetic) sit below the sequence ops.
BELOW_SEQUENCES = ("seqloader.rng", "seqloader.orders", "seqloader.errors", "seqloader.threads")


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py")) if module_name(p) != "seqloader"}


def layer_of(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module named by an import statement or an ``import_module``/``__import__`` call."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names
                         if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value))
    return names


def seqloader_imports(path: pathlib.Path) -> set[str]:
    """The seqloader modules (known to ``MODULES``) that ``path`` imports."""
    out = set()
    for name in imported_modules(path):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if layer_of(m) is None]
    assert {"seqloader.sequences.base", "seqloader.loader.dataloader", "seqloader.prefetcher.processes.worker"} <= set(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    mine = layer_of(module)
    up = sorted(m for m in seqloader_imports(MODULES[module]) if layer_of(m) > mine)
    assert not up, f"{module} ({NAMES[mine]}) imports {[(m, NAMES[layer_of(m)]) for m in up]}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == 1))
def test_the_core_imports_neither_torch_nor_multiprocessing(module):
    bad = {m for m in imported_modules(MODULES[module]) if m.split(".")[0] in NOT_IN_CORE}
    assert not bad, f"{module} imports {sorted(bad)}; the core must not"
    if module.startswith(BELOW_SEQUENCES):
        assert not [m for m in seqloader_imports(MODULES[module]) if m.startswith("seqloader.sequences")]


def test_no_import_cycles():
    graph = {m: seqloader_imports(p) - {m} for m, p in MODULES.items()}
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    graph = {m: {d for d in deps if not (d.startswith(m + "."))} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_sequence_ops_in_a_fresh_interpreter_leave_torch_unimported_and_globals_alone():
    code = ("import pickle, sys, seqloader\n"
            "class NeedsTwoArgs(Exception):\n"
            "    def __init__(self, a, b): super().__init__(f'{a}+{b}')\n"
            "from seqloader import LazySequence, smap, rng_map, gather, shuffle, concatenate, repeat, batch, shard\n"
            "import seqloader.rng, seqloader.orders.permutation, seqloader.orders.block_quality\n"
            "from seqloader.orders import holes, orders, plans, steps\n"
            "assert plans.OrderPlan is not None and holes and orders.DERIVATION and steps.BatchSizes\n"
            "s = batch(shuffle(rng_map(lambda x, r: x, smap(int, concatenate([range(5), range(5)])), seed=1), seed=2), 3)\n"
            "assert len(s) == 4 and s[0]\n"
            "from seqloader import pack, keep\n"
            "p = pack(smap(lambda i: [1] * (i % 5), range(9)), 4, cache=False)\n"
            "assert len(keep(lambda x: x > 2, range(6), cache=False)) == 3 and len(p[0]['tokens']) == 4\n"
            "try:\n"
            "    pickle.loads(pickle.dumps(NeedsTwoArgs(1, 2)))\n"
            "    sys.exit('exception pickling was patched (seqtools imports tblib.pickling_support.install())')\n"
            "except TypeError:\n"
            "    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'multiprocessing')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_top_level_names_resolve_lazily_and_unknown_names_raise():
    import seqloader

    for name in seqloader.__all__:
        assert getattr(seqloader, name) is not None
    assert callable(seqloader.prefetch) and seqloader.testing.run_distributed
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        seqloader.nope  # noqa: B018


def test_the_checker_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.nn\nfrom multiprocessing import shared_memory\n__import__('torch')\n"
                     "from seqloader.loader.state import state\n")
    assert imported_modules(probe) == {"torch.nn", "multiprocessing", "torch", "seqloader.loader.state",
                                       "seqloader.loader.state.state"}
    assert layer_of("seqloader.loader.state.state") == 3 and layer_of("seqloader.sequences.mix") == 1
    assert layer_of("seqloader.orders.plans") == 1 and layer_of("seqloader.loader.samplers.shuffle") == 3


def test_ray_is_imported_only_by_the_ray_executor():
    """``ray`` is an optional extra: importing seqloader, its options object and the thread backend
    never imports it (nor torch)."""
    code = ("import sys, seqloader\n"
            "from seqloader import RayWorkers, prefetch\n"
            "with prefetch(range(4), 2, method='thread') as p:\n"
            "    assert list(p) == [0, 1, 2, 3]\n"
            "assert RayWorkers(num_cpus=2).needs() == {'CPU': 2}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
