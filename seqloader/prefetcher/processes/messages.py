"""The messages exchanged between a :class:`~seqloader.prefetcher.prefetch.Prefetch` and its workers.

Every message is a small frozen dataclass, so a message can never be confused with data (no
``-1`` or ``None`` sentinels). Bulk data never travels through the pipes: results and the
exceptions of failed items are written into a shared-memory slot, and the pipe only carries a
:class:`Payload` describing where they are. The parent sends :class:`Job`, :class:`Retarget`,
:class:`Forget` and :class:`Stop` to a worker on that worker's own job pipe. On its own result
pipe a worker first reports its set-up: :class:`Ready` once ``worker_init_fn`` has returned, or
:class:`WorkerFailed` (and exits) if it raised; :meth:`~seqloader.prefetcher.prefetch.Prefetch.start`
waits for one of the two from every worker. It then answers every :class:`Job` with exactly one
:class:`Result`, :class:`Failure` or :class:`Cancelled`, in the order the jobs were sent, and
reports a sequence that a :class:`Retarget` could not unpickle with :class:`WorkerFailed` before
it exits.

``gen`` (generation) numbers order the parent's requests: the parent increments it on every seek
and every :meth:`~seqloader.prefetcher.prefetch.Prefetch.reset`; a worker cancels any queued job
whose ``gen`` is older than the newest one it has seen, and the parent drops replies of old
generations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Began",
    "Cancelled",
    "Failure",
    "Forget",
    "Job",
    "Outcome",
    "Payload",
    "Ready",
    "Result",
    "Retarget",
    "Stop",
    "Warned",
    "WorkerConfig",
    "WorkerFailed",
]


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to start; passed as a ``Process`` argument, not through a pipe.

    ``threads`` jobs run at once in the worker (threads inside the process,
    :mod:`~seqloader.prefetcher.processes.runner`); each such thread first calls
    ``thread_init_fn(worker_id, thread)`` when given.

    ``seq`` and ``shared`` are passed beside it (objects, not bytes): under ``fork`` they are
    inherited without pickling, under ``spawn``/``forkserver`` they are pickled once together
    (with ``worker_init_fn``), so an object referenced by several of them arrives once.
    """

    worker_id: int
    num_workers: int
    parent_pid: int
    worker_init_fn: Any
    gen: int
    threads: int = 1
    thread_init_fn: Any = None


@dataclass(frozen=True)
class Job:
    """Compute item ``index`` of the current sequence into slot ``slot_id``.

    ``slot_name`` is the segment's name; the worker opens it the first time it sees ``slot_id``
    and keeps it mapped until :class:`Forget`. ``alone``: a worker running several threads
    computes this job while no other job runs in it (a suspect of a death that happened while
    several jobs ran: see :class:`Began`).
    """

    gen: int
    index: int
    slot_id: int
    slot_name: str
    alone: bool = False


@dataclass(frozen=True)
class Began:
    """A worker running several threads (``WorkerConfig.threads > 1``) starts computing job
    ``(gen, index)``; sent before the computation, so that when the process dies the parent
    knows every job that was running in it (those begun and not answered)."""

    gen: int
    index: int


@dataclass(frozen=True)
class Retarget:
    """Switch to a new sequence from generation ``gen`` on.

    ``blob`` is the sequence pickled with persistent ids: the object the workers received at
    start (``shared``) is referred to by id, not re-sent.
    """

    gen: int
    blob: bytes


@dataclass(frozen=True)
class Forget:
    """Unmap and close these slots; the parent has destroyed them."""

    slot_ids: tuple


@dataclass(frozen=True)
class Stop:
    """Exit the worker loop now."""


@dataclass(frozen=True)
class Payload:
    """Where a pickled object lies in a slot: ``data_len`` pickle bytes at ``data_offset``, and
    one ``(offset, nbytes)`` pair in ``buffers`` per out-of-band buffer (arrays, tensors).

    ``size`` is the slot's size after the write (a worker grows a slot that is too small).
    ``data_offset`` is 0 unless the value wrote buffers into the slot itself, before the pickle
    bytes (a slot writer, :mod:`seqloader.prefetcher.processes.payload`).
    """

    slot_id: int
    size: int
    data_len: int
    buffers: tuple
    data_offset: int = 0


@dataclass(frozen=True)
class Outcome:
    """Item ``index`` of generation ``gen`` was computed in ``seconds``: what it gave is in
    ``payload`` (:class:`Result`: its value; :class:`Failure`: its error report).

    ``stages`` is ``((name, seconds), ...)``: where those seconds went, when the worker times its
    stages (:mod:`seqloader.sequences.stage_times`); empty otherwise. ``cpu``: the CPU seconds
    of the thread that computed it (``time.thread_time``), against ``seconds`` of wall time.
    ``began``: when computing began, in ``time.perf_counter_ns()`` (one clock for every process
    of a host: a trace's, :mod:`seqloader.loader.tuning.trace`).
    """

    gen: int
    index: int
    payload: Payload
    seconds: float = 0.0
    stages: tuple = ()
    cpu: float = 0.0
    began: int = 0


@dataclass(frozen=True)
class Result(Outcome):
    """The item's value is in ``payload``."""


@dataclass(frozen=True)
class Failure(Outcome):
    """Computing the item raised; ``payload`` holds the pickled error report.

    The report is a dict ``{"exc": exception or None, "type": class or None, "type_name": str,
    "message": str, "traceback": str}`` (see ``faults.error_report``); ``exc`` is None when the
    exception itself could not be pickled, ``type`` when its class could not.
    """


@dataclass(frozen=True)
class Cancelled:
    """The job for ``index`` was skipped because a newer generation was already queued."""

    gen: int
    index: int
    slot_id: int


@dataclass(frozen=True)
class Ready:
    """The worker's set-up (SIGINT ignored, one torch thread, ``worker_init_fn``) has finished.

    Sent once, before any reply to a :class:`Job`; a worker whose set-up raises sends
    :class:`WorkerFailed` instead.
    """

    worker_id: int


@dataclass(frozen=True)
class WorkerFailed:
    """The worker cannot go on (``stage``: ``"worker_init_fn"``, ``"reset"`` or ``"mapping shared
    memory"``) and exits.

    For ``"worker_init_fn"`` it takes the place of :class:`Ready`; for ``"reset"`` (a
    :class:`Retarget` whose sequence could not be unpickled) and ``"mapping shared memory"`` (a
    job's slot could not be mapped, e.g. too many open files) it comes among the replies to jobs.

    ``report`` is a pickled error report as in :class:`Failure`.
    """

    stage: str
    report: bytes


@dataclass(frozen=True)
class Warned:
    """A warning was issued in the worker (any thread, its set-up included): the parent issues it
    again with ``warnings.warn_explicit``, so it reaches the training process's filters and
    handlers as a thread worker's warning does. ``category`` is the class (``UserWarning`` when it
    cannot be pickled), ``message`` its text."""

    category: Any
    message: str
    filename: str
    lineno: int
