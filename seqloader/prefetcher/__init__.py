"""L2: the prefetcher: evaluation of sequence items in worker processes, results in shared memory.

Public through ``seqloader.prefetch`` and ``seqloader.Prefetch`` (this package is not named
``prefetch`` because that name is the public function's). It knows nothing of torch's
``DataLoader``; see :mod:`seqloader.prefetcher.prefetch`.
"""
