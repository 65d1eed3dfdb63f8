"""Tampered states: every value of a loaded state is checked before anything changes.

The issue's cases first (an epoch, a skip range or a step of ``10**30``, a malformed ``files``),
then a fuzzer: hypothesis mutates valid states (type swaps, huge and negative ints, nested junk,
missing and extra keys) of loaders with a batch-size schedule, skips, mixture weight changes and
a Parquet source, and ``load_state_dict`` must either accept the state, after which two epochs
read without an error and the same as a second loader given the same state (and, for a state
that means the same as the saved one, exactly the uninterrupted run), or raise ``ValueError`` /
``TypeError`` from ``load_state_dict`` naming a key, leaving the loader and its live iterator as
they were.
"""

from __future__ import annotations

import copy
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqloader
from seqloader import DataLoader
from seqloader.loader.state.state import KEYS, LoaderState
from seqloader.testing import assert_batches_equal, json_round_trip

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def ident(row):
    return row["id"]


@pytest.fixture(scope="module")
def parquet_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rows")
    for k in range(2):
        ids = np.arange(100 * k, 100 * k + 11, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), os.path.join(folder, f"part-{k:03d}.parquet"), row_group_size=4)
    return str(folder)


def plain():
    loader = DataLoader(list(range(23)), batch_size=4, shuffle=True, seed=3, batch_size_schedule=[(3, 2)])
    return loader, lambda it: loader.skip(indices=[5, 6], steps=(3, 4))


def mixed():
    m = seqloader.mix([list(range(40)), list(range(100, 140))], weights=[1, 1])
    loader = DataLoader(m, batch_size=4, seed=3)

    def change(it):
        loader.set_weights([1, 3], at_step=3)
        loader.set_weights([0, 1], at_step=5)
    return loader, change


def files(folder):
    loader = DataLoader(seqloader.smap(ident, seqloader.parquet(folder)), batch_size=3, shuffle=True, seed=3)
    return loader, lambda it: loader.skip(indices=[2])


def seekable():
    data = list(range(21))
    loader = DataLoader(data, batch_size=4, sampler=seqloader.BijectiveShuffleSampler(data, seed=9), seed=3)
    return loader, lambda it: loader.skip(steps=(3, 4))


KINDS = {"plain": lambda folder: plain(), "mixed": lambda folder: mixed(), "files": files,
         "seekable": lambda folder: seekable()}


def run(kind, folder, stop=3):
    """``(loader, live iterator, state after ``stop`` batches, rest of the epoch, next epoch)``: the
    uninterrupted run's, with the loader's changes made after 2 batches."""
    loader, change = KINDS[kind](folder)
    it = iter(loader)
    for k in range(stop):
        if k == 2:
            change(it)
        next(it)
    state = json_round_trip(loader.state_dict())
    return loader, it, state


def reference(kind, folder, stop=3):
    loader, it, state = run(kind, folder, stop)
    return state, list(it), list(loader)


# -- the issue's cases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind, key, value, match", [
    ("plain", "epoch", 10**30, r"'epoch' must be a non-negative int < 2\*\*63 \(got 10{30}\)"),
    ("plain", "step", 10**30, r"'step' must be a non-negative int < 2\*\*63"),
    ("plain", "position", 2**63, r"'position' must be a non-negative int < 2\*\*63"),
    ("plain", "recipe", {"skips": [[0, 0, "indices", [[0, 10**30]]]]}, r"'recipe.skips\[0\]' must be"),
    ("plain", "recipe", {"skips": [[0, 0, "indices", [[0, 2**62]]]]}, r"'recipe.skips\[0\]' skips dataset index "
                                                                      r"4611686018427387903 but the dataset has 23"),
    ("plain", "recipe", {"skips": 5}, r"'recipe.skips' must be a list"),
    ("plain", "files", {"files": 1}, r"'files' must be None or a list"),
    ("plain", "files", [{"files": 1, "fingerprint": 5}], r"'files\[0\].fingerprint' must be a str"),
    ("plain", "ahead", [10**30], r"'ahead\[0\]' must be an int >= \d+ < 2\*\*63"),
    ("plain", "ahead", [13], r"'ahead' lists 13, which is not the first position of a batch"),
    ("plain", "saved_with", {"world_size": 10**30}, r"'saved_with.world_size' must be a positive int < 2\*\*63"),
    ("mixed", "recipe", {"weights": [[3, 0, 10**30, [1, 3]]]}, r"'recipe.weights\[0\]' must be"),
    ("mixed", "recipe", {"weights": [[3, 0, 12, [1, 3, 1]]]}, r"'recipe.weights\[0\]' has 3 weights but the mixture "
                                                               r"has 2 sources"),
    ("mixed", "recipe", {"weights": [[3, 0, 12, [1, 1e-9]]]}, r"'recipe.weights\[0\]'.*weights\[1\] is too small"),
    ("mixed", "recipe", {"weights": [[5, 0, 12, [1, 3]], [3, 0, 20, [1, 1]]]},
     r"'recipe.weights' must be changes in increasing order of step"),
    ("mixed", "recipe", {"weights": [[3, 0, 1000, [1, 3]]]}, r"'recipe.weights': the mixture of epoch 0 cannot be built.*at=1000 "
                                                             r"is past the end"),
    ("files", "files", [{"files": 2, "fingerprint": "0123456789abcdef"}], r"'files\[0\]' does not match source 0 of "
                                                                          r"1 in the pipeline, parquet"),
    ("seekable", "sampler", {"seed": "9"}, r"'sampler' cannot be loaded into BijectiveShuffleSampler\(len=21, "
                                           r"seed=9\) \(TypeError: .*seed must be an int"),
    ("seekable", "sampler", 5, r"'sampler' cannot be loaded into BijectiveShuffleSampler\(len=21, seed=9\) "
                               r"\(TypeError: 'int' object is not subscriptable\)"),
])
def test_the_issues_tampered_values_name_their_key_and_change_nothing(parquet_folder, kind, key, value, match):
    state, rest, nxt = reference(kind, parquet_folder)
    loader, it, _ = run(kind, parquet_folder)
    before = loader.state_dict()
    with pytest.raises(ValueError, match=match):
        loader.load_state_dict({**state, key: value})
    assert loader.state_dict() == before
    assert_batches_equal(list(it), rest, "the live iterator after the refused load")
    assert_batches_equal(list(loader), nxt, "the next epoch after the refused load")


def test_a_step_of_10_30_does_not_change_the_batch_size_silently():
    state, rest, _ = reference("plain", None)
    loader, _, _ = run("plain", None, stop=0)
    with pytest.raises(ValueError, match=r"'step' must be a non-negative int < 2\*\*63"):
        loader.load_state_dict({**state, "step": 10**30})
    with pytest.raises(ValueError, match=r"'seed' must be an int in \[0, 2\*\*64\) \(got an int of 16610 bits\)"):
        loader.load_state_dict({**state, "seed": 2**16609})  # too long for str(): named, not printed
    loader.load_state_dict(state)
    assert_batches_equal(list(loader), rest)


# -- the fuzzer -----------------------------------------------------------------------------------------


def paths(value, prefix=()):
    """Every path into ``value`` (dict keys and list indices), itself included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, prefix + (i,))
    return out


def junk():
    leaves = st.one_of(
        st.none(), st.booleans(), st.integers(-2**70, 2**70),
        st.sampled_from([0, 1, -1, 2, 3, 7, 12, 2**31, 2**62, 2**63 - 1, 2**63, 2**64, 10**30, -10**30, -2**63 - 1]),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
        st.sampled_from(["indices", "positions", "seqloader.DataLoader", "0123456789abcdef"]))
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.sampled_from(["files", "fingerprint", "chunk",
                                                                                         "weights", "skips", "workers",
                                                                                         "world_size", "x"]),
                                                                        inner, max_size=3)),
                        max_leaves=8)


def mutate(state, data):
    """A copy of ``state`` with one value replaced (or a key removed, or a key added)."""
    out = copy.deepcopy(state)
    where = data.draw(st.sampled_from([p for p in paths(out) if p]), label="path")
    parent = out
    for k in where[:-1]:
        parent = parent[k]
    how = data.draw(st.sampled_from(["replace", "replace", "replace", "remove", "add", "wrap"]), label="how")
    last = where[-1]
    if how == "remove" and isinstance(parent, dict):
        del parent[last]
    elif how == "remove":
        parent.pop(last)
    elif how == "add" and isinstance(parent[last], (dict, list)):
        if isinstance(parent[last], dict):
            parent[last][data.draw(st.sampled_from(["x", "files", "epoch"]), label="key")] = data.draw(junk())
        else:
            parent[last].append(data.draw(junk(), label="item"))
    elif how == "wrap":
        parent[last] = [parent[last]]
    else:
        parent[last] = data.draw(junk(), label="value")
    return out, where


NAMED = re.compile(r"\b(" + "|".join(map(re.escape, KEYS)) + r")\b")


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(list(KINDS)), data=st.data())
def test_a_mutated_state_resumes_or_is_refused_naming_a_key(parquet_folder, kind, data):
    state, rest, nxt = reference(kind, parquet_folder)
    mutated, where = mutate(state, data)
    loader, it, _ = run(kind, parquet_folder)
    before = loader.state_dict()
    try:
        loader.load_state_dict(mutated)
    except (ValueError, TypeError) as e:
        message = str(e)
        assert message.startswith("load_state_dict: "), f"{where}: not our check: {type(e).__name__}: {message}"
        assert NAMED.search(message), f"{where}: names no key: {message}"
        assert loader.state_dict() == before, f"{where}: the loader changed"
        assert_batches_equal(list(it), rest, f"{where}: the live iterator after the refused load")
        return
    # accepted: it reads, deterministically, and what means the same as the saved state reads the same
    got = [list(loader), list(loader)]
    again = KINDS[kind](parquet_folder)[0]
    again.load_state_dict(json_round_trip(mutated))
    assert_batches_equal(list(again), got[0], f"{where}: a second loader given the same state")
    if LoaderState.from_dict(mutated) == LoaderState.from_dict(state):
        assert_batches_equal(got[0], rest, f"{where}: the rest of the epoch")
        assert_batches_equal(got[1], nxt, f"{where}: the next epoch")
