"""``prefetch``: build a :class:`~seqloader.prefetcher.prefetch.Prefetch` (the public entry of L2), or
with ``method="thread"`` a :class:`~seqloader.sequences.threaded.ThreadPrefetch`.

The process backend is imported on first use, so ``prefetch(..., method="thread")`` never imports
torch or the shared-memory transport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence, overload

from seqloader.errors import check_positive_int
from seqloader.prefetcher.checks import check_restarts, check_seq, check_timeout, check_workers, resolve_context
from seqloader.sequences.threaded import ThreadPrefetch

if TYPE_CHECKING:  # imported lazily below: importing it imports torch
    from seqloader.prefetcher.prefetch import Prefetch

__all__ = ["prefetch"]

#: The backends of ``prefetch``.
METHODS = ("process", "thread")


@overload
def prefetch(seq: Sequence, num_workers: int, *, method: Literal["process"] = ..., prefetch_factor: int = ...,
             multiprocessing_context: Any = ..., worker_init_fn: Callable[[int], None] | None = ...,
             timeout: float = ..., shared: Any = ..., affinity: bool = ..., restarts: int = ...,
             respawn: Callable[[int], Any] | None = ...,
             describe: Callable[[Any, int], str] | None = ...) -> Prefetch: ...


@overload
def prefetch(seq: Sequence, num_workers: int, *, method: Literal["thread"], prefetch_factor: int = ...,
             multiprocessing_context: Any = ..., worker_init_fn: Callable[[int], None] | None = ...,
             timeout: float = ..., shared: Any = ..., affinity: bool = ..., restarts: int = ...,
             respawn: Callable[[int], Any] | None = ...,
             describe: Callable[[Any, int], str] | None = ...) -> ThreadPrefetch: ...


def prefetch(seq: Sequence, num_workers: int, *, method: str = "process", prefetch_factor: int = 2,
             multiprocessing_context: Any = None, worker_init_fn: Callable[[int], None] | None = None,
             timeout: float = 0, shared: Any = None, affinity: bool = True, restarts: int = 0,
             respawn: Callable[[int], Any] | None = None,
             describe: Callable[[Any, int], str] | None = None) -> Prefetch | ThreadPrefetch:
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
    (:class:`~seqloader.sequences.threaded.ThreadPrefetch`, built on
    :class:`seqloader.threads.ThreadPool`): the same ordering, seeking, error and timeout rules,
    for items that wait on I/O or on code that releases the GIL. Nothing is pickled or copied,
    torch is not imported, and the process-only arguments (``multiprocessing_context``,
    ``worker_init_fn``, ``shared``, ``affinity``, ``restarts``, ``respawn``, ``describe``) are refused.

    With ``restarts=N`` a worker that dies (killed by a signal, a segfault, ``os._exit``) is
    replaced by a fresh one with the same ``worker_id`` and ``worker_init_fn``, which recomputes
    the items the reader had not got yet, at most ``N`` times per sequence; an item that kills
    two workers is never computed a third time (:mod:`seqloader.prefetcher.healing`).

    Args:
        seq: a sequence (``len`` and integer indexing); picklable for ``spawn``/``forkserver``.
        num_workers: worker processes (threads for ``method="thread"``), ``>= 1`` (there is no
            in-process fallback: read ``seq``).
        method: ``"process"`` (default) or ``"thread"``.
        prefetch_factor: jobs in flight per worker, ``>= 1``.
        multiprocessing_context: ``None`` (platform default), ``"fork"``, ``"spawn"``,
            ``"forkserver"`` or a ``multiprocessing`` context object.
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
        describe: ``describe(seq, i) -> str``, the words for item ``i`` of ``seq`` (the sequence
            being read: the first, or the latest :meth:`Prefetch.reset`'s) in the messages about a
            dead worker (the healing WARNING, ``WorkerDied``); ``None``: ``"item {i}"``. A layer
            above names its items this way (the loader: a batch and its dataset indices) without
            the prefetcher knowing what they are.

    Returns:
        A :class:`Prefetch` of ``len(seq)`` items (a ``ThreadPrefetch`` for ``method="thread"``).

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
        ValueError: prefetch: shared applies to method='process' only (got [1] with method='thread'); threads share this process's objects
    """
    if method not in METHODS:
        raise ValueError(f"prefetch: method must be 'process' or 'thread' (got {method!r})")
    check_seq("prefetch", seq)
    if method == "thread":
        _check_thread_arguments(multiprocessing_context, worker_init_fn, shared, affinity, restarts, respawn,
                                describe)
        return ThreadPrefetch(seq, check_workers(num_workers), prefetch_factor, timeout)
    from seqloader.prefetcher.prefetch import Prefetch  # lazily: it imports torch

    workers = check_workers(num_workers)
    prefetch_factor = check_positive_int("prefetch", "prefetch_factor", prefetch_factor)
    ctx = resolve_context(multiprocessing_context)
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"prefetch: worker_init_fn must be callable or None (got {type(worker_init_fn).__name__})")
    if not isinstance(affinity, bool):
        raise TypeError(f"prefetch: affinity must be a bool (got {type(affinity).__name__})")
    restarts = check_restarts(restarts, respawn)
    if describe is not None and not callable(describe):
        raise TypeError(f"prefetch: describe must be callable or None (got {type(describe).__name__})")
    return Prefetch(seq, workers, prefetch_factor, ctx, worker_init_fn, check_timeout(timeout), shared, affinity,
                    restarts, respawn, describe)


def _check_thread_arguments(multiprocessing_context: Any, worker_init_fn: Any, shared: Any, affinity: Any,
                            restarts: Any, respawn: Any, describe: Any = None) -> None:
    """Refuse the process-only arguments of :func:`prefetch` under ``method="thread"``."""
    why = {
        "multiprocessing_context": "threads start no process",
        "worker_init_fn": "threads share this process: do the set-up before prefetch, or open per-thread "
                          "resources lazily (threading.local)",
        "shared": "threads share this process's objects",
        "affinity": "any free thread computes the next queued item",
        "restarts": "threads do not die as processes do",
        "respawn": "threads do not die as processes do",
        "describe": "it names items in the messages about dead workers, and threads do not die as processes do",
    }
    given = {"multiprocessing_context": multiprocessing_context, "worker_init_fn": worker_init_fn,
             "shared": shared, "affinity": None if affinity is True else affinity,
             "restarts": None if restarts == 0 else restarts, "respawn": respawn, "describe": describe}
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"prefetch: {name} applies to method='process' only (got {value!r} with "
                             f"method='thread'); {why[name]}")
