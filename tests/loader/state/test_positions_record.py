"""A state knows what its positions mean (issue 36): another recipe is refused, a fix of values resumes.

Each case saves a state mid-epoch over one pipeline and loads it into a loader over another:

* a stage whose parameters decide which sample a position is (``keep``'s predicate, ``pack``'s
  method and window, ``shuffle``'s seed, ``shard``, ``mix``'s weights, ``batch``, slices,
  ``concatenate``'s order, ``repeat``, ``cycle``, ``split``, ``interleave``, ``block_shuffle``)
  differs: ``ValueError`` naming the stage and the parameter, and the override
  (``check_files=False``), which then loads;
* only values differ (``smap``'s or ``rng_map``'s function, ``pack``'s ``pad_id`` or ``dtype``): it
  resumes, batch by batch equal (``torch.equal``) to an uninterrupted run of the new pipeline.

The record is small (< 1 KB on the docs' pipelines), JSON, and stable (hypothesis).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import seqloader
from seqloader import DataLoader
from seqloader.loader.state.positions import BUDGET, check_positions, record_positions
from seqloader.sequences.base import IndexMap, LazySequence
from seqloader.sequences.describe import Stage, describe_stage, is_source, walk
from seqloader.testing import assert_batches_equal, json_round_trip

N = 40


def even(x):
    return x % 2 == 0


def odd(x):
    return x % 2 == 1


def plus_one(x):
    return x + 1


def plus_two(x):
    return x + 2


def noise_a(x, rng):
    return x * 100 + int(rng.integers(0, 10))


def noise_b(x, rng):
    return x * 100 + int(rng.integers(0, 99))


LENGTHS = [3, 7, 5, 9, 2, 11, 4, 6, 8, 1, 10, 3, 5, 7, 2, 9] * 3


def docs():
    return [np.arange(n, dtype=np.int64) + 100 * i for i, n in enumerate(LENGTHS)]


def packed(**kw):
    return seqloader.pack(docs(), 16, cache=False, **kw)


def loader_of(dataset, num_workers=0, batch_size=4):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, seed=7, num_workers=num_workers)


def saved_after(dataset, batches=2):
    loader = loader_of(dataset)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json_round_trip(loader.state_dict())


def xs(n=N):
    return list(range(n))


#: name -> (saved pipeline, loaded pipeline, the refusal's match: the stage and the parameter)
REFUSED = {
    "keep": (lambda: seqloader.keep(even, xs(), cache=False), lambda: seqloader.keep(odd, xs(), cache=False),
             r"stage 0 of 1 \(keep\): 'predicate' is '[\w.]*even' in the state_dict but '[\w.]*odd'"),
    "keep_mask": (lambda: seqloader.keep(np.arange(N) % 2 == 0, xs()), lambda: seqloader.keep(np.arange(N) % 2 == 1, xs()),
                  r"stage 0 of 1 \(keep\): 'kept' is '\w+' in the state_dict but '\w+'"),
    "pack_method": (lambda: packed(), lambda: packed(method="first_fit"),
                    r"stage 0 of 1 \(pack\): 'method' is 'best_fit' in the state_dict but 'first_fit'"),
    "pack_window": (lambda: packed(window=16), lambda: packed(window=32),
                    r"stage 0 of 1 \(pack\): 'window' is 16 in the state_dict but 32"),
    "shuffle": (lambda: seqloader.shuffle(xs(), seed=1), lambda: seqloader.shuffle(xs(), seed=2),
                r"stage 0 of 1 \(shuffle\): 'seed' is 1 in the state_dict but 2"),
    "shard": (lambda: seqloader.shard(xs(80), 0, 2), lambda: seqloader.shard(xs(80), 1, 2),
              r"stage 0 of 1 \(shard\): 'rank' is 0 in the state_dict but 1"),
    "mix": (lambda: seqloader.mix([xs(), xs(30)], weights=[1, 1], length=40),
            lambda: seqloader.mix([xs(), xs(30)], weights=[3, 1], length=40),
            r"stage 0 of 1 \(mix\): 'counts' is \[1, 1\] in the state_dict but \[3, 1\]"),
    "batch": (lambda: seqloader.batch(xs(80), 2), lambda: seqloader.batch(xs(40), 1),
              r"stage 0 of 1 \(batch\): 'k' is 2 in the state_dict but 1"),
    "concatenate": (lambda: seqloader.concatenate([xs(10), xs(30)]), lambda: seqloader.concatenate([xs(30), xs(10)]),
                    r"stage 0 of 1 \(concatenate\): 'lengths' is \[10, 30\] in the state_dict but \[30, 10\]"),
    "slice": (lambda: seqloader.shuffle(xs(50), seed=1)[2:42], lambda: seqloader.shuffle(xs(50), seed=1)[3:43],
              r"stage 0 of 2 \(slice\): 'start' is 2 in the state_dict but 3"),
    "repeat": (lambda: seqloader.repeat(xs(20), 2), lambda: seqloader.repeat(xs(10), 4),
               r"stage 0 of 1 \(repeat\): 'times' is 2 in the state_dict but 4"),
    "repeat_nested": (lambda: seqloader.repeat(xs(20), 2), lambda: seqloader.repeat(seqloader.repeat(xs(20), 1), 2),
                      r"1 stages in the state_dict but 2 in this loader's dataset; stage 1 \(repeat\)"),
    "cycle": (lambda: seqloader.cycle(xs(30), limit=40), lambda: seqloader.cycle(xs(20), limit=40),
              r"stage 0 of 1 \(cycle\): 'of' is 30 in the state_dict but 20"),
    "split": (lambda: seqloader.split(xs(80), [[2 * k, 2 * k + 2] for k in range(40)]),
              lambda: seqloader.split(xs(80), [[2 * k + 1, 2 * k + 3] for k in range(39)] + [[0, 2]]),
              r"stage 0 of 1 \(split\): 'edges' is '\w+' in the state_dict but '\w+'"),
    "interleave": (lambda: seqloader.interleave(xs(10), xs(30)), lambda: seqloader.interleave(xs(30), xs(10)),
                   r"stage 0 of 1 \(interleave\): 'lengths' is \[10, 30\] in the state_dict but \[30, 10\]"),
    "block_shuffle": (lambda: seqloader.block_shuffle(xs(), [10, 20, 30, 40], window=2, seed=1),
                      lambda: seqloader.block_shuffle(xs(), [10, 20, 30, 40], window=2, seed=2),
                      r"stage 0 of 1 \(block_shuffle\): 'seed' is 1 in the state_dict but 2"),
    "smap_over_shuffle": (lambda: seqloader.smap(plus_one, seqloader.shuffle(xs(), seed=1)),
                          lambda: seqloader.smap(plus_two, seqloader.shuffle(xs(), seed=2)),
                          r"stage 0 of 1 \(shuffle\): 'seed' is 1 in the state_dict but 2"),
    "subset": (lambda: torch.utils.data.Subset(xs(80), list(range(0, 80, 2))),
               lambda: torch.utils.data.Subset(xs(80), list(range(1, 80, 2))),
               r"stage 0 of 1 \(Subset\): 'indices' is '#\w+' in the state_dict but '#\w+'"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_another_recipe_is_refused_naming_the_stage_and_the_parameter_and_the_override_loads(name):
    saved_pipeline, other_pipeline, match = REFUSED[name]
    state = saved_after(saved_pipeline())
    other = loader_of(other_pipeline())
    before = other.state_dict()
    with pytest.raises(ValueError, match=match) as refused:
        other.load_state_dict(state)
    message = str(refused.value)
    if "'positions'" in message:
        assert message.startswith("load_state_dict: 'positions' differ: ")
    assert "load_state_dict(state_dict, check_files=False)" in message
    assert other.state_dict() == before  # untouched
    if "'dataset_len'" not in message:
        other.load_state_dict(state, check_files=False)  # at the user's word
        assert other.state_dict()["position"] == 8


def test_keep_even_then_odd_of_the_same_length_reads_other_samples_only_with_the_override():
    state = saved_after(seqloader.keep(even, xs(), cache=False))
    forced = loader_of(seqloader.keep(odd, xs(), cache=False))
    forced.load_state_dict(state, check_files=False)
    assert all(int(x) % 2 == 1 for b in forced for x in b)  # what the check prevents by default


def test_pack_method_first_fit_puts_other_documents_at_the_same_item():
    a, b = packed(), packed(method="first_fit")
    assert len(a) == len(b) and any(not np.array_equal(a[j]["tokens"], b[j]["tokens"]) for j in range(len(a)))


def resumes_exactly(saved_pipeline, loaded_pipeline, num_workers=0):
    """A state of ``saved_pipeline`` after 2 batches resumes ``loaded_pipeline`` with the batches an
    uninterrupted run of ``loaded_pipeline`` yields after its 2nd batch, and its next epoch."""
    state = saved_after(saved_pipeline())
    reference = loader_of(loaded_pipeline(), num_workers)
    epoch0, epoch1 = list(reference), list(reference)
    resumed = loader_of(loaded_pipeline(), num_workers)
    resumed.load_state_dict(state)
    assert_batches_equal(list(resumed), epoch0[2:], "the rest of epoch 0")
    assert_batches_equal(list(resumed), epoch1, "epoch 1")


#: name -> (saved pipeline, loaded pipeline): only values differ
RESUMED = {
    "smap": (lambda: seqloader.smap(plus_one, seqloader.shuffle(xs(), seed=1)),
             lambda: seqloader.smap(plus_two, seqloader.shuffle(xs(), seed=1))),
    "rng_map": (lambda: seqloader.rng_map(noise_a, xs(), seed=1), lambda: seqloader.rng_map(noise_b, xs(), seed=1)),
    "rng_map_seed": (lambda: seqloader.rng_map(noise_a, xs(), seed=1), lambda: seqloader.rng_map(noise_a, xs(), seed=2)),
    "pack_pad_id": (lambda: packed(), lambda: packed(pad_id=-1)),
    "pack_dtype": (lambda: packed(), lambda: packed(dtype=np.int32)),
    "keep_under_smap": (lambda: seqloader.smap(plus_one, seqloader.keep(even, xs(), cache=False)),
                        lambda: seqloader.smap(plus_two, seqloader.keep(even, xs(), cache=False))),
}


@pytest.mark.parametrize("name", list(RESUMED))
def test_a_change_of_values_only_resumes_exactly(name):
    resumes_exactly(*RESUMED[name])


@pytest.mark.mp
def test_a_change_of_values_only_resumes_exactly_on_workers():
    resumes_exactly(*RESUMED["pack_pad_id"], num_workers=2)


def test_a_keep_predicate_that_keeps_other_positions_under_its_old_name_is_refused_by_the_kept_digest():
    def make(modulus):
        def kept(x):
            return x % modulus == 0
        return seqloader.keep(kept, xs(), cache=False)

    state = saved_after(make(2), batches=1)
    with pytest.raises(ValueError, match=r"\(keep\): 'kept' is '\w+' in the state_dict but '\w+'"):
        loader_of(make(3)).load_state_dict(state)


# -- the record ------------------------------------------------------------------------------------------

def test_the_record_is_json_and_small_and_names_no_value():
    r = record_positions(seqloader.smap(plus_one, seqloader.shuffle(seqloader.keep(even, xs(), cache=False), seed=3)))
    assert json_round_trip(r) == r and len(json.dumps(r)) < 300
    assert [e.split("{")[0] for e in r["stages"]] == ["shuffle", "keep"]  # smap: values only, not recorded
    assert r["stages"][0] == 'shuffle{"seed":3}'
    assert "plus_one" not in json.dumps(r)


def test_adding_or_removing_a_value_only_stage_still_resumes():
    """A new augmentation wrapped around a pipeline (or one taken off) moves no position."""
    base = lambda: seqloader.shuffle(seqloader.keep(even, xs(), cache=False), seed=3)  # noqa: E731
    saved = record_positions(base())
    for wrapped in (seqloader.smap(plus_one, base()), seqloader.rng_map(lambda x, g: x, base(), seed=1),
                    seqloader.add_cache(base(), 4), seqloader.smap(plus_two, seqloader.smap(plus_one, base()))):
        check_positions(saved, wrapped)
        check_positions(record_positions(wrapped), base())


def test_a_long_pipeline_keeps_its_record_small_and_still_names_the_stage():
    def deep(seed):
        seq = xs(2000)
        for k in range(60):
            seq = seqloader.shuffle(seq, seed=seed if k == 30 else k)
        return seq

    r = record_positions(deep(1))
    assert len(json.dumps(r)) < 1024 and r["chunk"] == 3 and len(r["stages"]) == 20
    with pytest.raises(ValueError, match=r"stages 27..29 \(shuffle..shuffle\): its parameters differ"):
        check_positions(r, deep(2))
    check_positions(r, deep(1))
    check_positions(json_round_trip(r), deep(1))
    short = record_positions(seqloader.mix([xs(4)] * 12, weights=[1] * 12, seed=1))  # one stage digested
    assert short == json_round_trip(short)


def test_a_long_parameter_is_a_digest():
    r = record_positions(seqloader.mix([xs(10)] * 50, weights=list(range(1, 51))))
    assert json.loads(r["stages"][0][len("mix"):])["counts"].startswith("#")
    assert len(json.dumps(r)) < BUDGET + 200


def test_a_v4_state_has_no_record_and_loads_without_that_check():
    state = saved_after(seqloader.keep(even, xs(), cache=False))
    v4 = {k: v for k, v in state.items() if k != "positions"}
    v4["version"] = 4
    loader = loader_of(seqloader.keep(odd, xs(), cache=False))
    loader.load_state_dict(v4)  # no record: the recipe is taken on the user's word
    assert loader.state_dict()["positions"] == record_positions(seqloader.keep(odd, xs(), cache=False))


@pytest.mark.parametrize("bad", [{"digest": 3, "stages": []}, {"digest": "ab"}, {"digest": "ab", "stages": [["x"]]},
                                 [1], {"digest": "ab", "stages": [1]}, {"digest": "ab", "stages": [], "chunk": 0}])
def test_a_malformed_record_is_refused_naming_the_key(bad):
    state = saved_after(xs())
    with pytest.raises(ValueError, match=r"'positions(\.\w+)?(\[0\])?' must be"):
        loader_of(xs()).load_state_dict({**state, "positions": bad})


# -- one protocol, one walk ------------------------------------------------------------------------------

def _op_classes():
    import importlib
    import pkgutil

    import seqloader.packing
    import seqloader.sequences
    import seqloader.sources

    for pkg in (seqloader.sequences, seqloader.packing, seqloader.sources):
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
    seen, todo = set(), [LazySequence]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen and sub.__module__.startswith(("seqloader.sequences", "seqloader.packing",
                                                              "seqloader.sources")):
                seen.add(sub)
            todo.append(sub)
    return sorted(seen, key=lambda c: (c.__module__, c.__qualname__))


def test_every_op_and_source_of_the_core_describes_its_positions():
    missing = [f"{c.__module__}.{c.__qualname__}" for c in _op_classes() if c is not IndexMap  # abstract
               and "_position_stage" not in {k for b in c.__mro__ if b is not LazySequence for k in vars(b)}]
    assert missing == [], f"ops without _position_stage(): {missing}"


def test_a_source_is_what_its_stage_says_and_a_users_duck_source_still_counts():
    class Files:
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return i

        def files(self):
            return [["a", 1, "x"]]

        def fingerprint(self):
            return "00"

    assert is_source(Files()) and describe_stage(Files()) == Stage("Files", {}, source=True)
    assert not is_source(seqloader.shuffle(xs(), seed=1)) and not is_source(xs())
    nodes = walk(seqloader.smap(plus_one, seqloader.concatenate([Files(), xs(3)])))
    assert [n.stage.name if n.stage else type(n.obj).__name__ for n in nodes] == ["smap", "concatenate", "Files", "list"]


# -- hypothesis: the digest is stable ------------------------------------------------------------------

OPS = st.sampled_from(["shuffle", "slice", "repeat", "batch", "smap", "rng_map", "cycle"])


def build(ops, seed):
    seq = xs(24)
    for op, k in ops:
        if op == "shuffle":
            seq = seqloader.shuffle(seq, seed=seed + k)
        elif op == "slice":
            seq = seq[k % 3:]
        elif op == "repeat":
            seq = seqloader.repeat(seq, 1 + k % 2)
        elif op == "batch":
            seq = seqloader.batch(seq, 1 + k % 3)
        elif op == "smap":
            seq = seqloader.smap(plus_one if k % 2 else plus_two, seq)
        elif op == "rng_map":
            seq = seqloader.rng_map(noise_a if k % 2 else noise_b, seq, seed=k)
        else:
            seq = seqloader.cycle(seq, limit=30 + k)
    return seq


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(OPS, st.integers(0, 5)), max_size=6), seed=st.integers(0, 2**32))
def test_the_record_is_the_same_for_the_same_recipe_built_twice_or_pickled(ops, seed):
    import pickle

    a = record_positions(build(ops, seed))
    assert a == record_positions(build(ops, seed)) == record_positions(pickle.loads(pickle.dumps(build(ops, seed))))
    assert json_round_trip(a) == a and len(json.dumps(a)) < 1024
    check_positions(a, build(ops, seed))


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(OPS, st.integers(0, 5)), min_size=1, max_size=6), seed=st.integers(0, 2**32))
def test_the_record_changes_with_a_seed_that_decides_positions_and_not_with_values(ops, seed):
    a, b = record_positions(build(ops, seed)), record_positions(build(ops, seed + 1))
    assert (a == b) == (not any(op == "shuffle" for op, _ in ops))
    swapped = [(op, k + 1 if op in ("smap", "rng_map") else k) for op, k in ops]  # other functions and seeds
    assert record_positions(build(swapped, seed)) == a
