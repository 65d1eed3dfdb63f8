"""Pretraining workload: the training thread's cost per batch of token windows over a memory map (issue 46).

* ``pretraining_windows``: a raw ``uint16`` token file (8,193 windows of 2,049 tokens at stride
  2,048, 33.6 MB; ``--quick``: 513), read as ``seqloader.token_windows(path, 2049, stride=2048)``
  in batches of 8 windows in shuffled order, for one epoch. The baseline is the plain loop a
  trainer writes by hand: ``np.memmap`` of the file, ``np.stack`` of 8 slices at shuffled
  starts, ``torch.from_numpy`` (the copy out of the map, and nothing else). Each row is the
  microseconds the training thread spends in ``next()`` per batch: at ``num_workers=0`` that is
  the whole read; with 2 workers the loop also "trains" 1 ms per batch (a sleep, outside the
  timing) so the workers can keep ahead, and what is left is receiving a batch. The torchtitan
  row (when torchtitan is installed) is ``seqloader.integrations.torchtitan.ParallelAwareDataloader``
  at ``num_workers=0``, which also splits each batch into ``({"input": x[:, :-1]}, x[:, 1:])``.
  ``ratio``: the memmap loop's µs over the row's (higher is better); the notes give the µs beyond it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterable

import numpy as np
import torch

import seqloader
from benchmarks.common import Options, Row, best_of

__all__ = ["PRETRAINING_WORKLOADS", "pretraining_windows"]

L = 2048
BATCH = 8
STEP_S = 0.001  # the simulated training step with workers


def _memmap_epoch(path: str, n: int) -> Iterable[torch.Tensor]:
    """The hand-written loop: shuffled window starts, 8 slices stacked out of a memory map."""
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    order = np.random.default_rng(0).permutation(n)
    for b in range(0, n, BATCH):
        yield torch.from_numpy(np.stack([tokens[s * L:s * L + L + 1] for s in order[b:b + BATCH]]))


def _in_next_us(batches: Iterable[Any], step_s: float) -> tuple[float, int]:
    """``(µs per batch spent in next(), batches)`` over one pass of ``batches``."""
    it = iter(batches)
    spent, count = 0.0, 0
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        spent += time.perf_counter() - t0
        count += 1
        if step_s:
            time.sleep(step_s)
    return spent / count * 1e6, count


def pretraining_windows(opts: Options) -> list[Row]:
    """µs per batch of 8 windows of 2,049 uint16 tokens: memmap loop, seqloader at 0 and 2 workers, torchtitan."""
    n = 513 if opts.quick else 8_193
    tmp = tempfile.mkdtemp(prefix="seqloader-bench-")
    try:
        path = os.path.join(tmp, "train.bin")
        np.random.default_rng(0).integers(0, 50_257, n * L + 1, dtype=np.uint16).tofile(path)
        windows = seqloader.token_windows(path, L + 1, dtype=np.uint16, stride=L)
        assert len(windows) == n

        def loader(num_workers: int) -> Any:
            return seqloader.DataLoader(windows, batch_size=BATCH, shuffle=True, seed=0, num_workers=num_workers)

        runs: dict[str, Callable[[], float]] = {
            "memmap": lambda: _in_next_us(_memmap_epoch(path, n), 0.0)[0],
            "seqloader0": lambda: _in_next_us(loader(0), 0.0)[0],
            "seqloader2": lambda: _in_next_us(loader(2), STEP_S)[0],
        }
        try:
            from seqloader.integrations.torchtitan import ParallelAwareDataloader
        except ImportError:
            ParallelAwareDataloader = None
        if ParallelAwareDataloader is not None:
            runs["torchtitan0"] = lambda: _in_next_us(ParallelAwareDataloader(
                windows, 0, 1, batch_size=BATCH, shuffle=True, seed=0), 0.0)[0]
        for label in runs:  # page the file in (and import what the workers need) before timing
            runs[label]()
        best = best_of(opts.repeat, runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = BATCH * (L + 1) * 2 / 1e6
    base = best["memmap"]
    size = f"{n:,} windows x {L + 1} uint16, batch {BATCH}"

    def row(label: str, name: str, workers: int, extra: str) -> Row:
        us = best[label]
        return Row("pretraining_windows", name, workers, us, "µs", mb / (us / 1e6), ratio=base / us,
                   notes=f"{size}; {us - base:+.1f} µs vs the memmap loop{extra}")

    rows = [Row("pretraining_windows", "np.memmap slice loop", 0, base, "µs", mb / (base / 1e6),
                notes=f"{size}; np.stack of 8 slices + torch.from_numpy (the copy)"),
            row("seqloader0", "seqloader.DataLoader(token_windows)", 0, ""),
            row("seqloader2", "seqloader.DataLoader(token_windows)", 2, f"; in next() only, {STEP_S * 1e3:g} ms step")]
    if "torchtitan0" in best:
        rows.append(row("torchtitan0", "integrations.torchtitan.ParallelAwareDataloader", 0, ""))
    return rows


#: Workload name -> function(Options) -> rows.
PRETRAINING_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {"pretraining_windows": pretraining_windows}
