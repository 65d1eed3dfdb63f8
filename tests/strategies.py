"""Hypothesis strategies shared by the tests: random pipelines of sequence ops with a list oracle.

``pipelines()`` draws a base list and a chain of ops (``smap``, ``rng_map``, ``gather``,
``shuffle``, ``concatenate``, ``repeat``, ``batch``, ``shard``, slices); each op is applied both to
the lazy sequence and, as a list comprehension, to a plain Python list (the oracle).
``check_against_oracle`` then compares length, every index, out-of-range errors, slices of
slices, iteration and pickle round trips. ``SEQTOOLS_OPS`` are the ops ported from seqtools
(``cycle``, ``interleave``, ``case``, ``switch``, ``collate``, ``starmap``, ``add_cache``,
``unbatch``, ``batch(pad=)``, ``split``); ``ALL_OPS`` draws from both.

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
from seqloader.orders.permutation import FeistelPermutation
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


#: The value ``batch(pad=)`` fills short batches with in the pipelines (not an int, unlike the data).
PAD = "pad"


def interleave_oracle(*lists: list) -> list:
    """Round ``j`` takes item ``j`` of every list that has one, in argument order."""
    longest = max((len(x) for x in lists), default=0)
    return [x[j] for j in range(longest) for x in lists if j < len(x)]


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
SEQTOOLS_OPS = ("cycle", "interleave", "case", "switch", "collate", "starmap", "add_cache", "unbatch",
                "batch_pad", "split")
ALL_OPS = OPS + SEQTOOLS_OPS


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
    if op in ("concatenate", "repeat", "cycle", "interleave") and n > MAX_LEN // 3 or op == "smap2" and n > MAX_LEN:
        op = "slice"
    if op in SEQTOOLS_OPS:
        return apply_seqtools_op(draw, p, op)
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


def apply_seqtools_op(draw, p: Pipeline, op: str) -> Pipeline:
    seq, o = p.seq, p.oracle
    n = len(o)
    if op == "cycle":
        limit = draw(st.integers(0, 3 * n)) if n else 0
        return Pipeline(sl.cycle(seq, limit), [o[i % n] for i in range(limit)], p.ops + [f"cycle({limit})"])
    if op == "interleave":
        extras = draw(st.lists(st.lists(st.integers(-100, 100), max_size=8), max_size=2))
        first = draw(st.booleans())
        parts, lists = ([seq, *extras], [o, *extras]) if first else ([*extras, seq], [*extras, o])
        return Pipeline(sl.interleave(*parts), interleave_oracle(*lists),
                        p.ops + [f"interleave({[len(x) for x in lists]})"])
    if op == "case":
        selector = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        choices = [o, [tag(x) for x in o], o[::-1]]
        return Pipeline(sl.case(selector, seq, sl.smap(tag, seq), seq[::-1]),
                        [choices[k][i] for i, k in enumerate(selector)], p.ops + [f"case({selector})"])
    if op == "switch":
        cond = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return Pipeline(sl.switch(cond, seq, seq[::-1]), [a if c else b for c, a, b in zip(cond, o, o[::-1])],
                        p.ops + ["switch"])
    if op == "collate":
        return Pipeline(sl.collate([seq, seq[::-1]]), list(zip(o, o[::-1])), p.ops + ["collate"])
    if op == "starmap":
        return Pipeline(sl.starmap(pair, sl.collate([seq, seq[::-1]])), [pair(a, b) for a, b in zip(o, o[::-1])],
                        p.ops + ["starmap"])
    if op == "add_cache":
        size = draw(st.integers(1, 3))
        return Pipeline(sl.add_cache(seq, size), list(o), p.ops + [f"add_cache({size})"])
    if op == "unbatch":
        k = draw(st.integers(1, 5))
        collate = draw(st.sampled_from([None, collate_tuple]))
        return Pipeline(sl.unbatch(sl.batch(seq, k, collate_fn=collate), k, n % k), list(o),
                        p.ops + [f"unbatch({k}, {collate and 'tuple'})"])
    if op == "batch_pad":
        k = draw(st.integers(1, 5))
        chunks = [o[i:i + k] for i in range(0, n, k)]
        return Pipeline(sl.batch(seq, k, pad=PAD), [c + [PAD] * (k - len(c)) for c in chunks],
                        p.ops + [f"batch({k}, pad)"])
    if op == "split":
        form = draw(st.sampled_from(["cuts", "boundaries", "pairs"]))
        if form == "cuts":
            divisors = [d for d in range(1, n + 1) if n % d == 0] or [1, 2]
            edges = draw(st.sampled_from(divisors)) - 1
            step = n // (edges + 1)
            bounds = [(i * step, i * step + step) for i in range(edges + 1)]
        elif form == "boundaries":
            edges = sorted(draw(st.lists(st.integers(0, n), min_size=1, max_size=5)))
            cuts = [0, *edges, n]
            bounds = list(zip(cuts[:-1], cuts[1:]))
        else:
            starts = draw(st.lists(st.integers(0, n), min_size=1, max_size=5))
            bounds = edges = [(a, draw(st.integers(a, n))) for a in starts]
        return Pipeline(sl.smap(tuple, sl.split(seq, edges)), [tuple(o[a:b]) for a, b in bounds],
                        p.ops + [f"split({edges})"])
    raise AssertionError(op)  # pragma: no cover - a typo in SEQTOOLS_OPS


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
