"""``seqloader.DataLoader`` workloads: resume latency, state size, throughput against torch's loader.

* ``resume``: seconds to the first batch after ``load_state_dict`` at 90% of a shuffled epoch
  of 1_000_000 items (batch 256), against a fresh loader's first batch, and against reaching the
  same batch with torch's ``DataLoader`` by iterating (what a replaying resume costs); when
  torchdata is installed, also its ``StatefulDataLoader`` resumed at the same point.
* ``state_size``: bytes of ``json.dumps(loader.state_dict())`` mid-epoch.
* ``loader_tiny``: throughput of ``seqloader.DataLoader`` against torch's on 200_000 ints,
  batch 256, with 0 and 2 workers (one epoch each, workers started inside the timing).
* ``loader_images``: the same on 8_000 uint8 images 3x224x224, batch 64, 2 workers.
* ``main_cpu``: the guard of the per-batch cost: CPU seconds the training process itself spends
  per batch (``time.process_time`` of the main process over an epoch, after the first batch, so
  workers' start-up is out), 200_000 ints, 2 workers: batch 256, and batch 32 with a
  ``state_dict()`` after every batch; seqloader's process and thread workers against torch's
  ``DataLoader`` (lower is better; a regression of the receive path shows here first).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Callable

import torch.utils.data

from benchmarks.common import (ImageDataset, IntDataset, Options, Row, best_of, epoch_seconds, first_batch_seconds,
                               mb_per_s)
from seqloader import DataLoader

__all__ = ["LOADER_WORKLOADS", "loader_images", "loader_tiny", "main_cpu", "resume_latency", "state_size"]


def resume_latency(opts: Options) -> list[Row]:
    """First batch after ``load_state_dict`` at 90% of a shuffled epoch, vs a fresh first batch."""
    n, bs = (100_000 if opts.quick else 1_000_000), 256
    ds = IntDataset(n)
    state = DataLoader(ds, batch_size=bs, shuffle=True, seed=0).state_dict()
    state["position"] = (9 * n // 10) // bs * bs

    def resumed():
        loader = DataLoader(ds, batch_size=bs, shuffle=True, seed=0)
        loader.load_state_dict(state)
        return loader

    def torch_replay() -> float:
        t0 = time.perf_counter()
        loader = torch.utils.data.DataLoader(ds, batch_size=bs, shuffle=True)
        next(itertools.islice(iter(loader), state["position"] // bs, None))
        return time.perf_counter() - t0

    best = best_of(opts.repeat, {
        "fresh": lambda: first_batch_seconds(lambda: DataLoader(ds, batch_size=bs, shuffle=True, seed=0)),
        "resume": lambda: first_batch_seconds(resumed),
        "torch_replay": torch_replay,
    })
    rows = [Row("resume@90%", "seqloader resume", 0, best["resume"], "s",
                ratio=best["torch_replay"] / best["resume"]),
            Row("resume@90%", "seqloader fresh", 0, best["fresh"], "s"),
            Row("resume@90%", "torch replay", 0, best["torch_replay"], "s")]
    return rows + _torchdata_resume(ds, bs, state["position"] // bs, opts.repeat)


def _torchdata_resume(ds, bs: int, batches: int, repeat: int) -> list[Row]:
    """torchdata's ``StatefulDataLoader`` resumed at the same point, when torchdata is installed."""
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

    best = best_of(repeat, {
        "resume": lambda: first_batch_seconds(resumed),
        "fresh": lambda: first_batch_seconds(lambda: StatefulDataLoader(ds, batch_size=bs, shuffle=True)),
    })
    return [Row("resume@90%", "torchdata resume", 0, best["resume"], "s"),
            Row("resume@90%", "torchdata fresh", 0, best["fresh"], "s")]


def state_size(opts: Options) -> list[Row]:
    """Bytes of the JSON state of a shuffled map-style loader, mid-epoch."""
    loader = DataLoader(IntDataset(1_000_000), batch_size=256, shuffle=True, seed=0)
    it = iter(loader)
    next(it)
    size = len(json.dumps(loader.state_dict()).encode())
    return [Row("state_size", "seqloader", 0, float(size), "bytes")]


def _loader_compare(name: str, ds, batch_size: int, workers: tuple[int, ...], opts: Options,
                    item_bytes: int | None = None) -> list[Row]:
    """Throughput of ``seqloader.DataLoader`` vs torch's ``DataLoader`` (shuffled, same arguments)."""
    rows = []
    n = len(ds)
    for nw in workers:
        best = best_of(opts.repeat, {
            "seqloader": lambda: epoch_seconds(DataLoader, ds, batch_size, nw, shuffle=True),
            "torch": lambda: epoch_seconds(torch.utils.data.DataLoader, ds, batch_size, nw, shuffle=True),
        })
        rows += [Row(name, "seqloader.DataLoader", nw, n / best["seqloader"], "samples/s",
                     mb_per_s(n, item_bytes, best["seqloader"]), ratio=best["torch"] / best["seqloader"]),
                 Row(name, "torch DataLoader", nw, n / best["torch"], "samples/s",
                     mb_per_s(n, item_bytes, best["torch"]))]
    return rows


def loader_tiny(opts: Options) -> list[Row]:
    """``seqloader.DataLoader`` vs torch's ``DataLoader``: 200_000 ints, batch 256, 0 and 2 workers."""
    return _loader_compare("loader_tiny", IntDataset(5_000 if opts.quick else 200_000), 256, (0, 2), opts)


def loader_images(opts: Options) -> list[Row]:
    """``seqloader.DataLoader`` vs torch's ``DataLoader``: 8_000 uint8 3x224x224 images, batch 64, 2 workers."""
    ds = ImageDataset(256 if opts.quick else 8_000)
    return _loader_compare("loader_images", ds, 64, (2,), opts, item_bytes=ds.images[0].nbytes)


def _main_cpu_per_batch(make: Callable[[], object], with_state: bool) -> float:
    """Seconds of this process's CPU per batch over one epoch after its first batch."""
    loader = make()
    it = iter(loader)  # type: ignore[call-overload]
    next(it)
    state = getattr(loader, "state_dict", None) if with_state else None
    c0, k = time.process_time(), 0
    for _ in it:
        k += 1
        if state is not None:
            state()
    spent = time.process_time() - c0
    del it
    return spent / max(1, k)


def main_cpu(opts: Options) -> list[Row]:
    """The training process's CPU per batch: seqloader (processes, threads) vs torch, tiny items."""
    ds = IntDataset(20_000 if opts.quick else 200_000)
    rows = []
    for bs, with_state in ((256, False), (32, True)):
        runs = {
            "torch": lambda: _main_cpu_per_batch(
                lambda: torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=2), False),
            "processes": lambda: _main_cpu_per_batch(
                lambda: DataLoader(ds, batch_size=bs, num_workers=2, seed=0), with_state),
            "threads": lambda: _main_cpu_per_batch(
                lambda: DataLoader(ds, batch_size=bs, num_workers=2, worker_method="thread", seed=0), with_state),
        }
        best = best_of(opts.repeat, runs)
        what = f"batch {bs}" + (", state_dict() every batch" if with_state else "")
        rows.append(Row("main_cpu", "torch DataLoader", 2, best["torch"] * 1e6, "µs", notes=what + " (no state)"))
        for label in ("processes", "threads"):
            rows.append(Row("main_cpu", f"seqloader.DataLoader ({label})", 2, best[label] * 1e6, "µs",
                            ratio=best["torch"] / best[label],
                            notes=what + ("; the thread workers' CPU is in this process too" if label == "threads" else "")))
    return rows


#: Workload name -> function(Options) -> rows.
LOADER_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "resume": resume_latency,
    "state_size": state_size,
    "loader_tiny": loader_tiny,
    "loader_images": loader_images,
    "main_cpu": main_cpu,
}
