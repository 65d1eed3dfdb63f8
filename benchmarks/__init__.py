"""seqloader's benchmarks against ``torch.utils.data.DataLoader``; not part of the installed package.

Run them from a checkout of the repository (the folder that holds ``benchmarks/``)::

    python -m benchmarks                       # every workload, full size
    python -m benchmarks --workloads tiny --quick --markdown

Each workload runs seqloader and torch on the same dataset, batch size and number of workers in
the same process and returns :class:`~benchmarks.common.Row` objects; ``ratio`` is seqloader's
throughput over torch's (time-to-first-batch rows: torch's time over seqloader's, so higher is
better in every row; rows without a torch counterpart have none). :data:`WORKLOADS` maps each
name to its function ``(Options) -> rows``: ``benchmarks.prefetch`` holds the bare
``seqloader.prefetch`` workloads, ``benchmarks.loader`` the ``seqloader.DataLoader`` ones on
map-style datasets, ``benchmarks.iterable`` those on an ``IterableDataset``,
``benchmarks.features`` those of ``in_order=False`` and ``stats()``, ``benchmarks.scale`` the costs
that should stay flat in the dataset's size (resume, ``mix``), ``benchmarks.sources`` the data
sources, ``benchmarks.packing`` ``seqloader.pack`` against Grain's packing, ``benchmarks.threads``
thread workers against worker processes (issue 28; its files and baselines in
``benchmarks.threads_data``), ``benchmarks.columnar`` where a columnar batch's CPU goes at
``num_workers=0`` against a pyarrow scan and ``benchmarks.columnar_workers`` the same pipeline on
every executor against ``num_workers=0`` and torch (issue 43), ``benchmarks.pretraining`` the training
thread's cost per batch of token windows over a memory map against a plain ``np.memmap`` loop
(issue 46), and ``benchmarks.common`` what they share. :data:`OPT_IN` holds the workloads that run only when
named: ``benchmarks.ray``, the Ray executor on a local cluster against the process executor
(minutes: clusters started, nodes killed), and ``benchmarks.autotune``, ``autotune=True`` against a
grid of fixed configurations (issue 38; minutes)::

    python -m benchmarks --workloads ray_overhead,ray_scaling,ray_node_loss --markdown
    python -m benchmarks --workloads autotune_latency,autotune_python,autotune_parquet,autotune_tar --markdown
"""

from __future__ import annotations

from typing import Callable, Iterable

from benchmarks.autotune import AUTOTUNE_WORKLOADS
from benchmarks.columnar import COLUMNAR_WORKLOADS
from benchmarks.columnar_workers import COLUMNAR_WORKER_WORKLOADS
from benchmarks.common import Options, Row, format_rows
from benchmarks.features import FEATURE_WORKLOADS
from benchmarks.iterable import ITERABLE_WORKLOADS
from benchmarks.loader import LOADER_WORKLOADS
from benchmarks.packing import PACKING_WORKLOADS
from benchmarks.prefetch import PREFETCH_WORKLOADS
from benchmarks.pretraining import PRETRAINING_WORKLOADS
from benchmarks.ray import RAY_WORKLOADS
from benchmarks.scale import SCALE_WORKLOADS
from benchmarks.sources import SOURCE_WORKLOADS
from benchmarks.threads import THREADS_WORKLOADS

__all__ = ["OPT_IN", "Options", "Row", "WORKLOADS", "format_rows", "run"]

#: Workload name -> function(Options) -> rows, in the order ``python -m benchmarks`` runs them.
WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    **PREFETCH_WORKLOADS, **LOADER_WORKLOADS, **ITERABLE_WORKLOADS, **FEATURE_WORKLOADS, **SCALE_WORKLOADS,
    **SOURCE_WORKLOADS, **PACKING_WORKLOADS, **THREADS_WORKLOADS, **COLUMNAR_WORKLOADS,
    **COLUMNAR_WORKER_WORKLOADS, **PRETRAINING_WORKLOADS}
#: Workloads run only when named (``--workloads``), never by default: they start Ray clusters
#: (``benchmarks.ray``), or run a grid of fixed configurations against ``autotune=True``
#: (``benchmarks.autotune``, minutes).
OPT_IN: dict[str, Callable[[Options], list[Row]]] = {**RAY_WORKLOADS, **AUTOTUNE_WORKLOADS}


def run(names: Iterable[str], opts: Options) -> list[Row]:
    """Run the named workloads in order and return all their rows."""
    rows: list[Row] = []
    for name in names:
        rows += {**WORKLOADS, **OPT_IN}[name](opts)
    return rows
