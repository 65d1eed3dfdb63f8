"""L0 packing and filtering that stay position-addressable: :func:`pack` and :func:`keep`.

Both are many-to-one: output item ``j`` is no longer input item ``j``. Each op cuts its input
into windows of consecutive items and keeps a small *count index* (the number of outputs at each
window's end), so that output ``j`` is found by one bisection and computed from its window
alone: a pure function of the arguments and ``j``, with no buffer and no state. The index is
built on first use from the documents' lengths (``pack``) or the predicate's results (``keep``),
cached as a data file (numpy arrays and a JSON header, never pickle), checked against the input
it was built from, and reported by ``index_stats()``. See ``docs/packing.md``.

Like the sources, this wing imports neither torch nor multiprocessing. The public names are
re-exported by :mod:`seqloader` (``seqloader.pack``, ``seqloader.keep``).
"""

from seqloader.packing.keep import keep
from seqloader.packing.pack import pack

__all__ = ["keep", "pack"]
