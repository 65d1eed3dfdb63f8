"""Hypothesis strategies shared by the tests: random pipelines of sequence ops with a list oracle.

``pipelines()`` draws a base list and a chain of ops (``smap``, ``rng_map``, ``gather``,
``shuffle``, ``concatenate``, ``repeat``, ``batch``, ``shard``, slices); each op is applied both to
the lazy sequence and, as a list comprehension, to a plain Python list (the oracle).
``check_against_oracle`` then compares length, every index, out-of-range errors, slices of
slices, iteration and pickle round trips.

The functions given to ``smap``/``rng_map``/``batch`` are module-level so that pipelines pickle.
"""

from __future__ import annotations

import math
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pytest
from hypothesis import strategies as st

import seqloader as sl
from seqloader.permutation import FeistelPermutation
from seqloader.rng import item_rng

#: Above this length an op that grows the pipeline is replaced by a slice.
MAX_LEN = 120


# -- module-level (picklable) user functions -----------------------------------------------------

def tag(x):
    return ("m", x)


def pair(a, b):
    return (a, b)


def draw_int(x, rng):
    return (x, int(rng.integers(1000)))


def collate_tuple(items):
    return tuple(items)


# -- oracles ---------------------------------------------------------------------------------------

def shard_oracle(items: list, rank: int, world_size: int, drop_remainder: bool) -> list:
    """The DistributedSampler layout, written independently of ``shard``."""
    n = len(items)
    if n == 0:
        return []
    total = (n // world_size) * world_size if drop_remainder else math.ceil(n / world_size) * world_size
    padded = [items[p % n] for p in range(total)]
    return padded[rank:total:world_size]


def shuffle_oracle(items: list, seed: int) -> list:
    order = FeistelPermutation(len(items), seed)(np.arange(len(items))).tolist()
    return [items[j] for j in order]


@dataclass
class Pipeline:
    seq: Sequence
    oracle: list
    ops: list = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Pipeline({' -> '.join(self.ops) or 'list'}, len={len(self.oracle)})"


# -- strategies ------------------------------------------------------------------------------------

slices = st.builds(
    slice,
    st.none() | st.integers(-15, 15),
    st.none() | st.integers(-15, 15),
    st.none() | st.sampled_from([-4, -3, -2, -1, 1, 2, 3, 4]),
)

seeds = st.integers(0, 2**64 - 1)

OPS = ("smap", "smap2", "rng_map", "gather", "shuffle", "concatenate", "repeat", "batch", "shard", "slice")


@st.composite
def pipelines(draw, max_depth: int = 4, base_max: int = 20, ops: Sequence[str] = OPS) -> Pipeline:
    """A random pipeline over a random list, with its list oracle."""
    base = draw(st.lists(st.integers(-100, 100), max_size=base_max))
    p = Pipeline(base, list(base))
    for _ in range(draw(st.integers(0, max_depth))):
        op = draw(st.sampled_from(list(ops)))
        p = apply_op(draw, p, op)
    return p


def apply_op(draw, p: Pipeline, op: str) -> Pipeline:
    seq, o = p.seq, p.oracle
    n = len(o)
    if op in ("concatenate", "repeat") and n > MAX_LEN // 3 or op == "smap2" and n > MAX_LEN:
        op = "slice"
    if op == "smap":
        return Pipeline(sl.smap(tag, seq), [tag(x) for x in o], p.ops + ["smap"])
    if op == "smap2":
        return Pipeline(sl.smap(pair, seq, seq[::-1]), [pair(a, b) for a, b in zip(o, o[::-1])], p.ops + ["smap2"])
    if op == "rng_map":
        seed = draw(seeds)
        return Pipeline(sl.rng_map(draw_int, seq, seed),
                        [(x, int(item_rng(seed, i).integers(1000))) for i, x in enumerate(o)],
                        p.ops + [f"rng_map({seed})"])
    if op == "gather":
        idx = draw(st.lists(st.integers(-n, n - 1), max_size=30)) if n else []
        return Pipeline(sl.gather(seq, idx), [o[i] for i in idx], p.ops + [f"gather({idx})"])
    if op == "shuffle":
        seed = draw(seeds)
        return Pipeline(sl.shuffle(seq, seed), shuffle_oracle(o, seed), p.ops + [f"shuffle({seed})"])
    if op == "concatenate":
        extra = draw(st.lists(st.integers(-100, 100), max_size=10))
        first = draw(st.booleans())
        parts, oracle = ([seq, extra], o + extra) if first else ([extra, [], seq], extra + o)
        return Pipeline(sl.concatenate(parts), oracle, p.ops + [f"concatenate(extra={len(extra)})"])
    if op == "repeat":
        t = draw(st.integers(0, 3))
        return Pipeline(sl.repeat(seq, t), o * t, p.ops + [f"repeat({t})"])
    if op == "batch":
        k = draw(st.integers(1, 5))
        drop_last = draw(st.booleans())
        collate = draw(st.sampled_from([None, collate_tuple]))
        full = [o[i:i + k] for i in range(0, n, k)]
        if drop_last:
            full = [b for b in full if len(b) == k]
        oracle = full if collate is None else [collate(b) for b in full]
        return Pipeline(sl.batch(seq, k, drop_last=drop_last, collate_fn=collate), oracle,
                        p.ops + [f"batch({k}, {drop_last}, {collate and 'tuple'})"])
    if op == "shard":
        ws = draw(st.integers(1, 5))
        rank = draw(st.integers(0, ws - 1))
        drop = draw(st.booleans())
        return Pipeline(sl.shard(seq, rank, ws, drop), shard_oracle(o, rank, ws, drop),
                        p.ops + [f"shard({rank}, {ws}, {drop})"])
    if op == "slice":
        s = draw(slices)
        return Pipeline(seq[s], o[s], p.ops + [f"[{s.start}:{s.stop}:{s.step}]"])
    raise AssertionError(op)  # pragma: no cover - a typo in OPS


# -- checks ------------------------------------------------------------------------------------------

def check_against_oracle(seq: Any, oracle: list, slice_pairs: Sequence[tuple] = ()) -> None:
    """Assert ``seq`` behaves exactly like the list ``oracle``."""
    n = len(oracle)
    assert len(seq) == n
    assert [seq[i] for i in range(-n, n)] == oracle + oracle
    assert list(seq) == oracle
    if isinstance(seq, sl.LazySequence):
        for bad in (n, -n - 1, n + 7):
            msg = f"{seq!r}: index {bad} out of range [-{n}, {n})"
            with pytest.raises(IndexError, match="^" + re.escape(msg) + "$"):
                seq[bad]
        with pytest.raises(TypeError, match="indices must be integers or slices"):
            seq["0"]
    for s1, s2 in slice_pairs:
        view = seq[s1][s2]
        expected = oracle[s1][s2]
        assert len(view) == len(expected)
        assert list(view) == expected
        assert [view[i] for i in range(len(expected))] == expected
    clone = pickle.loads(pickle.dumps(seq))
    assert len(clone) == n
    assert list(clone) == oracle
