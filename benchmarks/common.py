"""What every workload shares: :class:`Options`, :class:`Row`, the datasets and the timing helpers.

A workload is a function ``(Options) -> list[Row]``; :func:`format_rows` prints rows as a table.
This module imports neither seqloader nor any workload module.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

import numpy as np

__all__ = ["CpuDataset", "ImageDataset", "IntDataset", "Options", "Row", "best_of", "epoch_seconds",
           "first_batch_seconds", "format_rows", "mb_per_s", "per_call_seconds", "size_label"]


@dataclasses.dataclass(frozen=True)
class Options:
    """Sizes and repetitions shared by every workload."""

    quick: bool = False
    repeat: int = 1


@dataclasses.dataclass(frozen=True)
class Row:
    """One measurement: ``value`` in ``unit`` (higher is better unless unit is ``s``, ``µs`` or ``%``).

    ``ratio`` compares the row with torch's on the same workload, oriented so that higher is
    better: throughput over torch's, or torch's seconds over these; ``None`` where torch has no
    counterpart. ``notes`` is free text for what the columns cannot say.
    """

    workload: str
    loader: str
    num_workers: int
    value: float
    unit: str
    mb_per_s: float | None = None
    ratio: float | None = None
    notes: str = ""


# --------------------------------------------------------------------------- datasets


class IntDataset:
    """``n`` ints: item ``i`` is ``i``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class ImageDataset:
    """``n`` uint8 arrays of ``shape``, cycling over 256 distinct random images."""

    def __init__(self, n: int, shape=(3, 224, 224), distinct: int = 256):
        self.n = n
        self.images = np.random.default_rng(0).integers(0, 256, (min(distinct, n), *shape), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.images[i % len(self.images)]


class CpuDataset:
    """``n`` items each costing ``size``-element numpy work (~1 ms at 30_000)."""

    def __init__(self, n: int, size: int = 30_000):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        a = np.random.default_rng(i).random(self.size)
        return float(np.sort(a)[:: max(1, self.size // 100)].sum())


# --------------------------------------------------------------------------- timing


def best_of(repeat: int, runs: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Call every run ``repeat`` times, interleaved in dict order; the least seconds per label.

    Each run returns the seconds it measured (so it can leave set-up out of its timing).
    """
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for label, run in runs.items():
            best[label] = min(best[label], run())
    return best


def epoch_seconds(cls: Callable[..., Iterable[object]], dataset, batch_size: int, num_workers: int, **kwargs) -> float:
    """Seconds to build ``cls(dataset, batch_size=..., num_workers=..., **kwargs)`` and read one epoch
    (workers, if any, start and stop inside the timing)."""
    t0 = time.perf_counter()
    for _ in cls(dataset, batch_size=batch_size, num_workers=num_workers, **kwargs):
        pass
    return time.perf_counter() - t0


def first_batch_seconds(make: Callable[[], object]) -> float:
    """Seconds to build a loader with ``make()`` and take its first batch."""
    t0 = time.perf_counter()
    loader = make()
    next(iter(loader))
    return time.perf_counter() - t0


def mb_per_s(n: int, item_bytes: int | None, seconds: float) -> float | None:
    """Megabytes per second for ``n`` items of ``item_bytes`` in ``seconds``; ``None`` if no size."""
    return None if item_bytes is None else n * item_bytes / seconds / 1e6


def per_call_seconds(f: Callable[[int], object], calls: int) -> float:
    """Mean seconds of ``f(i)`` over ``i = 0 .. calls - 1`` (for calls far below a millisecond)."""
    t0 = time.perf_counter()
    for i in range(calls):
        f(i)
    return (time.perf_counter() - t0) / calls


def size_label(n: int) -> str:
    """``n`` as ``10**k`` when it is a power of ten, else with thousands separators.

    Example:
        >>> size_label(10**8), size_label(1), size_label(2_000)
        ('10**8', '10**0', '2,000')
    """
    k = len(str(n)) - 1
    return f"10**{k}" if n == 10**k else f"{n:,}"


# --------------------------------------------------------------------------- output


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


#: Units whose values are shown with 4 significant digits (the others are rounded to integers).
_PRECISE_UNITS = ("s", "µs", "%")


def format_rows(rows: list[Row], markdown: bool) -> str:
    """Rows as aligned text or a markdown table.

    Example:
        >>> print(format_rows([Row("tiny", "torch", 2, 1234.4, "samples/s"),
        ...                    Row("mix", "seqloader", 0, 12.345, "µs", notes="no torch counterpart")], markdown=True))
        | workload | loader | workers | value | unit | MB/s | ratio | notes |
        |---|---|---|---|---|---|---|---|
        | tiny | torch | 2 | 1,234 | samples/s |  |  |  |
        | mix | seqloader | 0 | 12.35 | µs |  |  | no torch counterpart |
        >>> print(format_rows([], markdown=False))
        workload  loader  workers  value  unit  MB/s  ratio  notes
    """
    head = ["workload", "loader", "workers", "value", "unit", "MB/s", "ratio", "notes"]
    body = [[r.workload, r.loader, str(r.num_workers), _fmt(r.value, ".4g" if r.unit in _PRECISE_UNITS else ",.0f"),
             r.unit, _fmt(r.mb_per_s, ",.0f"), _fmt(r.ratio, ".2f") + ("x" if r.ratio is not None else ""), r.notes]
            for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body])
