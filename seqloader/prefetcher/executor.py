"""The executor seam: who computes item ``i`` of a sequence, behind one small protocol.

A :class:`~seqloader.prefetcher.prefetch.Prefetch` decides *what* is computed and in which order
(the read-ahead, seeks, ``take``, timeouts, error notes, healing, counters: written once, in
:mod:`~seqloader.prefetcher.inbox`, :mod:`~seqloader.prefetcher.roster`,
:mod:`~seqloader.prefetcher.ordered`, :mod:`~seqloader.prefetcher.unordered` and
:mod:`~seqloader.prefetcher.healing`). An :class:`Executor` only runs jobs ``(gen, index)`` on its
workers and reports what happened as :data:`Event` values. Implementations:
:class:`~seqloader.prefetcher.processes.executor.ProcessExecutor` (worker processes, results in
shared memory, optionally several threads in each) and
:class:`~seqloader.prefetcher.threads.ThreadExecutor` (threads of this process, results by
reference).

What an executor must guarantee (``docs/design.md``, "Executors", says the same):

1. **Workers are numbered** ``0 .. num_workers-1`` and keep their number for life, replacements
   included (:meth:`Executor.replace`): a worker's set-up (``worker_init_fn(worker_id)``) and
   seeds depend on it.
2. **Jobs are computed as given.** ``submit(worker, gen, index)`` computes ``seq[index]`` of the
   sequence the workers read in generation ``gen`` (the one given to :meth:`Executor.launch` or
   the last :meth:`Executor.reset` at or before ``gen``), on that worker. A job of a generation
   older than the newest the worker has seen may be skipped (reported :class:`Done` with
   ``reply=None``), never computed against another sequence.
3. **Exactly one** :class:`Done` per submitted job while its worker lives (none after
   :class:`Died`); :class:`Started` once per worker (and per replacement) before any ``Done`` of
   it, or :class:`SetupFailed`. Replies may come in any order.
4. **Every wait is bounded**: :meth:`Executor.poll` returns within its timeout, and reports a
   worker that is gone (:class:`Died`) the first time it looks after the death.
5. **Nothing outlives** :meth:`Executor.close` (idempotent, callable from ``weakref.finalize``):
   no process, no thread left running a job it could still be sent, no shared-memory name.
   Values already returned stay valid.
6. **Nothing relies on the GIL** for correctness: state shared between threads is behind a lock.

An executor never decides *what* to compute, so batches and state are the same whatever executes
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence, Union

__all__ = ["Died", "Done", "Event", "Executor", "SetupFailed", "Started"]


@dataclass(frozen=True)
class Started:
    """Worker ``worker`` finished its set-up (``worker_init_fn``) and takes jobs."""

    worker: int


@dataclass(frozen=True)
class Done:
    """The job ``(gen, index)`` of ``worker`` ended: ``reply`` is the executor's handle on its
    outcome (read it with :meth:`Executor.outcome` or give it back with :meth:`Executor.drop`),
    ``None`` when the worker skipped a stale job. ``seconds`` it took (wall time), ``stages``:
    ``((name, seconds), ...)`` when the worker times its stages, ``cpu``: the CPU seconds of
    the thread that computed it (less than ``seconds`` when it waited: on I/O, or for the GIL), and
    ``began``: when it began, in ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux: one clock for
    the processes of a host; ``0``: unknown). The worker reads that clock twice per job, and the
    reply carries both numbers: a trace (:meth:`Prefetch.listen
    <seqloader.prefetcher.prefetch.Prefetch.listen>`) costs the workers nothing more."""

    worker: int
    gen: int
    index: int
    reply: Any
    seconds: float = 0.0
    stages: tuple = ()
    cpu: float = 0.0
    began: int = 0


@dataclass(frozen=True)
class Died:
    """Worker ``worker`` is gone (killed, crashed, exited); :meth:`Executor.death` says how."""

    worker: int


@dataclass(frozen=True)
class SetupFailed:
    """Worker ``worker`` cannot go on: ``stage`` (``"worker_init_fn"``, ``"reset"``, ...) raised
    ``error`` (its own type, the remote traceback chained); it exits."""

    worker: int
    stage: str
    error: BaseException


Event = Union[Started, Done, Died, SetupFailed]


class Executor(Protocol):
    """The protocol (see the module docstring for the guarantees)."""

    #: How many workers; how many jobs one worker runs at once (its threads).
    num_workers: int
    concurrency: int
    #: ``"process"``, ``"thread"``, ...: for messages and ``stats()``.
    kind: str

    @property
    def closed(self) -> bool: ...

    def launch(self, seq: Sequence[Any], gen: int) -> None:
        """Start every worker reading ``seq`` from generation ``gen``; :class:`Started` follows."""

    def submit(self, worker: int, gen: int, index: int) -> None:
        """Queue job ``(gen, index)`` on ``worker``; never blocks for long. A worker that cannot
        take it (gone) keeps it owed: the next :meth:`poll` reports the death."""

    def accepting(self, worker: int) -> bool:
        """Whether ``worker`` can be sent jobs (``False`` once a send to it failed)."""

    def new_generation(self, gen: int) -> None:
        """Jobs of generations older than ``gen`` need not be computed any more (a hint: each
        still gets its :class:`Done`, possibly with ``reply=None``)."""

    def reset(self, seq: Sequence[Any], gen: int) -> None:
        """Every worker reads ``seq`` from generation ``gen`` on.

        Raises:
            TypeError: ``seq`` cannot be sent to the workers (not picklable).
        """

    def poll(self, timeout: float) -> list[Event]:
        """What happened, waiting at most ``timeout`` seconds for something to happen."""

    def outcome(self, reply: Any) -> tuple[bool, Any]:
        """``(True, value)`` or ``(False, the item's own exception)``; releases the reply.

        Raises:
            Exception: the value could not be read back (the caller notes the item).
        """

    def drop(self, reply: Any) -> None:
        """Release a reply that will not be read."""

    def replace(self, worker: int, seq: Sequence[Any]) -> None:
        """Start a replacement of the dead ``worker`` (same number, same set-up) reading ``seq``."""

    def death(self, worker: int) -> tuple[str, Optional[int]]:
        """How ``worker`` ended (``"was killed by SIGKILL"``) and its exit code, if any."""

    def who(self, worker: int) -> str:
        """``worker`` for messages: ``"worker 2 (pid 4242)"``, ``"worker 1 (thread seqloader-1)"``."""

    def pid(self, worker: int) -> Optional[int]:
        """The process id of ``worker``, if it is a process."""

    # Optional: ``running(worker) -> list[(gen, index)] | None``, the jobs a worker computing several
    # at once was computing (after its death: when it died); without it, or when it returns
    # ``None``, a worker computes its jobs one at a time in the order sent (Inbox.death).

    def counters(self) -> dict:
        """Executor-specific counters (e.g. ``{"shm_bytes": n}``)."""

    def forked(self) -> "Executor":
        """An executor of the same settings for a forked child that reads this one's owner
        (raises ``RuntimeError`` where the workers cannot be used there)."""

    def close(self) -> None:
        """Stop everything (see guarantee 5); idempotent."""
