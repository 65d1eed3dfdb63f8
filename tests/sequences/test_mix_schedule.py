"""mix(...).with_weights: agreement before a change, cursors, no repeated or skipped items, the prefix
bound from each change, policies, lookups, pickling, the recorded changes, golden orders, validation."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from seqloader.rng import derive_seed
from seqloader.sequences.mix import mix
from seqloader.sequences.mix_schedule import MixSchedule
from strategies import check_against_oracle

BIG = 10**15  # sources this long are never read to their end in these tests
seeds = st.integers(0, 2**64 - 1)
weight = st.integers(0, 5) | st.sampled_from([0.0, 0.25, 0.5, 1.5, 2.0])


@st.composite
def weight_lists(draw, k: int):
    w = draw(st.lists(weight, min_size=k, max_size=k))
    if not any(x > 0 for x in w):
        w[draw(st.integers(0, k - 1))] = 1
    return w


@st.composite
def schedules(draw):
    """``(lens, base_weights, kwargs, changes)``: a small mixture and a valid change schedule for it."""
    k = draw(st.integers(1, 4))
    lens = draw(st.lists(st.integers(1, 40), min_size=k, max_size=k))
    base = draw(st.lists(st.integers(1, 6), min_size=k, max_size=k))
    policy = draw(st.sampled_from(["first", "length"]))
    kwargs = {"stop": "first"} if policy == "first" else {"length": draw(st.integers(0, 150))}
    kwargs["seed"] = draw(st.none() | seeds)
    m = mix([range(n) for n in lens], base, **kwargs)
    changes = []
    for _ in range(draw(st.integers(0, 5))):
        at = draw(st.integers(changes[-1][0] if changes else 0, len(m)))
        w = draw(weight_lists(k))
        m = m.with_weights(w, at=at)
        changes = [c for c in changes if c[0] != at] + [(at, w)]
    return lens, base, kwargs, changes


def build(lens, base, kwargs, changes) -> MixSchedule:
    seqs = [[(k, j) for j in range(n)] for k, n in enumerate(lens)]
    return mix(seqs, base, **kwargs).with_changes(changes)


def twin(lens, base, kwargs, changes, n: int) -> MixSchedule:
    """The same schedule over sources that never end, ``n`` positions long: its ``j`` never wraps."""
    return mix([range(BIG)] * len(lens), base, seed=kwargs["seed"], length=n).with_changes(changes)


def reads(m, n: int) -> list:
    k, j = m._source_of(np.arange(n, dtype=np.int64))
    return list(zip(k.tolist(), j.tolist()))


def segment_bounds(m) -> list:
    """``(start, stop, weights)`` per segment with positions, ``weights`` None for the base."""
    starts = [0] + [p for p, _ in m.changes]
    stops = starts[1:] + [len(m)]
    ws = [None] + [w for _, w in m.changes]
    return [(a, b, w) for a, b, w in zip(starts, stops, ws) if b > a]


# -- the sequence -------------------------------------------------------------------------------------

@given(schedules())
def test_reads_are_the_unwrapped_schedule_without_repeats(args):
    lens, base, kwargs, changes = args
    m = build(lens, base, kwargs, changes)
    n = len(m)
    raw = reads(twin(lens, base, kwargs, changes, n + 1), n + 1)
    assert len(set(raw[:n])) == n, "no item of any source is read twice"
    oracle = [(k, j % lens[k]) for k, j in raw[:n]]
    check_against_oracle(m, oracle, slice_pairs=[(slice(None, None, -1), slice(1, None, 2))])
    if "stop" in kwargs:
        assert all(j < lens[k] for k, j in raw[:n])
        k, j = raw[n]
        assert j >= lens[k], "stop='first' ends just before a read past a source's end"
    else:
        assert n == kwargs["length"]


@given(schedules())
def test_without_a_seed_each_source_is_read_in_order_across_changes(args):
    lens, base, kwargs, changes = args
    kwargs = {**kwargs, "seed": None}
    m = twin(lens, base, kwargs, changes, 400)
    counters = [0] * len(lens)
    for k, j in reads(m, 400):
        assert j == counters[k]
        counters[k] += 1
    assert m.cursors(400) == tuple(counters)


@given(schedules())
def test_no_item_is_skipped_once_every_source_is_read_again(args):
    """After a last change that reads every source, each source's reads at a block boundary of the
    last segment are exactly ``0 .. cursor - 1``: the items a cut block left unread came first."""
    lens, base, kwargs, changes = args
    m = build(lens, base, kwargs, changes)
    n, k = len(m), len(lens)
    q = 1 + sum(seg.table._block for seg in m._segments)  # more than the unread items a cut leaves
    last = twin(lens, base, kwargs, changes, n + q * k).with_weights([1] * k, at=n)
    end = n + q * k
    got = reads(last, end)
    assert len(set(got)) == end
    cursors = last.cursors(end)
    for s in range(k):
        assert sorted(j for kk, j in got if kk == s) == list(range(cursors[s]))


@given(schedules())
def test_every_change_agrees_with_the_sequence_before_it(args):
    lens, base, kwargs, changes = args
    seqs = [[(k, j) for j in range(n)] for k, n in enumerate(lens)]
    m = mix(seqs, base, **kwargs)
    for at, w in changes:
        m2 = m.with_weights(w, at=at)
        assert reads(m2, at) == reads(m, at) and list(m2[:at]) == list(m[:at])
        if isinstance(m, MixSchedule):
            assert m2.cursors(at) == m.cursors(at)
        m = m2


@given(schedules())
def test_each_segment_is_a_static_mix_of_its_positive_weights(args):
    """Segment ``s`` reads sources in the order of ``mix(weights > 0, seed=derive_seed(seed,
    "mix_weights", s))`` from its first position, so the prefix bound holds from each change."""
    lens, base, kwargs, changes = args
    seed = kwargs["seed"]
    n = len(build(lens, base, kwargs, changes))
    m = twin(lens, base, kwargs, changes, n)
    index = {p: i + 1 for i, (p, _) in enumerate(m.changes)}
    for start, stop, w in segment_bounds(m):
        t = stop - start
        got = np.array([k for k, _ in reads(m, stop)[start:]], dtype=np.int64)
        if w is None:
            static = mix([range(BIG)] * len(lens), base, seed=seed, length=t)
            active = np.arange(len(lens))
        else:
            active = np.array([k for k, x in enumerate(w) if x > 0])
            s_seed = None if seed is None else derive_seed(seed, "mix_weights", index[start])
            static = mix([range(BIG)] * len(active), [w[k] for k in active], seed=s_seed, length=t)
        ks, _ = static._source_of(np.arange(t, dtype=np.int64))
        assert got.tolist() == active[ks].tolist()
        assert set(got.tolist()) <= set(active.tolist()), "a source of weight 0 is not read"
        counts, block = static._counts, static._block
        c = np.zeros((t + 1, len(active)), dtype=np.int64)
        c[np.arange(1, t + 1), ks] = 1
        dev = np.abs(c.cumsum(axis=0) - np.arange(t + 1)[:, None] * counts[None, :] / block).max(axis=0)
        if (w is None and seed is None) or (w is not None and s_seed is None):
            bound = 0.0 if len(active) == 1 else 1 - 1 / (2 * len(active) - 2)
            assert dev.max() <= bound + 1e-9
        else:
            assert np.all(dev <= counts * (1 - counts / block) + 1e-9)


@given(schedules(), st.data())
def test_vectorised_and_scalar_lookups_agree_and_cursors_count_reads(args, data):
    lens, base, kwargs, changes = args
    m = build(lens, base, kwargs, changes)
    assume(len(m) > 0)
    pos = np.array(data.draw(st.lists(st.integers(0, len(m) - 1), min_size=1, max_size=40)), dtype=np.int64)
    k, j = m._source_of(pos)
    assert list(zip(k.tolist(), j.tolist())) == [m._source_of_one(int(p)) for p in pos]
    p = data.draw(st.integers(0, len(m)))
    raw = reads(twin(lens, base, kwargs, changes, len(m)), p)
    assert m.cursors(p) == tuple(sum(1 for kk, _ in raw if kk == s) for s in range(len(lens)))


@given(schedules())
def test_pickles_small_and_to_the_same_sequence(args):
    lens, base, kwargs, changes = args
    m = build(lens, base, kwargs, changes)
    blob = pickle.dumps(m)
    clone = pickle.loads(blob)
    assert len(clone) == len(m) and list(clone) == list(m) and clone.changes == m.changes
    assert len(blob) < 2000 + 16 * sum(lens)  # the sources (lists here) and the change list


@given(schedules())
def test_changes_are_json_and_rebuild_the_same_sequence(args):
    lens, base, kwargs, changes = args
    m = build(lens, base, kwargs, changes)
    saved = json.loads(json.dumps(m.changes))
    assert [(p, list(w)) for p, w in m.changes] == [(p, w) for p, w in saved]
    again = m.base.with_changes(saved)
    assert again.changes == m.changes and list(again) == list(m)


# -- examples -----------------------------------------------------------------------------------------

def test_a_source_joins_leaves_and_comes_back_from_its_cursor():
    a, b, c = [f"a{i}" for i in range(50)], [f"b{i}" for i in range(50)], [f"c{i}" for i in range(50)]
    m = mix([a, b, c], [1, 1, 1]).with_weights([1, 1, 0], at=0)   # c starts at weight 0
    assert list(m[:4]) == ["a0", "b0", "a1", "b1"]
    m2 = m.with_weights([0, 1, 1], at=4)                           # c joins, a leaves
    assert list(m2[:8]) == ["a0", "b0", "a1", "b1", "b2", "c0", "b3", "c1"]
    m3 = m2.with_weights([1, 0, 0], at=8)                          # a comes back from a2
    assert list(m3[8:11]) == ["a2", "a3", "a4"] and m3.cursors(8) == (2, 4, 2)
    assert len(m3) == 8 + 48 and list(m3)[-1] == "a49"


def test_a_change_at_the_same_position_replaces_the_last_one():
    m = mix([range(100), range(100, 200)], [1, 1])
    a = m.with_weights([1, 0], at=10).with_weights([0, 1], at=10)
    assert a.changes == ((10, (0, 1)),) and list(a) == list(m.with_weights([0, 1], at=10))


def test_a_change_at_the_end_drops_an_exhausted_source():
    m = mix([range(4), range(100, 200)], [1, 1])
    assert len(m) == 8                                              # range(4) would be read a 5th time
    m2 = m.with_weights([0, 1], at=8)
    assert len(m2) == 8 + 96 and list(m2[8:10]) == [104, 105]
    assert len(m.with_weights([1, 1], at=8)) == 8                   # still empty: the same stop


def test_length_wraps_sources_and_cursors():
    m = mix([range(3), range(10, 12)], [1, 1], length=12).with_weights([1, 0], at=4)
    assert list(m) == [0, 10, 1, 11, 2, 0, 1, 2, 0, 1, 2, 0]
    assert m.cursors(12) == (10, 2) and len(m) == 12


def test_a_mixture_of_one_hundred_changes_is_cheap_and_small():
    seqs = [range(10**9), range(10**9), range(10**9)]
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 4, size=(100, 3))
    weights[weights.sum(axis=1) == 0, 0] = 1
    m = mix(seqs, [0.7, 0.2, 0.1], seed=5)
    for i, w in enumerate(weights.tolist()):
        m = m.with_weights(w, at=1000 * (i + 1))
    assert len(json.dumps(m.changes)) < 4096
    assert len(pickle.dumps(m)) < 4096
    k, j = m._source_of(np.arange(50_000, 50_256, dtype=np.int64))
    assert list(zip(k.tolist(), j.tolist())) == [m._source_of_one(p) for p in range(50_000, 50_256)]
    float_changes = [[1000 * (i + 1), [round(x, 2) for x in (0.5 + rng.random(3)).tolist()]] for i in range(100)]
    assert len(json.dumps(mix(seqs, [1, 1, 1]).with_changes(float_changes).changes)) < 4096


def test_golden_orders():
    # Pinned on purpose: changing the schedule changes what a saved loader position names.
    seqs = [range(100), range(1000, 1100), range(2000, 2100)]
    changes = [[5, [0, 1, 1]], [12, [2, 0, 1]], [20, [0.5, 0.25, 0.25]]]
    m = mix(seqs, [0.7, 0.2, 0.1]).with_changes(changes)
    assert list(m[:30]) == GOLDEN_PLAIN and m.cursors(30) == (14, 8, 8)
    s = mix(seqs, [0.7, 0.2, 0.1], seed=3).with_changes(changes)
    assert list(s[:30]) == GOLDEN_SEEDED


GOLDEN_PLAIN = [0, 1, 1000, 2, 3, 1001, 2000, 1002, 2001, 1003, 2002, 1004, 4, 2003, 5, 6, 2004, 7, 8, 2005,
                9, 1005, 10, 2006, 11, 1006, 12, 2007, 13, 1007]
GOLDEN_SEEDED = [1, 1001, 1000, 2000, 6, 1002, 2001, 2002, 1003, 2003, 1004, 2004, 0, 2005, 2, 4, 3, 2006, 7, 5,
                 9, 1005, 2007, 8, 2008, 10, 11, 1006, 13, 2009]


def test_repr_names_the_op_changes_and_length():
    m = mix([[1, 2], [3]], [2, 1]).with_weights([1, 0], at=1)
    assert repr(m) == ("mix.with_weights(2 seqs, 1 changes, last=[1, 0] at 1, stop='first', seed=None, "
                       "len=2)")
    with pytest.raises(IndexError, match=re.escape(repr(m) + ": index 2 out of range [-2, 2)")):
        m[2]


# -- validation ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("weights, at, exc, msg", [
    ([1, 1, 1], 5, ValueError,
     "mix.with_weights: weights must have one entry per source (got 3 weights for 2 sources)"),
    ([1, -1], 5, ValueError, "mix.with_weights: weights[1] must be a finite number >= 0 (got -1)"),
    ([float("nan"), 1], 5, ValueError, "mix.with_weights: weights[0] must be a finite number >= 0 (got nan)"),
    ([float("inf"), 1], 5, ValueError, "mix.with_weights: weights[0] must be a finite number >= 0 (got inf)"),
    ([10**400, 1], 5, ValueError, "mix.with_weights: weights[0] must be a finite number >= 0 (got 1000"),
    ([0, 0.0], 5, ValueError, "mix.with_weights: weights are all 0 (got [0, 0.0]); at least one must be > 0"),
    ([1, "2"], 5, TypeError, "mix.with_weights: weights[1] must be a real number (got str '2')"),
    ([True, 1], 5, TypeError, "mix.with_weights: weights[0] must be a real number (got bool True)"),
    (3, 5, TypeError, "mix.with_weights: weights must be a sequence of numbers >= 0 (got int)"),
    ([1, 10**6], 5, ValueError, "mix.with_weights: weights[0] is too small: its share of the total is 1e-06"),
    ([1, 1], -1, ValueError, "mix.with_weights: at must be a non-negative int (got -1)"),
    ([1, 1], 2.0, TypeError, "mix.with_weights: at must be an int (got float 2.0)"),
    ([1, 1], 21, ValueError, "mix.with_weights: at=21 is past the end of the mixture (len=20)"),
    ([1, 1], 3, ValueError, "mix.with_weights: at=3 is before the last change at 4; changes come in order"),
])
def test_with_weights_errors_name_op_and_argument(weights, at, exc, msg):
    m = mix([range(10), range(10)], [1, 1]).with_weights([1, 1], at=4)
    with pytest.raises(exc, match="^" + re.escape(msg)):
        m.with_weights(weights, at=at)


def test_stop_all_is_refused_and_with_changes_names_the_entry():
    with pytest.raises(ValueError, match=re.escape("mix.with_weights: stop='all' cannot change weights")):
        mix([range(3), range(4)], [1, 1], stop="all").with_weights([1, 0], at=2)
    m = mix([range(10), range(10)], [1, 1])
    with pytest.raises(ValueError, match="at=2 is before the last change at 4") as info:
        m.with_changes([[4, [1, 0]], [2, [0, 1]]])
    assert info.value.__notes__ == ["seqloader: raised in mix.with_changes at changes[1]"]
    with pytest.raises(TypeError, match=re.escape("mix.with_changes: changes[0] must be a [position, weights] pair")):
        m.with_changes([[4]])
    with pytest.raises(ValueError, match=re.escape("MixSchedule.cursors: position must be <= len (20) (got 21)")):
        m.with_changes([]).cursors(21)
