"""L1: a pool of daemon threads for I/O-bound work, one per process.

Remote reads and decoders that release the GIL wait on latency, not on the CPU: a few threads
overlap them. :meth:`ThreadPool.map` is ``[fn(x) for x in items]`` with at most ``num_threads``
calls running at once, results in item order, and the error ``[fn(x) for x in items]`` would
raise. A data source calls it inside a worker to overlap the range reads of one batch. (Items of a
sequence computed ahead by threads are the thread executor's business:
:mod:`seqloader.prefetcher.threads`.)

Threads start on first use, as many as there are queued jobs, up to ``num_threads``; they are
daemon threads and take jobs from one FIFO queue. A pool belongs to a process: it keeps its lock,
queue and threads per pid, so after ``os.fork()`` a child's first call builds its own (the
parent's lock may have been held by a parent thread at the fork, so the child never touches it);
jobs queued in the parent are not inherited. A pool cannot be pickled (``TypeError``): an object that holds one (a
data source) drops it in ``__getstate__`` and makes a new one when it first needs it.

The shutdown protocol is the NOTE in :mod:`seqloader.threads.engine`.
"""

from seqloader.threads.engine import CHECK_INTERVAL, CLOSE_TIMEOUT, Outcome
from seqloader.threads.pool import ThreadPool

__all__ = ["CHECK_INTERVAL", "CLOSE_TIMEOUT", "Outcome", "ThreadPool"]
