"""Loader workloads for ``python -m seqloader.bench``: resume latency, state size, throughput.

:data:`LOADER_WORKLOADS` maps workload names to functions ``(Options) -> list[Row]`` in the shape
of :data:`seqloader.bench.WORKLOADS`, which registers them:

* ``resume``: seconds to the first batch after ``load_state_dict`` at 90% of a shuffled epoch
  of 1_000_000 items (batch 256), against a fresh loader's first batch, and against reaching the
  same batch with torch's ``DataLoader`` by iterating (what a replaying resume costs); when
  torchdata is installed, also its ``StatefulDataLoader`` resumed at the same point.
* ``state_size``: bytes of ``json.dumps(loader.state_dict())`` mid-epoch.
* ``loader_tiny``: throughput of ``seqloader.DataLoader`` against torch's on 200_000 ints,
  batch 256, with 0 and 2 workers (one epoch each, workers started inside the timing).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Callable

import torch.utils.data

from seqloader.loader.dataloader import DataLoader

__all__ = ["LOADER_WORKLOADS", "loader_images", "loader_tiny", "resume_latency", "state_size"]


def _first_batch_seconds(make: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    loader = make()
    next(iter(loader))
    return time.perf_counter() - t0


def resume_latency(opts) -> list:
    """First batch after ``load_state_dict`` at 90% of a shuffled epoch, vs a fresh first batch."""
    from seqloader.bench import IntDataset as _Ints, Row

    n, bs = (100_000 if opts.quick else 1_000_000), 256
    ds = _Ints(n)
    state = DataLoader(ds, batch_size=bs, shuffle=True, seed=0).state_dict()
    state["position"] = (9 * n // 10) // bs * bs

    def resumed():
        loader = DataLoader(ds, batch_size=bs, shuffle=True, seed=0)
        loader.load_state_dict(state)
        return loader

    def torch_replay():
        loader = torch.utils.data.DataLoader(ds, batch_size=bs, shuffle=True)
        next(itertools.islice(iter(loader), state["position"] // bs, None))
        return []

    best = {"fresh": float("inf"), "resume": float("inf"), "torch_replay": float("inf")}
    for _ in range(opts.repeat):
        best["fresh"] = min(best["fresh"], _first_batch_seconds(
            lambda: DataLoader(ds, batch_size=bs, shuffle=True, seed=0)))
        best["resume"] = min(best["resume"], _first_batch_seconds(resumed))
        t0 = time.perf_counter()
        torch_replay()
        best["torch_replay"] = min(best["torch_replay"], time.perf_counter() - t0)
    rows = [Row("resume@90%", "seqloader resume", 0, best["resume"], "s",
                ratio=best["torch_replay"] / best["resume"]),
            Row("resume@90%", "seqloader fresh", 0, best["fresh"], "s"),
            Row("resume@90%", "torch replay", 0, best["torch_replay"], "s")]
    return rows + _torchdata_resume(ds, bs, state["position"] // bs, opts.repeat)


def _torchdata_resume(ds, bs: int, batches: int, repeat: int) -> list:
    """torchdata's ``StatefulDataLoader`` resumed at the same point, when torchdata is installed."""
    from seqloader.bench import Row

    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return []
    loader = StatefulDataLoader(ds, batch_size=bs, shuffle=True)
    it = iter(loader)
    for _ in range(batches):  # reach the save point once (not timed)
        next(it)
    state = loader.state_dict()
    del it

    def resumed():
        fresh = StatefulDataLoader(ds, batch_size=bs, shuffle=True)
        fresh.load_state_dict(state)
        return fresh

    best = {"resume": float("inf"), "fresh": float("inf")}
    for _ in range(repeat):
        best["resume"] = min(best["resume"], _first_batch_seconds(resumed))
        best["fresh"] = min(best["fresh"], _first_batch_seconds(
            lambda: StatefulDataLoader(ds, batch_size=bs, shuffle=True)))
    return [Row("resume@90%", "torchdata resume", 0, best["resume"], "s"),
            Row("resume@90%", "torchdata fresh", 0, best["fresh"], "s")]


def state_size(opts) -> list:
    """Bytes of the JSON state of a shuffled map-style loader, mid-epoch."""
    from seqloader.bench import IntDataset as _Ints, Row

    loader = DataLoader(_Ints(1_000_000), batch_size=256, shuffle=True, seed=0)
    it = iter(loader)
    next(it)
    size = len(json.dumps(loader.state_dict()).encode())
    return [Row("state_size", "seqloader", 0, float(size), "bytes")]


def _loader_compare(name: str, ds, batch_size: int, workers: tuple, opts, item_bytes=None) -> list:
    """Throughput of ``seqloader.DataLoader`` vs torch's ``DataLoader`` (shuffled, same arguments)."""
    from seqloader.bench import Row

    rows = []
    for nw in workers:
        best = {"seqloader": float("inf"), "torch": float("inf")}
        for _ in range(opts.repeat):
            for label, cls in (("seqloader", DataLoader), ("torch", torch.utils.data.DataLoader)):
                t0 = time.perf_counter()
                for _ in cls(ds, batch_size=batch_size, shuffle=True, num_workers=nw):
                    pass
                best[label] = min(best[label], time.perf_counter() - t0)

        def mb(t):
            return None if item_bytes is None else len(ds) * item_bytes / t / 1e6

        rows += [Row(name, "seqloader.DataLoader", nw, len(ds) / best["seqloader"], "samples/s",
                     mb(best["seqloader"]), ratio=best["torch"] / best["seqloader"]),
                 Row(name, "torch DataLoader", nw, len(ds) / best["torch"], "samples/s", mb(best["torch"]))]
    return rows


def loader_tiny(opts) -> list:
    """``seqloader.DataLoader`` vs torch's ``DataLoader``: 200_000 ints, batch 256, 0 and 2 workers."""
    from seqloader.bench import IntDataset

    return _loader_compare("loader_tiny", IntDataset(5_000 if opts.quick else 200_000), 256, (0, 2), opts)


def loader_images(opts) -> list:
    """``seqloader.DataLoader`` vs torch's ``DataLoader``: 8_000 uint8 3x224x224 images, batch 64, 2 workers."""
    from seqloader.bench import ImageDataset

    ds = ImageDataset(256 if opts.quick else 8_000)
    return _loader_compare("loader_images", ds, 64, (2,), opts, item_bytes=ds.images[0].nbytes)


#: Workload name -> function(Options) -> rows; ``seqloader.bench`` adds these to its WORKLOADS.
LOADER_WORKLOADS: dict[str, Callable] = {
    "resume": resume_latency,
    "state_size": state_size,
    "loader_tiny": loader_tiny,
    "loader_images": loader_images,
}
