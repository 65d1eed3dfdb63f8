"""The ops seqloader shares with seqtools read the same as seqtools 1.4.1 on small inputs, and the
deliberate differences listed in docs/migrating.md ("Coming from seqtools") are what they say.

seqtools is not a dependency (``pip install seqtools`` to run these). Importing it calls
``tblib.pickling_support.install()``, which changes how every exception pickles in that process
(docs/design.md), so seqtools is only ever imported in a subprocess: ``main()`` below runs there,
compares each case and prints the verdicts as JSON; this process only reads them (it checks that
seqtools is installed with ``importlib.util.find_spec``, which does not import it).
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

HERE = Path(__file__).resolve().parent


def norm(x: Any) -> Any:
    """Items as plain Python values: nested sequences (views, arrays, seqtools' own) as lists."""
    if isinstance(x, (str, bytes, int, float, bool)) or x is None:
        return x
    if isinstance(x, tuple):
        return tuple(norm(y) for y in x)
    if hasattr(x, "__len__") and hasattr(x, "__getitem__"):
        return [norm(x[i]) for i in range(len(x))]
    return x


def reads(seq: Any, slices: tuple[slice, ...] = (slice(None, None, -1), slice(1, -1, 2))) -> dict[str, Any]:
    """What seqtools' own tests check: len, every index in [-n, n), iteration, slices."""
    n = len(seq)
    return {"len": n, "index": [norm(seq[i]) for i in range(-n, n)], "iter": [norm(x) for x in seq],
            "slices": [[norm(x) for x in seq[s]] for s in slices]}


def rng_lists(seed: int, count: int, max_len: int) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randint(0, 1000) for _ in range(r.randint(0, max_len))] for _ in range(count)]


def pair_sum(a: int, b: int) -> int:
    return a + b


def double(x: int) -> int:
    return 2 * x


# -- the cases: each returns {label: (seqtools' reads, seqloader's reads)} -----------------------------

Case = Callable[[Any, Any], dict[str, tuple[Any, Any]]]


def case_add_cache(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    data = list(range(20))
    return {f"size={k}": (reads(st.add_cache(st.smap(double, data), k)), reads(sl.add_cache(sl.smap(double, data), k)))
            for k in (1, 3)}


def case_batch_pad(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    out = {}
    for n, k in [(7, 3), (137, 5), (1, 4), (0, 3)]:  # k does not divide n (see the differences below)
        data = list(range(n))
        out[f"n={n},k={k}"] = (reads(st.batch(data, k, pad=-1)), reads(sl.batch(data, k, pad=-1)))
        out[f"n={n},k={k},collate"] = (reads(st.batch(data, k, pad=0, collate_fn=list)),
                                       reads(sl.batch(data, k, pad=0, collate_fn=list)))
    return out


def case_unbatch(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    out = {}
    for n, k in [(137, 5), (10, 5), (7, 3), (1, 1)]:
        batches = [list(range(i, min(i + k, n))) for i in range(0, n, k)]
        for last in ((None, 0) if n % k == 0 else (n % k,)):
            out[f"n={n},k={k},last={last}"] = (reads(st.unbatch(batches, k, last)), reads(sl.unbatch(batches, k, last)))
    return out


def case_split(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    arr = list(range(125))
    out = {"cuts=4": (reads(st.split(arr, 4)), reads(sl.split(arr, 4))),
           "cuts=0": (reads(st.split(arr, 0)), reads(sl.split(arr, 0))),
           "boundaries": (reads(st.split(arr, list(range(25, 125, 25)))), reads(sl.split(arr, list(range(25, 125, 25))))),
           "pairs": (reads(st.split(arr, [(i, i + 25) for i in range(0, 125, 25)])),
                     reads(sl.split(arr, [(i, i + 25) for i in range(0, 125, 25)])))}
    r = random.Random(1)
    for t in range(5):
        bounds = sorted(r.randint(0, 30) for _ in range(r.randint(1, 5)))
        pairs = [(a, r.randint(a, 30)) for a in (r.randint(0, 29) for _ in range(r.randint(1, 5)))]
        data = list(range(100, 130))
        out[f"random boundaries {bounds}"] = (reads(st.split(data, bounds)), reads(sl.split(data, bounds)))
        out[f"random pairs {pairs}"] = (reads(st.split(data, pairs)), reads(sl.split(data, pairs)))
    return out


def case_interleave(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    out = {"docs": (reads(st.interleave([1, 2, 3, 4, 5], ["a", "b", "c"], [0.1, 0.2, 0.3, 0.4])),
                    reads(sl.interleave([1, 2, 3, 4, 5], ["a", "b", "c"], [0.1, 0.2, 0.3, 0.4])))}
    for seed in range(8):
        parts = rng_lists(seed, 1 + seed % 4, 9)
        out[f"random {seed}"] = (reads(st.interleave(*parts)), reads(sl.interleave(*parts)))
    return out


def case_case_and_switch(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    out = {}
    for seed in range(5):
        r = random.Random(seed)
        values = [[r.randint(0, 1000) for _ in range(30)] for _ in range(1 + seed)]
        selector = [r.randint(0, seed) for _ in range(30)]
        cond = [r.random() > 0.5 for _ in range(30)]
        out[f"case {seed}"] = (reads(st.case(selector, *values)), reads(sl.case(selector, *values)))
        out[f"switch {seed}"] = (reads(st.switch(cond, values[0], values[-1])), reads(sl.switch(cond, values[0], values[-1])))
    return out


def case_cycle_and_repeat(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    arr = [random.Random(0).randint(0, 1000) for _ in range(100)]
    small = ["a", "b", "c"]
    return {
        "cycle(arr, 250)": (reads(st.cycle(arr, 250), (slice(150, 105, -2),)), reads(sl.cycle(arr, 250), (slice(150, 105, -2),))),
        "cycle(small, 7)": (reads(st.cycle(small, 7)), reads(sl.cycle(small, 7))),
        "cycle(small, 2)": (reads(st.cycle(small, 2)), reads(sl.cycle(small, 2))),
        # the port of seqtools.repeat(value, times) and of seqtools.cycle(seq, k * len(seq))
        "repeat(value) -> repeat([value])": (reads(st.repeat([1, 2], 4)), reads(sl.repeat([[1, 2]], 4))),
        "cycle(seq, 3 * len) -> repeat(seq, 3)": (reads(st.cycle(small, 9)), reads(sl.repeat(small, 3))),
    }


def case_collate_and_starmap(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    arrs = [[random.Random(k).random() for _ in range(100)] for k in range(3)]
    pairs = [(i, 2 * i) for i in range(12)]
    return {"collate": (reads(st.collate(arrs)), reads(sl.collate(arrs))),
            "starmap": (reads(st.starmap(pair_sum, pairs)), reads(sl.starmap(pair_sum, pairs)))}


def case_older_names(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    """The names seqloader had before: gather, smap, concatenate, batch."""
    r = random.Random(2)
    arr = [r.random() for _ in range(100)]
    idx = [r.randint(-100, 99) for _ in range(200)]
    parts = rng_lists(4, 5, 12)
    out = {"gather": (reads(st.gather(arr, idx), (slice(-15, -25, -2),)), reads(sl.gather(arr, idx), (slice(-15, -25, -2),))),
           "smap": (reads(st.smap(pair_sum, arr, arr[::-1])), reads(sl.smap(pair_sum, arr, arr[::-1]))),
           "concatenate": (reads(st.concatenate(parts)), reads(sl.concatenate(parts)))}
    for k, drop in [(5, True), (5, False), (1, False), (200, False)]:
        out[f"batch({k}, {drop})"] = (reads(st.batch(list(range(137)), k, drop)), reads(sl.batch(list(range(137)), k, drop)))
        out[f"batch({k}, {drop}, tuple)"] = (reads(st.batch(arr, k, drop, collate_fn=tuple)),
                                             reads(sl.batch(arr, k, drop, collate_fn=tuple)))
    return out


def case_pipeline(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    """A pipeline of the shared names: gather -> smap -> split -> interleave -> batch(pad) -> unbatch."""
    def build(m: Any) -> Any:
        data = list(range(40))
        g = m.gather(data, [(7 * i) % 40 for i in range(33)])
        s = m.smap(double, g)
        firsts = m.smap(norm, m.split(s, [5, 11, 30]))
        inter = m.interleave(s[:6], m.smap(len, firsts))
        return m.unbatch(m.add_cache(m.batch(inter, 4, pad=-1, collate_fn=list)), 4)
    return {"pipeline": (reads(build(st)), reads(build(sl)))}


CASES: dict[str, Case] = {name[len("case_"):]: f for name, f in globals().items() if name.startswith("case_")}


# -- the deliberate differences (docs/migrating.md); each returns (seqtools' value, ours) -------------

def _raises(f: Callable[[], Any]) -> str:
    try:
        f()
    except Exception as exc:  # noqa: BLE001 - the point is which error, if any
        return type(exc).__name__
    return "no error"


def differences(st: Any, sl: Any) -> dict[str, tuple[Any, Any]]:
    return {
        "repeat's meaning": (norm(list(st.repeat([1, 2], 3))), norm(list(sl.repeat([1, 2], 3)))),
        "batch pads a full last batch": (norm(st.batch(list(range(6)), 3, pad=0)[-1]), sl.batch(list(range(6)), 3, pad=0)[-1]),
        "unbatch of no batch": (len(st.unbatch([], 3, 2)), len(sl.unbatch([], 3, 2))),
        "split clips edges": (norm(st.split(list(range(5)), [(3, 9)])[0]), _raises(lambda: sl.split(list(range(5)), [(3, 9)]))),
        "split clips a start to n - 1": (norm(list(st.split(list(range(3)), [3, 3]))), norm(list(sl.split(list(range(3)), [3, 3])))),
        "case with a negative choice": (st.case([0, -1], "ab", "AB")[1], _raises(lambda: sl.case([0, -1], "ab", "AB")[1])),
        "smap errors": (_raises(lambda: st.smap(double, [None])[0]), _raises(lambda: sl.smap(double, [None])[0])),
        "cycle without a limit": (st.cycle([1, 2])[5], _raises(lambda: sl.cycle([1, 2]))),
        "pad with drop_last": (norm(list(st.batch(list(range(5)), 2, drop_last=True, pad=0))),
                               _raises(lambda: sl.batch(list(range(5)), 2, drop_last=True, pad=0))),
    }


#: What docs/migrating.md says each difference is: (seqtools, seqloader).
DIFFERENCES = {
    "repeat's meaning": ([[1, 2], [1, 2], [1, 2]], [1, 2, 1, 2, 1, 2]),
    "batch pads a full last batch": ([3, 4, 5, 0, 0, 0], [3, 4, 5]),
    "unbatch of no batch": (2, 0),
    "split clips edges": ([3, 4], "IndexError"),
    "split clips a start to n - 1": ([[0, 1, 2], [2], []], [[0, 1, 2], [], []]),
    "case with a negative choice": ("B", "IndexError"),
    "smap errors": ("EvaluationError", "TypeError"),
    "cycle without a limit": (2, "TypeError"),
    "pad with drop_last": ([[0, 1], [2, 3, 0]], "ValueError"),  # seqtools warns "ignored", then pads a full batch
}


def main() -> None:  # pragma: no cover - runs in the subprocess
    import seqtools as st  # only here: it patches exception pickling process-wide

    import seqloader as sl

    verdicts: dict[str, Any] = {}
    for name, case in CASES.items():
        try:
            verdicts[name] = [f"{label}: seqtools {theirs!r}\n    seqloader {ours!r}"
                              for label, (theirs, ours) in case(st, sl).items() if theirs != ours]
        except Exception as exc:  # noqa: BLE001 - reported as this case's failure
            verdicts[name] = [f"the case raised {exc!r}"]
    verdicts["differences"] = {k: list(v) for k, v in differences(st, sl).items()}
    verdicts["seqtools_version"] = getattr(st, "__version__", None) or importlib.metadata.version("seqtools")
    print(json.dumps(verdicts, default=repr))


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Any]:
    if importlib.util.find_spec("seqtools") is None:
        pytest.skip("seqtools is not installed (pip install seqtools); it is not a dependency of seqloader")
    code = (f"import importlib.metadata, sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; "
            "import test_seqtools_parity; test_seqtools_parity.main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110,
                          cwd=HERE.parents[1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_reads_agree_with_seqtools(verdicts, name):
    assert verdicts[name] == [], "\n".join(verdicts[name])


@pytest.mark.parametrize("name", sorted(DIFFERENCES))
def test_documented_differences_are_as_documented(verdicts, name):
    theirs, ours = verdicts["differences"][name]
    assert (theirs, ours) == tuple(DIFFERENCES[name]), f"{name}: seqtools {theirs!r}, seqloader {ours!r}"


def test_this_process_never_imported_seqtools(verdicts):
    assert verdicts["seqtools_version"].startswith("1.")
    assert "seqtools" not in sys.modules
