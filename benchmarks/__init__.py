"""seqloader's benchmarks against ``torch.utils.data.DataLoader``; not part of the installed package.

Run them from a checkout of the repository (the folder that holds ``benchmarks/``)::

    python -m benchmarks                       # every workload, full size
    python -m benchmarks --workloads tiny --quick --markdown

Each workload runs seqloader and torch on the same dataset, batch size and number of workers in
the same process and returns :class:`~benchmarks.common.Row` objects; ``ratio`` is seqloader's
throughput over torch's (time-to-first-batch rows: torch's time over seqloader's, so higher is
better in every row). :data:`WORKLOADS` maps each name to its function ``(Options) -> rows``:
``benchmarks.prefetch`` holds the bare ``seqloader.prefetch`` workloads, ``benchmarks.loader`` the
``seqloader.DataLoader`` ones, and ``benchmarks.common`` what they share.
"""

from __future__ import annotations

from typing import Callable, Iterable

from benchmarks.common import Options, Row, format_rows
from benchmarks.loader import LOADER_WORKLOADS
from benchmarks.prefetch import PREFETCH_WORKLOADS

__all__ = ["Options", "Row", "WORKLOADS", "format_rows", "run"]

#: Workload name -> function(Options) -> rows, in the order ``python -m benchmarks`` runs them.
WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {**PREFETCH_WORKLOADS, **LOADER_WORKLOADS}


def run(names: Iterable[str], opts: Options) -> list[Row]:
    """Run the named workloads in order and return all their rows."""
    rows: list[Row] = []
    for name in names:
        rows += WORKLOADS[name](opts)
    return rows
