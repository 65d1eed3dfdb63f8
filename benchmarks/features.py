"""Workloads for ``seqloader.DataLoader`` features: out-of-order delivery, ``stats()`` and its stages.

* ``straggler``: 2_000 map-style items, batch 8, 2 workers, one epoch; 1 item in 50 sleeps 50 ms
  (the others cost nothing), so a few batches straggle. Both loaders run with ``in_order=False``
  (a ready batch is yielded before an earlier, slower one); seqloader also runs with
  ``in_order=True``, and its ``in_order=False`` row notes the speed-up over that.
* ``stats_overhead``: the cost of the always-on ``loader.stats()`` timing on the ``loader_tiny``
  workload (200_000 ints, batch 256, shuffled, ``num_workers=0``): seqloader as it is against
  the same loader with ``LoaderStats.start``/``returned`` replaced by no-ops in this process,
  best of ``3 * repeat`` interleaved runs; the cost row is in percent of the epoch's time (target
  <= 1%, noisy at this size), and notes what the two calls cost alone, timed in a loop.
* ``stages_overhead``: the cost of ``profile_stages=True`` (every ``smap`` call, fetch, collate
  and, with workers, the transfer timed, and the totals sent with each batch): one epoch of
  ``smap(flip, images)`` (2_000 uint8 images 3x224x224, a horizontal flip that copies, batch 64,
  shuffled) and of ``smap(add_one, ints)`` (200_000 ints, batch 256), ``num_workers=0``, and the
  images with 2 workers; profiling on against off, best of ``3 * repeat`` interleaved runs; the
  cost rows are in percent of the epoch's time (target <= 2%), and note what one timed ``smap``
  call costs alone (timed in a loop) and that cost times the items, in percent of the epoch.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Iterator

import torch.utils.data

import numpy as np

from benchmarks.common import ImageDataset, IntDataset, Options, Row, best_of, epoch_seconds, per_call_seconds
from seqloader import DataLoader, smap
from seqloader.loader.tuning.stats import LoaderStats
from seqloader.sequences import stage_times

__all__ = ["FEATURE_WORKLOADS", "StragglerDataset", "stages_overhead", "stats_disabled", "stats_overhead",
           "straggler"]


class StragglerDataset:
    """``n`` ints: item ``i`` is ``i``, and every ``every``-th item (from item 0) sleeps ``sleep_s`` first.

    Example:
        >>> ds = StragglerDataset(100, every=50, sleep_s=0.0)
        >>> len(ds), ds[49], ds.slow_items
        (100, 49, 2)
    """

    def __init__(self, n: int, every: int = 50, sleep_s: float = 0.05):
        self.n, self.every, self.sleep_s = n, every, sleep_s

    def __len__(self) -> int:
        return self.n

    @property
    def slow_items(self) -> int:
        return -(-self.n // self.every)

    def __getitem__(self, i: int) -> int:
        if i % self.every == 0:
            time.sleep(self.sleep_s)
        return i


def straggler(opts: Options) -> list[Row]:
    """1 item in 50 sleeps 50 ms: ``in_order=False`` for both loaders, and seqloader's ``in_order=True``."""
    ds = StragglerDataset(400 if opts.quick else 2_000)
    bs, nw = 8, 2
    best = best_of(opts.repeat, {
        "seq_unordered": lambda: epoch_seconds(DataLoader, ds, bs, nw, in_order=False),
        "seq_ordered": lambda: epoch_seconds(DataLoader, ds, bs, nw, in_order=True),
        "torch": lambda: epoch_seconds(torch.utils.data.DataLoader, ds, bs, nw, in_order=False),
    })
    n = len(ds)
    slow = f"{ds.slow_items} of {n} items sleep {ds.sleep_s * 1e3:.0f} ms"
    vs_ordered = best["seq_ordered"] / best["seq_unordered"]
    return [Row("straggler", "seqloader.DataLoader in_order=False", nw, n / best["seq_unordered"], "samples/s",
                ratio=best["torch"] / best["seq_unordered"],
                notes=f"{vs_ordered:.2f}x seqloader in_order=True; {slow}"),
            Row("straggler", "seqloader.DataLoader in_order=True", nw, n / best["seq_ordered"], "samples/s",
                notes="the reference for in_order=False (torch's row is in_order=False)"),
            Row("straggler", "torch DataLoader in_order=False", nw, n / best["torch"], "samples/s", notes=slow)]


@contextlib.contextmanager
def stats_disabled() -> Iterator[None]:
    """Make ``LoaderStats.start``/``returned`` no-ops in this process for the duration (not in workers)."""
    start, returned = LoaderStats.start, LoaderStats.returned
    LoaderStats.start = lambda self: 0.0  # type: ignore[method-assign]
    LoaderStats.returned = lambda self, start, batch=None: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        LoaderStats.start, LoaderStats.returned = start, returned  # type: ignore[method-assign]


def _stats_off_seconds(ds, bs: int) -> float:
    with stats_disabled():
        return epoch_seconds(DataLoader, ds, bs, 0, shuffle=True)


def _stats_call_seconds(calls: int) -> float:
    """Seconds of one ``start()`` + ``returned()`` pair: what ``stats()`` adds to each ``next()``."""
    stats = LoaderStats()
    stats.begin(epoch=0)
    return per_call_seconds(lambda _: stats.returned(stats.start()), calls)


def stats_overhead(opts: Options) -> list[Row]:
    """The always-on ``stats()`` timing on ``loader_tiny`` at ``num_workers=0``, in percent of the epoch."""
    ds, bs = IntDataset(5_000 if opts.quick else 200_000), 256
    best = best_of(3 * opts.repeat, {
        "on": lambda: epoch_seconds(DataLoader, ds, bs, 0, shuffle=True),
        "off": lambda: _stats_off_seconds(ds, bs),
        "torch": lambda: epoch_seconds(torch.utils.data.DataLoader, ds, bs, 0, shuffle=True),
    })
    n, batches = len(ds), math.ceil(len(ds) / bs)
    pair = _stats_call_seconds(10_000 if opts.quick else 200_000)
    direct = 100 * pair * batches / best["off"]
    return [Row("stats_overhead", "seqloader.DataLoader", 0, n / best["on"], "samples/s",
                ratio=best["torch"] / best["on"]),
            Row("stats_overhead", "seqloader.DataLoader stats off", 0, n / best["off"], "samples/s",
                notes="LoaderStats.start/returned patched to no-ops"),
            Row("stats_overhead", "torch DataLoader", 0, n / best["torch"], "samples/s"),
            Row("stats_overhead", "stats() cost", 0, 100 * (best["on"] / best["off"] - 1), "%",
                notes=f"stats on vs off, target <= 1%; the two calls alone: {pair * 1e6:.2f} µs/batch "
                      f"= {direct:.2f}% of the epoch")]


def flip(image: np.ndarray) -> np.ndarray:
    """A horizontal flip that copies (a typical cheap augmentation)."""
    return np.ascontiguousarray(image[:, :, ::-1])


def add_one(x: int) -> int:
    return x + 1


def _timed_call_seconds(calls: int) -> float:
    """What timing adds to one ``smap`` call: ``s[i]`` with stage timing on, less with it off."""
    seq = smap(add_one, IntDataset(calls))
    off = min(per_call_seconds(seq.__getitem__, calls) for _ in range(3))
    with stage_times.collecting(stage_times.StageTimes()):
        on = min(per_call_seconds(seq.__getitem__, calls) for _ in range(3))
    return on - off


def _stages_rows(name: str, ds, bs: int, nw: int, opts: Options, call_s: float) -> list[Row]:
    best = best_of(3 * opts.repeat, {
        "on": lambda: epoch_seconds(DataLoader, ds, bs, nw, shuffle=True, profile_stages=True),
        "off": lambda: epoch_seconds(DataLoader, ds, bs, nw, shuffle=True),
    })
    n = len(ds)
    direct = 100 * call_s * n / max(1, nw) / best["off"]  # one timed smap call per item, per worker
    return [Row("stages_overhead", f"{name}, profile_stages=True", nw, n / best["on"], "samples/s"),
            Row("stages_overhead", f"{name}, profile_stages=False", nw, n / best["off"], "samples/s"),
            Row("stages_overhead", f"{name}: profile_stages cost", nw, 100 * (best["on"] / best["off"] - 1), "%",
                notes=f"on vs off, target <= 2% (a difference of two timings: may be < 0 in noise); a timed "
                      f"smap call alone: {call_s * 1e6:.2f} µs, {direct:.2f}% of the epoch")]


def stages_overhead(opts: Options) -> list[Row]:
    """``profile_stages=True`` against off: images through an ``smap`` (0 and 2 workers), ints (0 workers)."""
    images = smap(flip, ImageDataset(256 if opts.quick else 2_000))
    ints = smap(add_one, IntDataset(5_000 if opts.quick else 200_000))
    call_s = _timed_call_seconds(10_000 if opts.quick else 200_000)
    return (_stages_rows("smap(flip, images)", images, 64, 0, opts, call_s)
            + _stages_rows("smap(add_one, ints)", ints, 256, 0, opts, call_s)
            + _stages_rows("smap(flip, images)", images, 64, 2, opts, call_s))


#: Workload name -> function(Options) -> rows.
FEATURE_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "straggler": straggler,
    "stats_overhead": stats_overhead,
    "stages_overhead": stages_overhead,
}
