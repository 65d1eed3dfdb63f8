"""Costs that should not grow with the dataset: resuming late in a huge epoch, and ``seqloader.mix``.

* ``resume_scale``: seconds from ``load_state_dict(state)`` (a state at 90% of a shuffled epoch)
  to the first batch, ``num_workers=0``, batch 256, on an :class:`~benchmarks.common.IntDataset`
  (item ``i`` is ``i``, no storage) of 10**6, 10**7 and 10**8 items (quick: 10**5, 10**6).
  seqloader seeks, so its time should be flat in ``n``. torch's comparable cost is a fresh
  ``iter()`` whose sampler skips the first 90% of the epoch's batches (indices only, no data
  fetched) before the first batch; it is measured up to 10**7 only, since it grows with ``n``.
* ``mix``: per batch of 256 positions, the cost of ``mix(...)._source_of`` (positions to
  ``(source, item)``, vectorised) and of reading 256 items through ``m[p]``; and the latency of
  ``m[10**9 - 1]``. The mixture is 70/20/10 over three sources of 10**9 items (``range``s).
  torch has no counterpart: no ratio.
* ``state_dict``: the mean cost of ``loader.state_dict()`` called after every batch of an epoch
  (10**6 items, batch 256, shuffled, 2 workers: what a framework checkpointing every step pays),
  the first call included; torchdata's ``StatefulDataLoader`` on the same dataset when it is
  installed (the ``bench`` extra), as the ratio's reference.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Callable

import numpy as np
import torch.utils.data

from benchmarks.common import IntDataset, Options, Row, best_of, per_call_seconds, size_label
from seqloader import DataLoader

try:
    from seqloader import mix
except ImportError:  # an older layout of the package
    from seqloader.sequences.mix import mix

__all__ = ["SCALE_WORKLOADS", "mix_cost", "resume_scale", "state_dict_cost"]

#: torch's skip is measured up to this ``n``; above, it takes too long to be worth running.
TORCH_MAX_N = 10**7


def _resume_position(n: int, bs: int) -> int:
    return (9 * n // 10) // bs * bs


def _seqloader_resume_seconds(n: int, bs: int) -> float:
    """Seconds from ``load_state_dict`` of a state at 90% of the epoch to the first batch."""
    ds = IntDataset(n)
    state = DataLoader(ds, batch_size=bs, shuffle=True, seed=0).state_dict()
    state["position"] = _resume_position(n, bs)
    loader = DataLoader(ds, batch_size=bs, shuffle=True, seed=0)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - t0


def _torch_skip_seconds(n: int, bs: int) -> float:
    """Seconds for a fresh torch iterator to skip 90% of the epoch's batches (indices only) and fetch one.

    torch's single-process iterator takes each batch's indices from ``_sampler_iter`` (an iterator
    over its ``BatchSampler``); consuming that skips batches without touching the dataset.
    """
    loader = torch.utils.data.DataLoader(IntDataset(n), batch_size=bs, shuffle=True)
    t0 = time.perf_counter()
    it = iter(loader)
    collections.deque(itertools.islice(it._sampler_iter, _resume_position(n, bs) // bs), maxlen=0)
    next(it)
    dt = time.perf_counter() - t0
    del it
    return dt


def resume_scale(opts: Options) -> list[Row]:
    """First batch after ``load_state_dict`` at 90% of a shuffled epoch of 10**6 .. 10**8 items."""
    sizes = (10**5, 10**6) if opts.quick else (10**6, 10**7, 10**8)
    bs, rows = 256, []
    _seqloader_resume_seconds(sizes[0], bs)  # warm-up (first calls, lazy imports): not a measurement
    _torch_skip_seconds(sizes[0], bs)
    first = None
    for n in sizes:
        runs = {"seqloader": lambda: _seqloader_resume_seconds(n, bs)}
        if n <= TORCH_MAX_N:
            runs["torch"] = lambda: _torch_skip_seconds(n, bs)
        best = best_of(opts.repeat, runs)
        label = size_label(n)
        notes = [] if first is None else [f"{best['seqloader'] / first:.2f}x the time at n={size_label(sizes[0])}"]
        first = best["seqloader"] if first is None else first
        if "torch" not in best:
            notes.append(f"torch not measured above n={size_label(TORCH_MAX_N)} (its skip grows with n: too long)")
        rows.append(Row("resume_scale", f"seqloader n={label}", 0, best["seqloader"], "s",
                        ratio=best["torch"] / best["seqloader"] if "torch" in best else None, notes="; ".join(notes)))
        if "torch" in best:
            rows.append(Row("resume_scale", f"torch skip n={label}", 0, best["torch"], "s",
                            notes="fresh iter(), sampler skips 90% of the batches"))
    return rows


def _mixture(seed: int | None):
    n = 10**9
    return mix([range(n), range(n), range(n)], [0.7, 0.2, 0.1], seed=seed)


def _mix_seconds(calls: int) -> dict[str, float]:
    """Seconds per call of each measured ``mix`` operation (one run)."""
    seeded, plain = _mixture(0), _mixture(None)
    span = len(seeded) - 256
    offsets = [(i * 1_000_003_717) % span for i in range(calls)]  # spread over the whole mixture
    arange = np.arange(256)
    last = 10**9 - 1
    return {
        "source_of": per_call_seconds(lambda i: seeded._source_of(arange + offsets[i]), calls),
        "source_of_plain": per_call_seconds(lambda i: plain._source_of(arange + offsets[i]), calls),
        "read": per_call_seconds(lambda i: [seeded[p] for p in range(offsets[i], offsets[i] + 256)], calls // 10),
        "last": per_call_seconds(lambda i: seeded[last], calls),
    }


def mix_cost(opts: Options) -> list[Row]:
    """``mix`` over three sources of 10**9 items: per 256 positions, and one item at 10**9 - 1."""
    calls = 200 if opts.quick else 5_000
    measured = [_mix_seconds(calls) for _ in range(opts.repeat)]
    best = {k: min(m[k] for m in measured) * 1e6 for k in measured[0]}
    notes = "3 sources of 10**9 items, weights 70/20/10; no torch counterpart"
    return [Row("mix", "seqloader.mix _source_of(256 positions), seed=0", 0, best["source_of"], "µs", notes=notes),
            Row("mix", "seqloader.mix _source_of(256 positions), no seed", 0, best["source_of_plain"], "µs",
                notes=notes),
            Row("mix", "seqloader.mix m[p] for 256 positions, seed=0", 0, best["read"], "µs", notes=notes),
            Row("mix", "seqloader.mix m[10**9 - 1], seed=0", 0, best["last"], "µs", notes=notes)]


def _state_dict_seconds(make, batches: int) -> float:
    """Mean seconds of ``state_dict()`` after each of the first ``batches`` batches of an epoch."""
    loader = make()
    it = iter(loader)
    total = 0.0
    for _ in range(batches):
        next(it)
        t0 = time.perf_counter()
        loader.state_dict()
        total += time.perf_counter() - t0
    del it
    return total / batches


def state_dict_cost(opts: Options) -> list[Row]:
    """``state_dict()`` after every batch: seqloader, and torchdata when installed."""
    n, bs = (10**5, 256) if opts.quick else (10**6, 256)
    batches = 50 if opts.quick else 400
    ds = IntDataset(n)
    makers = {"seqloader": lambda: DataLoader(ds, batch_size=bs, shuffle=True, seed=0, num_workers=2)}
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        StatefulDataLoader = None  # noqa: N806
    if StatefulDataLoader is not None:
        makers["torchdata"] = lambda: StatefulDataLoader(ds, batch_size=bs, shuffle=True, num_workers=2)
    best = best_of(opts.repeat, {k: (lambda m=m: _state_dict_seconds(m, batches)) for k, m in makers.items()})
    notes = f"{size_label(n)} items, batch {bs}, 2 workers, after each of {batches} batches, first call included"
    ref = best.get("torchdata")
    rows = [Row("state_dict", "seqloader.DataLoader.state_dict()", 2, best["seqloader"] * 1e6, "µs",
                ratio=None if ref is None else ref / best["seqloader"], notes=notes)]
    if ref is not None:
        rows.append(Row("state_dict", "torchdata StatefulDataLoader.state_dict()", 2, ref * 1e6, "µs", notes=notes))
    return rows


#: Workload name -> function(Options) -> rows.
SCALE_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "resume_scale": resume_scale,
    "mix": mix_cost,
    "state_dict": state_dict_cost,
}
