"""``prefetch``: build a :class:`~seqloader.prefetcher.prefetch.Prefetch` (the public entry of L2) on
the executor ``method`` names: worker processes (``"process"``, optionally ``threads_per_worker``
threads inside each), threads of this process (``"thread"``) or Ray actors on a cluster (``"ray"``
or a :class:`~seqloader.prefetcher.ray_options.RayWorkers`).

The options object (:func:`~seqloader.prefetcher.options.choose_executor`) checks the arguments
against its executor and builds it; this module does not branch on which it is. The process and
Ray executors are imported on first use, so ``prefetch(..., method="thread")`` never imports
torch, the shared-memory transport or ``ray``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from seqloader.errors import check_positive_int
from seqloader.prefetcher.checks import check_seq, check_timeout, check_workers
from seqloader.prefetcher.options import ExecutorOptions, choose_executor
from seqloader.prefetcher.prefetch import Prefetch

__all__ = ["prefetch"]

def prefetch(seq: Sequence, num_workers: int, *, method: str | ExecutorOptions = "process", prefetch_factor: int = 2,
             multiprocessing_context: Any = None, worker_init_fn: Callable[[int], None] | None = None,
             timeout: float = 0, shared: Any = None, affinity: bool = True, restarts: int = 0,
             respawn: Callable[[int], Any] | None = None, threads_per_worker: int = 1,
             thread_init_fn: Callable[[int, int], None] | None = None,
             describe: Callable[[Any, int], str] | None = None) -> Prefetch:
    """Compute the items of ``seq`` ahead of the reader, in ``num_workers`` worker processes
    (or, with ``method="thread"``, threads of this process).

    The result is ordered and index-addressable like ``seq``. Reading item ``i`` keeps items
    ``i+1 .. i+num_workers*prefetch_factor`` in flight; reading any other item than the next
    re-targets the workers (items in between are never computed). Workers start on the first
    read (or :meth:`Prefetch.start`) and live until :meth:`Prefetch.close` (or
    ``with``/``del``/gc), across seeks and :meth:`Prefetch.reset`. :meth:`Prefetch.take` reads
    in completion order instead. Arrays and tensors in items come back as views of shared
    memory that stay valid as long as they are referenced.

    Workers do nothing to the global RNGs: under ``fork`` they start with the parent's states,
    so draw randomness with :func:`seqloader.rng_map` (a generator per item), or seed in
    ``worker_init_fn``. ``seqloader.DataLoader`` does the seeding torch's ``DataLoader`` does.

    ``method="thread"`` computes items in ``num_workers`` daemon threads of this process instead
    (:class:`~seqloader.prefetcher.threads.ThreadExecutor`): the same ordering, seeking, error and
    timeout rules, for items that wait on I/O or on code that releases the GIL. Nothing is pickled
    or copied, torch is not imported, ``worker_init_fn(worker_id)`` runs in each thread, and the
    process-only arguments (``multiprocessing_context``, ``shared``, ``restarts``, ``respawn``,
    ``threads_per_worker``, ``thread_init_fn``) are refused. With ``method="process"`` and
    ``threads_per_worker=k``, each worker process computes ``k`` items at once in its own threads
    (:mod:`seqloader.prefetcher.processes.runner`): decoders that release the GIL scale inside the
    process while Python-heavy work keeps its own processes; ``thread_init_fn(worker_id, thread)``
    runs first in each of those threads.

    ``method="ray"`` (or ``method=RayWorkers(...)``, its options) computes items in
    ``num_workers`` Ray actors placed by Ray on the nodes of a cluster
    (:class:`~seqloader.prefetcher.ray.RayExecutor`; ``pip install seqloader[ray]``, and a
    cluster: ``docs/ray.md``): the same ordering, seeking, error, timeout and healing rules; results
    come back through Ray's object store as writable copies; ``shared`` is sent to each actor once;
    ``restarts`` replaces actors lost with their node; the process-only arguments
    (``multiprocessing_context``, ``threads_per_worker``, ``thread_init_fn``) are refused.

    With ``restarts=N`` a worker that dies (killed by a signal, a segfault, ``os._exit``) is
    replaced by a fresh one with the same ``worker_id`` and ``worker_init_fn``, which recomputes
    the items the reader had not got yet, at most ``N`` times per sequence; an item that kills
    two workers is never computed a third time (:mod:`seqloader.prefetcher.healing`).

    ``multiprocessing_context``, ``threads_per_worker`` and ``thread_init_fn`` are the fields of
    :class:`~seqloader.prefetcher.options.ProcessWorkers` (``context``, ``threads``,
    ``thread_init_fn``), spelled as torch spells them: they are folded into the options object at
    once, and every executor gets its arguments from its options object alone.

    Args:
        seq: a sequence (``len`` and integer indexing); picklable for ``spawn``/``forkserver``.
        num_workers: worker processes (threads for ``method="thread"``), ``>= 1`` (there is no
            in-process fallback: read ``seq``).
        method: ``"process"`` (default; torch's word ``"multiprocessing"`` is the same), ``"thread"``,
            ``"ray"``, or an options object: :class:`~seqloader.prefetcher.options.ProcessWorkers`,
            :class:`~seqloader.prefetcher.options.ThreadWorkers` or
            :class:`~seqloader.prefetcher.ray_options.RayWorkers`
            (:func:`~seqloader.prefetcher.options.choose_executor`).
        threads_per_worker: items each worker process computes at once (``method="process"``;
            the same as ``method=ProcessWorkers(threads=...)``).
        thread_init_fn: ``thread_init_fn(worker_id, thread)`` in each thread of a worker process
            (``threads_per_worker > 1``; the same as ``ProcessWorkers(thread_init_fn=...)``, and
            added to a ``ProcessWorkers`` given as ``method`` that has none).
        describe: ``describe(seq, i) -> str``, the words for item ``i`` of ``seq`` (the sequence
            being read: the first, or the latest :meth:`Prefetch.reset`'s) in the messages about a
            dead worker (the healing WARNING, ``WorkerDied``); ``None``: ``"item {i}"``. A layer
            above names its items this way (the loader: a batch and its dataset indices) without
            the prefetcher knowing what they are.
        prefetch_factor: jobs in flight per worker (per thread of a worker process), ``>= 1``.
        multiprocessing_context: ``None`` (platform default), ``"fork"``, ``"spawn"``,
            ``"forkserver"`` or a ``multiprocessing`` context object (the same as
            ``method=ProcessWorkers(context=...)``).
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each worker before it
            computes anything (an error there is raised by :meth:`Prefetch.start` or the
            first read, naming the worker).
        timeout: seconds to wait for one item (:meth:`Prefetch.take`: for any item) before
            :class:`ItemTimeout`; ``0`` waits forever (worker deaths are still detected at once).
        shared: an object sent to each worker once, at start (typically the dataset that
            every sequence passed to :meth:`Prefetch.reset` reads): a later sequence that
            references it is pickled with a reference instead of a copy. Default: ``seq``.
        affinity: ``True`` (default): item ``i`` is computed by worker ``i % num_workers``,
            torch's assignment (a worker may then keep per-process state for its items).
            ``False``: by any worker with room (the least busy), so under :meth:`Prefetch.take`
            a slow item holds up no other item.
        restarts: how many dead workers are replaced while reading one sequence (the first,
            and each :meth:`Prefetch.reset`'s); ``0`` (default): a dead worker raises
            ``WorkerDied``. Each replacement logs a WARNING (logger ``seqloader``) and is
            counted in :meth:`Prefetch.counters`.
        respawn: ``respawn(worker_id) -> seq or None``, called in this process when worker
            ``worker_id`` is replaced: the sequence its replacement reads (``None``: the current
            one). For workers that keep per-process state (a stream), so that the replacement
            resumes right after the last item returned. Needs ``restarts > 0``.

    Returns:
        A :class:`Prefetch` of ``len(seq)`` items.

    Raises:
        TypeError: ``seq`` has no ``len``; an argument has the wrong type.
        ValueError: ``num_workers < 1``, ``prefetch_factor < 1``, ``timeout < 0``, ``restarts < 0``,
            ``respawn`` without ``restarts``, an unknown start method or ``method``, or a
            process-only argument with ``method="thread"``.

    Example:
        >>> with prefetch(range(10), num_workers=2) as p:
        ...     p[0], p[-1], list(p[3:6])
        (0, 9, [3, 4, 5])
        >>> with prefetch(range(10), num_workers=4, method="thread") as p:
        ...     p[0], p[-1], list(p[3:6])
        (0, 9, [3, 4, 5])
        >>> prefetch(range(10), num_workers=0)
        Traceback (most recent call last):
        ValueError: prefetch: num_workers must be a positive int (got 0); to evaluate in this process, read the sequence directly
        >>> prefetch(range(10), num_workers=2, method="thread", shared=[1])
        Traceback (most recent call last):
        ValueError: prefetch: shared applies to worker processes only (got [1] with method='thread'); threads share this process's objects
        >>> prefetch(range(10), num_workers=2, method="ray", threads_per_worker=2)  # checked before Ray is used
        Traceback (most recent call last):
        ValueError: prefetch: threads_per_worker applies to worker processes only (got 2 with method='ray'); each actor computes one item at a time: raise num_workers instead
    """
    options = choose_executor(method, multiprocessing_context=multiprocessing_context,
                              threads_per_worker=threads_per_worker, thread_init_fn=thread_init_fn)
    check_seq("prefetch", seq)
    workers = check_workers(num_workers)
    prefetch_factor = check_positive_int("prefetch", "prefetch_factor", prefetch_factor)
    timeout = check_timeout(timeout)
    for name, fn in (("worker_init_fn", worker_init_fn), ("describe", describe)):
        if fn is not None and not callable(fn):
            raise TypeError(f"prefetch: {name} must be callable or None (got {type(fn).__name__})")
    if not isinstance(affinity, bool):
        raise TypeError(f"prefetch: affinity must be a bool (got {type(affinity).__name__})")
    restarts = options.check("prefetch", shared=shared, restarts=restarts, respawn=respawn)
    executor = options.build(workers, worker_init_fn, seq if shared is None else shared, prefetch_factor)
    return Prefetch(seq, executor, prefetch_factor, timeout, affinity, restarts, respawn, describe)
