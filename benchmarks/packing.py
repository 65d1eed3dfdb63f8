"""Packing workloads: ``seqloader.pack`` against Grain's packing on the same documents.

The documents have lognormal lengths (median 300 tokens, sigma 1), packed into items of 2,048
tokens. Grain (``grain.experimental.BestFitPackIterDataset``/``FirstFitPackIterDataset``, the
``bench`` extra) refuses documents longer than an item, so the first two workloads truncate the
documents to 2,048 tokens for both; the resume workload keeps them whole (``overlong="split"``).

* ``packing_padding``: the fraction of the items' tokens that are padding, over all documents
  (100,000; quick: 5,000): seqloader's best fit at windows of 256, 1,024 and 4,096 documents and
  first fit at 1,024, against Grain's best fit with 64, 256 and 1,024 bins and first fit with 256.
  ``ratio``: Grain's best-fit padding with 256 bins over this row's (higher is better).
* ``packing_throughput``: packed items per second, one process (50,000 documents; quick: 5,000).
  seqloader reading its items in order (``pack[j]``, ``j = 0, 1, ...``), in batches of 8
  (``__getitems__``, what the loader calls), and in a shuffled order (what ``shuffle=True`` reads:
  an item costs the same wherever it is); the count index (lengths read with ``len``) is built
  first and timed on its own row. Grain iterating ``BestFitPackIterDataset`` (256 bins,
  ``shuffle_bins=False``) over ``MapDataset.source(docs).to_iter_dataset()``, with read threads
  off (``ReadOptions(num_threads=0, prefetch_buffer_size=0)``: faster here) and with its
  defaults. ``ratio``: over Grain with read threads off.
* ``packing_resume``: 10**7 documents (quick: 10**5) whose tokens are computed from their
  position (no storage), ``lengths=`` given. The count index is built once (its own row), then the
  seconds from building a fresh ``pack`` (its index file loaded and checked) and a
  ``seqloader.DataLoader`` (batch 8, ``shuffle=True``), through ``load_state_dict`` of a state at
  90% of the epoch, to the first packed batch; and the same from ``load_state_dict`` alone (the
  pack already built). The batch is checked against the items at ``indices_at`` (bit-identical).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch

import seqloader
from benchmarks.common import Options, Row, best_of, size_label

__all__ = ["PACKING_WORKLOADS", "Tokens", "lognormal_lengths", "packing_padding", "packing_resume",
           "packing_throughput"]

LENGTH = 2048
WINDOW = 1024


def lognormal_lengths(n: int, seed: int = 0, cap: int | None = LENGTH) -> np.ndarray:
    """``n`` lengths >= 1, lognormal with median 300 and sigma 1, at most ``cap`` when given."""
    x = np.maximum(1, np.round(np.random.default_rng(seed).lognormal(np.log(300), 1.0, n))).astype(np.int64)
    return (np.minimum(x, cap) if cap else x).astype(np.int32)


class Tokens(seqloader.LazySequence):
    """Document ``i``: ``lengths[i]`` token ids computed from ``i`` (no storage)."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def _item(self, i: int) -> np.ndarray:
        return (np.arange(int(self.lengths[i]), dtype=np.int32) + i) % 50_000

    def __repr__(self) -> str:
        return f"Tokens(len={len(self.lengths)})"


def _docs(n: int) -> list[np.ndarray]:
    lengths = lognormal_lengths(n)
    return [(np.arange(k, dtype=np.int32) + i) % 50_000 for i, k in enumerate(lengths.tolist())]


def _grain(docs: list[np.ndarray], method: str, bins: int, threads: bool = False) -> Any:
    import grain
    import grain.experimental as gx

    opts = None if threads else grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ds = grain.MapDataset.source([{"tokens": d} for d in docs])
    parent = ds.to_iter_dataset() if opts is None else ds.to_iter_dataset(opts)
    cls = gx.BestFitPackIterDataset if method == "best_fit" else gx.FirstFitPackIterDataset
    return cls(parent, length_struct={"tokens": LENGTH}, num_packing_bins=bins, shuffle_bins=False)


def _grain_missing() -> bool:
    try:
        import grain.experimental  # noqa: F401
    except ImportError:
        return True
    return False


def _padding(items: int, tokens: int) -> float:
    return 100 * (1 - tokens / (items * LENGTH))


def packing_padding(opts: Options) -> list[Row]:
    """Padding of best fit and first fit, seqloader's windows against Grain's bins."""
    n = 5_000 if opts.quick else 100_000
    docs = _docs(n)
    tokens = int(sum(len(d) for d in docs))
    note = f"{size_label(n)} documents, lognormal (median 300, sigma 1) truncated to {LENGTH}; length {LENGTH}"
    got: dict[str, float] = {}
    for method, window in [("best_fit", 256), ("best_fit", 1024), ("best_fit", 4096), ("first_fit", 1024)]:
        p = seqloader.pack(docs, LENGTH, method=method, window=window, cache=False)
        got[f"seqloader.pack {method}, window={window} documents"] = _padding(len(p), tokens)
    if not _grain_missing():
        for method, bins in [("best_fit", 64), ("best_fit", 256), ("best_fit", 1024), ("first_fit", 256)]:
            count = sum(1 for _ in _grain(docs, method, bins))
            got[f"Grain {method}, num_packing_bins={bins}"] = _padding(count, tokens)
    ref = got.get("Grain best_fit, num_packing_bins=256")
    rows = []
    for label, pad in got.items():
        extra = "" if ref is None else f"; {pad - ref:+.2f} pp vs Grain best fit (256 bins)"
        rows.append(Row("packing_padding", label, 0, pad, "%", ratio=None if ref is None else ref / pad,
                        notes=note + extra + ("" if ref is not None else "; grain not installed")))
    return rows


def _seconds(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def packing_throughput(opts: Options) -> list[Row]:
    """Items per second: seqloader.pack (in order, in batches, shuffled) against Grain's best fit."""
    n = 5_000 if opts.quick else 50_000
    docs = _docs(n)
    packs: dict[str, Any] = {}

    def build() -> float:
        p = seqloader.pack(docs, LENGTH, window=WINDOW, cache=False)
        dt = _seconds(lambda: len(p))
        packs["p"] = p
        return dt

    t_index = best_of(opts.repeat, {"index": build})["index"]
    p = packs["p"]
    m = len(p)
    order = np.random.default_rng(0).permutation(m).tolist()
    runs = {
        "in order": lambda: _seconds(lambda: [p[j] for j in range(m)]),
        "batches of 8": lambda: _seconds(lambda: [p.__getitems__(list(range(j, min(m, j + 8))))
                                                  for j in range(0, m, 8)]),
        "shuffled": lambda: _seconds(lambda: [p[j] for j in order]),
    }
    if not _grain_missing():
        runs["grain"] = lambda: _seconds(lambda: sum(1 for _ in _grain(docs, "best_fit", 256)))
        runs["grain threads"] = lambda: _seconds(lambda: sum(1 for _ in _grain(docs, "best_fit", 256, threads=True)))
    best = best_of(opts.repeat, runs)
    g = sum(1 for _ in _grain(docs, "best_fit", 256)) if "grain" in best else None
    grain_rate = None if g is None else g / best["grain"]
    note = f"{size_label(n)} documents (truncated to {LENGTH}), length {LENGTH}, window {WINDOW}"
    rows = [Row("packing_throughput", "seqloader.pack: count index build", 0, n / t_index, "documents/s",
                notes=f"{t_index:.3f} s for {size_label(n)} documents (lengths read with len())")]
    for label in ("in order", "batches of 8", "shuffled"):
        rate = m / best[label]
        rows.append(Row("packing_throughput", f"seqloader.pack, {label}", 0, rate, "items/s",
                        mb_per_s=rate * LENGTH * 4 / 1e6, ratio=None if grain_rate is None else rate / grain_rate,
                        notes=note + ("; a random permutation of the items" if label == "shuffled" else "")))
    if grain_rate is not None and g is not None:
        rows.append(Row("packing_throughput", "Grain BestFitPackIterDataset(256 bins), read threads off", 0,
                        grain_rate, "items/s", mb_per_s=grain_rate * LENGTH * 4 / 1e6, notes=note))
        rows.append(Row("packing_throughput", "Grain BestFitPackIterDataset(256 bins), default ReadOptions", 0,
                        g / best["grain threads"], "items/s", mb_per_s=g / best["grain threads"] * LENGTH * 4 / 1e6,
                        notes=note + "; its read-ahead threads poll"))
    else:
        rows.append(Row("packing_throughput", "Grain", 0, 0.0, "items/s", notes="grain not installed"))
    return rows


def _first_batch(make: Callable[[], Any], state: dict) -> tuple[float, Any, Any]:
    t0 = time.perf_counter()
    loader = make()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    return time.perf_counter() - t0, batch, loader


def packing_resume(opts: Options) -> list[Row]:
    """Time to the first packed batch at 90% of a 10**7-document epoch, the index file existing."""
    n, bs = (10**5 if opts.quick else 10**7), 8
    lengths = lognormal_lengths(n, cap=None)
    docs = Tokens(lengths)
    folder = tempfile.mkdtemp(prefix="seqloader-packing-bench-")
    try:
        def make_pack() -> Any:
            return seqloader.pack(docs, LENGTH, window=WINDOW, lengths=lengths, cache_dir=folder)

        built = make_pack()
        t_build = _seconds(lambda: len(built))
        stats = built.index_stats()
        m = len(built)
        state = seqloader.DataLoader(built, batch_size=bs, shuffle=True, seed=0).state_dict()
        state["position"] = (9 * m // 10) // bs * bs

        def fresh() -> float:
            dt, batch, loader = _first_batch(
                lambda: seqloader.DataLoader(make_pack(), batch_size=bs, shuffle=True, seed=0), state)
            _check(batch, loader, state["position"] // bs)
            return dt

        def warm() -> float:
            dt, batch, loader = _first_batch(lambda: seqloader.DataLoader(built, batch_size=bs, shuffle=True,
                                                                          seed=0), state)
            return dt

        fresh()  # first calls, lazy imports: not a measurement
        best = best_of(opts.repeat, {"fresh": fresh, "warm": warm})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    label = size_label(n)
    note = (f"{label} documents ({m:,} items, padding {100 * stats['padding']:.2f}%), batch {bs}, shuffle=True, "
            f"window {WINDOW}; bit-identical to the items at indices_at")
    return [Row("packing_resume", f"seqloader.pack count index build, n={label}", 0, t_build, "s",
                notes=f"from lengths= ({n / t_build:,.0f} documents/s), file written"),
            Row("packing_resume", f"fresh pack + DataLoader + load_state_dict -> first batch, n={label}", 0,
                best["fresh"], "s", notes=note + "; index file mapped and its checksums verified"),
            Row("packing_resume", f"load_state_dict -> first batch, n={label}", 0, best["warm"], "s", notes=note)]


def _check(batch: dict, loader: Any, step: int) -> None:
    """The resumed batch equals the packed items at the positions ``indices_at`` names."""
    p = loader.dataset
    want = [p[j] for j in loader.indices_at(0, step)]
    for key in ("tokens", "segment_ids", "positions", "loss_mask"):
        if not torch.equal(batch[key], torch.as_tensor(np.stack([x[key] for x in want]))):
            raise AssertionError(f"packing_resume: the resumed batch's {key!r} differs from the items at indices_at")


PACKING_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "packing_padding": packing_padding,
    "packing_throughput": packing_throughput,
    "packing_resume": packing_resume,
}
