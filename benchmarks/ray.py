"""Ray workloads: the Ray executor (``prefetch(method=RayWorkers(...))``) on a cluster of this machine.

Opt-in (``benchmarks.OPT_IN``): run only when named, e.g. ``python -m benchmarks --workloads
ray_overhead,ray_scaling,ray_node_loss``.

Each workload starts a :class:`seqloader.testing.LocalRayCluster` (a head, which runs this
process, and data nodes of 1 CPU each, every node its own raylet on loopback; ~10 s, outside
every timing) and stops it. Workers are started before each timing (``Prefetch.start``), for
Ray and for processes alike: a Ray actor's start-up (a fresh process importing torch) is seconds
and would hide the steady state. There is no torch counterpart; ``ratio`` compares Ray with the
process executor on the same cores.

* ``ray_overhead``: a CPU-bound pipeline (items of ~2 ms of numpy work, batch 8) through 2 worker
  processes and through 2 Ray actors on 2 data nodes (the same 2 cores); then the latency one
  batch costs (1 worker, ``prefetch_factor=1``, no compute) for a small and a 1 MB batch: what
  the object store adds per batch is the difference.
* ``ray_scaling``: the driver's CPU seconds per received batch (``time.process_time``: Ray's
  threads in this process included) with 4 actors that compute nothing, for 64 B, 1 MB and 8 MB
  batches (a fixed cost per batch plus a cost per byte), and the work of one item of the
  ``ray_overhead`` pipeline; from them, a model of batches/s against the number of CPU hosts (16
  cores each), ``min(hosts * 16 / work_per_batch, 1 / receive_cpu_per_batch)``, for batches of 256
  ImageNet-sized images (38.5 MB) whose items cost what the pipeline's measured cost, or 20 ms
  (a heavy decode and augmentation, assumed): where the trainer's receive path becomes the limit.
* ``ray_node_loss``: 2 actors, one on each of 2 data nodes, ``restarts=100``; 20 times (2 with
  ``--quick``): add a node, SIGKILL a node that runs an actor (``remove_node``), and time from the
  kill to the first item read from the replacement (items name their process); then the items
  lost and duplicated over everything read (in order, against the oracle). With the cluster's
  fast health checks (:data:`~seqloader.testing.ray_cluster.FAST_HEALTH_CHECKS`), and 2 kills
  with Ray's default ones.
"""

from __future__ import annotations

import math
import os
import pathlib
import threading
import time

import numpy as np
from torch.utils.data import default_collate

from benchmarks.common import CpuDataset, Options, Row, best_of
from seqloader import RayWorkers, batch, gather, prefetch, smap

__all__ = ["RAY_WORKLOADS", "ray_node_loss", "ray_overhead", "ray_scaling"]

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
ON_DATA = RayWorkers(resources={"data": 1})
#: Cores of one CPU host in the scaling model.
HOST_CORES = 16
ITEM_SIZE = 120_000  # CpuDataset's numpy work per item: ~2 ms here


def _cluster(data_nodes: int, **kw):
    from seqloader.testing import LocalRayCluster

    return LocalRayCluster(data_nodes=data_nodes, cpus=1, pythonpath=[ROOT], **kw)


def _missing() -> list[Row] | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return [Row("ray", "ray", 0, math.nan, "-", notes="ray is not installed: pip install seqloader[ray]")]
    return None


def _epoch(seq, workers: int, method, **kw) -> float:
    with prefetch(seq, workers, method=method, **kw) as p:
        p.start()
        t0 = time.perf_counter()
        for _ in p:
            pass
        return time.perf_counter() - t0


class Payload:
    """Item ``i``: ``nbytes`` of uint8 (no compute)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def __call__(self, i: int) -> np.ndarray:
        return np.full(self.nbytes, i % 251, dtype=np.uint8)


def _latency(n: int, nbytes: int, method) -> float:
    """Seconds per item read one at a time (1 worker, nothing read ahead)."""
    return _epoch(smap(Payload(nbytes), range(n)), 1, method, prefetch_factor=1) / n


def ray_overhead(opts: Options) -> list[Row]:
    """CPU-bound throughput, Ray actors against worker processes on the same cores; per-batch latency."""
    missing = _missing()
    if missing:
        return missing
    n, k = (160, 8) if opts.quick else (1_600, 8)
    ds = CpuDataset(n, size=ITEM_SIZE)
    seq = batch(gather(ds, np.arange(n)), k, collate_fn=default_collate)
    t0 = time.perf_counter()
    for i in range(min(n, 50)):
        ds[i]
    per_item = (time.perf_counter() - t0) / min(n, 50)
    with _cluster(2):
        best = best_of(opts.repeat, {"process": lambda: _epoch(seq, 2, "process"),
                                     "ray": lambda: _epoch(seq, 2, ON_DATA)})
        m = 50 if opts.quick else 400
        lat = {(what, size): _latency(m, size, method) for size in (64, 1 << 20)
               for what, method in (("process", "process"), ("ray", ON_DATA))}
    note = f"items of {per_item * 1e3:.2f} ms (measured in this process), batch {k}"
    rows = [Row("ray_overhead", "process executor", 2, n / best["process"], "samples/s", notes=note),
            Row("ray_overhead", "ray, 2 nodes x 1 CPU", 2, n / best["ray"], "samples/s",
                ratio=best["process"] / best["ray"], notes=note + "; ratio: Ray over processes")]
    for size, label in ((64, "64 B"), (1 << 20, "1 MB")):
        added = lat[("ray", size)] - lat[("process", size)]
        rows += [Row("ray_latency", f"process executor, {label}", 1, lat[("process", size)], "s"),
                 Row("ray_latency", f"ray, {label}", 1, lat[("ray", size)], "s",
                     ratio=lat[("process", size)] / lat[("ray", size)],
                     notes=f"the object store adds {added * 1e3:.2f} ms per batch")]
    return rows


def _receive_cpu(n: int, nbytes: int) -> tuple[float, float]:
    """(driver CPU seconds per batch, batches/s) reading ``n`` batches of ``nbytes`` from 4 actors."""
    with prefetch(smap(Payload(nbytes), range(n)), 4, method=RayWorkers(num_cpus=0.25, resources={"data": 0.5})) as p:
        p.start()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in p:
            pass
        return (time.process_time() - c0) / n, n / (time.perf_counter() - t0)


#: The batch of the scaling model: 256 images of 3x224x224 uint8 (38.5 MB).
MODEL_ITEMS, MODEL_BYTES = 256, 256 * 150_528
#: Seconds of one core per item in the model besides the measured pipeline's: a heavy decode and augmentation.
HEAVY_ITEM_S = 0.020


def ray_scaling(opts: Options) -> list[Row]:
    """A model of batches/s against CPU hosts, from measured per-batch costs (see the module docstring)."""
    missing = _missing()
    if missing:
        return missing
    ds = CpuDataset(64, size=ITEM_SIZE)
    t0 = time.perf_counter()
    for i in range(64):
        ds[i]
    per_item = (time.perf_counter() - t0) / 64  # seconds of one core per item
    n = {64: 200 if opts.quick else 2_000, 1 << 20: 100 if opts.quick else 1_000, 8 << 20: 20 if opts.quick else 200}
    with _cluster(2):
        recv = {size: _receive_cpu(count, size) for size, count in n.items()}
    fixed = recv[64][0]  # driver CPU per batch, whatever its size ...
    per_byte = (recv[8 << 20][0] - fixed) / (8 << 20)  # ... plus this per byte
    rows = [Row("ray_scaling", "work per item", 1, per_item, "s", notes=f"CpuDataset({ITEM_SIZE}), one core")]
    for size, label in ((64, "64 B"), (1 << 20, "1 MB"), (8 << 20, "8 MB")):
        cpu, rate = recv[size]
        rows.append(Row("ray_scaling", f"trainer receive, {label} batches", 4, 1 / cpu, "batches/s",
                        notes=f"{cpu * 1e6:,.0f} µs of driver CPU per batch; {rate:,.0f} batches/s measured here "
                              "(4 actors sharing the 2 cores)"))
    limit = 1 / (fixed + per_byte * MODEL_BYTES)
    for item_s, what in ((per_item, "measured"), (HEAVY_ITEM_S, "assumed")):
        work = MODEL_ITEMS * item_s
        for hosts in (1, 2, 4, 8, 16, 32, 64):
            supply = hosts * HOST_CORES / work
            rows.append(Row("ray_scaling", f"model: items of {item_s * 1e3:.0f} ms ({what}), {hosts} host(s)",
                            hosts * HOST_CORES, min(supply, limit), "batches/s",
                            mb_per_s=min(supply, limit) * MODEL_BYTES / 1e6,
                            notes=f"limit: the trainer's receive path ({limit:,.1f} batches/s)" if supply >= limit
                            else f"limit: the hosts' CPUs ({HOST_CORES} cores each)"))
    return rows


class Tagged:
    """Item ``i``: ``(i, pid of the process computing it)``, after ``size`` elements of numpy work."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, i: int) -> tuple[int, int]:
        np.sort(np.random.default_rng(i).random(self.size))
        return i, os.getpid()


def _kills(kills: int, fast: bool) -> tuple[list[float], int, int, int]:
    """Kill ``kills`` nodes one after another while reading; (seconds from each kill to the first
    item from its replacement, items read, lost, duplicated)."""
    from seqloader.testing.ray_cluster import FAST_HEALTH_CHECKS

    got: list[tuple[int, int, float]] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            with prefetch(smap(Tagged(20_000), range(10**7)), 2, method=ON_DATA, restarts=kills + 2) as p:
                for i in range(10**7):
                    item, pid = p[i]
                    got.append((item, pid, time.perf_counter()))
                    if stop.is_set():
                        return
        except BaseException as exc:  # reported below
            failure.append(exc)

    def wait(pred, bound=300.0) -> None:
        deadline = time.monotonic() + bound
        while not pred():
            if failure or time.monotonic() > deadline:
                raise RuntimeError(f"ray_node_loss: the reader failed or stalled ({failure})")
            time.sleep(0.005)

    seconds = []
    with _cluster(2, health_checks=FAST_HEALTH_CHECKS if fast else {}) as cluster:
        reader = threading.Thread(target=read)
        reader.start()
        try:
            for _ in range(kills):
                wait(lambda: len(got) > 50)
                pids = {pid for _, pid, _ in got}
                before = len(got)
                cluster.add_node()
                victim = cluster.data_nodes[0]  # the oldest: it runs an actor (1 CPU, 1 actor per node)
                wait(lambda: len(got) > before + 20)  # reading goes on meanwhile
                t_kill = time.perf_counter()
                cluster.remove_node(victim.node_id)
                wait(lambda: any(pid not in pids for _, pid, t in got[before:]))
                seconds.append(next(t for _, pid, t in got[before:] if pid not in pids) - t_kill)
        finally:
            stop.set()
            reader.join(300)
    if failure:
        raise failure[0]
    items = [i for i, _, _ in got]
    lost = len(set(range(len(items))) - set(items))
    return seconds, len(items), lost, len(items) - len(set(items))


def ray_node_loss(opts: Options) -> list[Row]:
    """Node kills while reading: time to the first resubmitted item, items lost and duplicated."""
    missing = _missing()
    if missing:
        return missing
    rows = []
    for fast, kills in ((True, 2 if opts.quick else 20), (False, 1 if opts.quick else 2)):
        seconds, n, lost, dup = _kills(kills, fast)
        checks = "fast health checks" if fast else "Ray's default health checks"
        rows.append(Row("ray_node_loss", f"kill to first resubmitted item ({checks})", 2, float(np.median(seconds)),
                        "s", notes=f"median of {kills} kills, max {max(seconds):.2f} s; {n:,} items read: "
                                   f"{lost} lost, {dup} duplicated"))
    return rows


RAY_WORKLOADS = {"ray_overhead": ray_overhead, "ray_scaling": ray_scaling, "ray_node_loss": ray_node_loss}
