"""The process executor: worker processes, shared-memory slots, the shutdown and healing protocols.

:class:`ProcessExecutor` implements :class:`~seqloader.prefetcher.executor.Executor` with one
process per worker (:class:`~seqloader.prefetcher.processes.handle.WorkerHandle`, its loop in
:mod:`~seqloader.prefetcher.processes.worker`), optionally running ``threads`` jobs at once each
(several threads inside each worker process, :mod:`~seqloader.prefetcher.processes.runner`). Results
travel through a :class:`~seqloader.prefetcher.processes.shm.SlotPool` of reused shared-memory
segments; a reply is a :class:`~seqloader.prefetcher.processes.messages.Result`,
:class:`~seqloader.prefetcher.processes.messages.Failure` or ``None`` (a stale job skipped).
"""

from __future__ import annotations

import os
import pickle
import select
import time
import warnings
from typing import Any, Optional, Sequence

from seqloader.errors import add_note
from seqloader.prefetcher.executor import Died, Done, Event, SetupFailed, Started
from seqloader.prefetcher.faults import rebuild_error
from seqloader.prefetcher.processes.handle import WorkerHandle
from seqloader.prefetcher.processes.messages import (Began, Cancelled, Failure, Forget, Job, Ready, Result,
                                                     Retarget, Warned, WorkerConfig, WorkerFailed)
from seqloader.prefetcher.processes.payload import read_and_release
from seqloader.prefetcher.processes.shm import SlotPool
from seqloader.prefetcher.processes.worker import dumps_seq

__all__ = ["JOIN_TIMEOUT", "PICKLE_WARNING", "ProcessExecutor"]

#: How long :meth:`ProcessExecutor.close` lets workers exit on their own before SIGTERM.
JOIN_TIMEOUT = 2.0
#: torch's warning (``torch/utils/data/dataloader.py``) when starting a worker process fails to pickle
#: its arguments; issued the same way before the error is raised (user code and logs match on it).
PICKLE_WARNING = ("Got pickle error when attempting to start a worker Process. "
                  "This might be because the worker Process arguments are not picklable. "
                  "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
                  "to 'forkserver', which requires the worker Process arguments to be picklable. "
                  "You can also try multiprocessing.set_start_method('fork').")

# NOTE [ seqloader prefetch: ownership and the shutdown protocol ]
#
# Who owns what.
#   * The reader (the process holding the Prefetch) owns the worker processes, both ends of
#     every pipe it kept, and every shared-memory slot (SlotPool). Workers own nothing but
#     their mappings. Each slot belongs to one worker; its *name* is unlinked as soon as that
#     worker has replied once for it, so after warm-up /dev/shm holds no name at all and no
#     crash of any process can leave a file behind.
#   * A value returned to the caller that contains arrays/tensors holds a *lease* on its slot;
#     the slot is reused only after every view of that value is garbage. A returned batch is
#     never overwritten.
#
# Messages (messages.py). Parent -> worker on the worker's own job pipe: Job, Retarget, Forget,
# Stop. Worker -> parent on its result pipe: first Ready (its set-up and worker_init_fn
# finished) or WorkerFailed (they raised; it exits), then exactly one Result/Failure/Cancelled
# per Job (in order, unless the worker runs several threads: WorkerConfig.threads), or
# WorkerFailed before exiting; and at any time Warned (a warning shown in the worker, issued again
# in the reader by ProcessExecutor._drain) or, with several threads, Began. Pipe messages are small (bulk data is in
# the slots), so a worker never blocks on a full result pipe while the parent blocks sending it
# a Retarget.
#
# Starting. Prefetch.start() (idempotent; the first read, in order or take(), calls it) starts
# the processes (ProcessExecutor.launch) and waits until every worker has sent Ready or failed: a WorkerFailed raises the
# worker's own exception (type kept, a note naming worker and pid, the remote traceback
# chained), a worker that dies first raises WorkerDied, and a set-up longer than START_TIMEOUT
# (300 s, or `timeout` if longer) raises RuntimeError; each of these closes everything first.
# Jobs are sent only once every worker is Ready.
#
# Every blocking wait is bounded and checks liveness.
#   * Reader (Inbox.pump in inbox.py, used by in-order reads, take() and start(), calls
#     ProcessExecutor.poll): one select.poll() on all result pipes *and* all process sentinels,
#     at most 5 s at a time then is_alive() on every worker, so a worker's death (SIGKILL,
#     os._exit, segfault) wakes it at once; it drains that worker's pipe, then reports Died, and
#     the inbox raises RuntimeError (WorkerDied) naming worker, pid and signal, after closing
#     everything (below). With timeout > 0, waiting longer than
#     that for one item (take(): for the next completion) raises RuntimeError (ItemTimeout,
#     "... timed out after N seconds ...") and leaves the Prefetch usable.
#   * Worker: polls its job pipe every PARENT_CHECK_INTERVAL (0.25 s) and exits on its own when
#     its parent pid changes or the reader's pid is gone (reader SIGKILLed), or on EOF/EPIPE;
#     on that path it also unlinks any slot name it was given that might still exist.
#   * Workers ignore SIGINT: Ctrl-C raises KeyboardInterrupt in the reader only, and the
#     reader's close()/finalizer stops the workers. The reader holds SIGINT while it reads or
#     writes one message (so a pipe never holds half a message); an interrupted read starts a
#     new generation and awaits no earlier reply (Inbox.interrupted: a reply read but not
#     handled would otherwise be waited for forever).
#
# close() -- idempotent; also run by weakref.finalize when the Prefetch is garbage collected
# and at interpreter exit (after an error, `break`, `del`, KeyboardInterrupt):
#   1. mark closed (a later read raises ValueError);
#   2. send Stop to every worker: a worker that sees Stop among its queued messages exits
#      without computing the jobs queued before it;
#   3. join all workers against one JOIN_TIMEOUT deadline (a worker busy in a long item cannot
#      see Stop), then SIGTERM, then SIGKILL; close the pipes;
#   4. destroy every slot: unlink any remaining name, close descriptors and mappings (a mapping
#      still exported by a leased value is unmapped when that value dies).
# Exhausting the sequence does *not* stop the workers: they are long-lived (seeks, reset()) and
# idle cheaply in poll(); the Prefetch owns them until close(), `with`, del or gc.
#
# NOTE [ seqloader prefetch: healing (restarts > 0) ]  (healing.py; docs/design.md)
#
# Who replaces. Only the reader, inside Inbox.pump (every wait goes through it), so never between
# popping a result and returning it: at a pump, every item read so far has been returned to the
# caller. A worker found dead there (sentinel, or is_alive() after a quiet poll) is drained first:
# a WorkerFailed it reported is raised as without healing. A job pipe that breaks while sending
# (ProcessExecutor.submit) keeps the job in `unsent` and marks the worker broken (no room); the next pump
# sees the death. Then Healer.heal, in this order:
#   1. refuse (WorkerDied, everything closed) when the worker died before its set-up finished and
#      itself replaced one that did too; when the item it was producing already killed a worker
#      of this sequence (a poison item, WorkerDied.poison); when `restarts` replacements were
#      made for this sequence already (a reset() starts a new count);
#   2. collect what it owed of the current generation: jobs without a reply, unsent jobs, and
#      replies that arrived but were not returned (dropped). An item returned is consumed;
#      everything after that of the dead worker is recomputed. Older generations are dropped;
#   3. seq = respawn(worker_id) if given (its error: WorkerDied with it as __cause__), else (or
#      if it returns None) the current sequence;
#   4. ProcessExecutor.replace: unregister and reap the dead process, close its pipes, SlotPool.retire its
#      slots (free and busy ones destroyed, their names unlinked if still there; leased ones kept
#      valid and destroyed when their values die), start a new process with the same
#      WorkerConfig (worker_id, worker_init_fn, parent pid) reading seq, in the same place;
#   5. resubmit the owed items to it in increasing order (they queue in its pipe while it runs
#      its set-up; it sends Ready first); log a WARNING on the `seqloader` logger; count it.
# A replacement whose set-up takes longer than the start bound raises RuntimeError at a pump.
# Several threads per worker (WorkerConfig.threads > 1). Each runner thread sends Began(gen, index)
# before it computes a job, so the jobs begun and not answered when the process died are exactly
# those it was computing (ProcessExecutor.running). One of them: it is the item the death is
# blamed on, as with one thread. Several: none can be blamed alone, so the message names every
# one (Inbox.death), each counts as having killed a worker once (Healer), and ProcessExecutor
# sends each to the replacement with Job.alone: it is computed while nothing else runs in that
# process. A second death then names the one item that caused it, and that item is the poison
# item; the innocent ones were computed again and returned, never dropped.
# Busy time, items and restarts of a worker id carry over to its replacement (Roster, counters()).



class ProcessExecutor:
    """Worker processes (see the module docstring and the NOTEs above).

    Args:
        ctx: a ``multiprocessing`` context.
        num_workers: processes.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each, before any job.
        shared: sent to each worker once; a sequence given to :meth:`reset` that references it
            is pickled with a reference instead of a copy.
        threads: jobs each worker runs at once (threads inside each process), ``>= 1``.
        keep: free slots kept per worker and thread (the read-ahead per thread, plus one).
        thread_init_fn: ``thread_init_fn(worker_id, thread)`` in each of those threads, or ``None``.
    """

    kind = "process"

    def __init__(self, ctx: Any, num_workers: int, worker_init_fn: Any, shared: Any, threads: int = 1,
                 keep: int = 3, thread_init_fn: Any = None):
        self.ctx, self.num_workers, self.concurrency = ctx, num_workers, threads
        self.worker_init_fn, self.shared, self.thread_init_fn = worker_init_fn, shared, thread_init_fn
        self.handles: list[WorkerHandle] = []
        self.pool = SlotPool(num_workers, keep=keep * threads)
        self.shm_bytes = 0  # bytes of replies that came through shared-memory slots
        self._closed = False
        self._owner_pid = os.getpid()  # a forked copy of this object must not stop our workers
        self._poll = select.poll()  # every result pipe and process sentinel
        self._by_fd: dict[int, tuple[WorkerHandle, bool]] = {}
        self._warned: dict = {}  # the registry of the workers' warnings issued again here (once each)
        self._suspects: dict[int, set] = {}  # worker -> jobs (gen, index) to compute alone (the NOTE above)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- starting and replacing --------------------------------------------------------------------

    def launch(self, seq: Sequence[Any], gen: int) -> None:
        try:
            for w in range(self.num_workers):
                config = WorkerConfig(w, self.num_workers, os.getpid(), self.worker_init_fn, gen, self.concurrency,
                                      self.thread_init_fn)
                self.handles.append(self._start(config, seq))
        except BaseException:
            self.close()
            raise

    def _start(self, config: WorkerConfig, seq: Any) -> WorkerHandle:
        try:
            h = WorkerHandle(self.ctx, config, self.shared, seq)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # pickle's own error, as torch raises it
            warnings.warn(PICKLE_WARNING, stacklevel=2)  # torch's warning first, as its DataLoader does
            add_note(exc, f"seqloader: cannot start worker {config.worker_id} with the "
                          f"{self.ctx.get_start_method()!r} start method, which pickles the sequence, shared "
                          "object and worker_init_fn; make them picklable (module-level functions) or use 'fork'")
            raise
        self._poll.register(h.results.fileno(), select.POLLIN)
        self._poll.register(h.sentinel, select.POLLIN)
        self._by_fd[h.results.fileno()] = (h, False)
        self._by_fd[h.sentinel] = (h, True)
        return h

    def replace(self, worker: int, seq: Sequence[Any]) -> None:
        """Start a replacement for the dead ``worker``: the same ``WorkerConfig`` (id, set-up),
        reading ``seq``; the dead one is reaped and its slots retired (see the healing NOTE)."""
        h = self.handles[worker]
        if len(h.running) > 1:
            self._suspects[worker] = set(h.running)
        for fd in (h.results.fileno(), h.sentinel):
            self._poll.unregister(fd)
            del self._by_fd[fd]
        h.join(time.monotonic())
        self.pool.retire(worker)
        self.handles[worker] = self._start(h.config, seq)

    # -- jobs ----------------------------------------------------------------------------------------

    def accepting(self, worker: int) -> bool:
        return not self.handles[worker].broken

    def submit(self, worker: int, gen: int, index: int) -> None:
        """Send job ``(gen, index)``. A worker whose job pipe is broken is gone: the job stays owed
        (the roster's) and the death is reported by the next :meth:`poll`, which sees the process
        sentinel, never in the middle of handing out results."""
        h = self.handles[worker]
        sid, name = self.pool.acquire(worker)
        if h.broken:
            return
        try:
            forgotten = self.pool.take_forgotten(worker)
            if forgotten:
                h.send(Forget(forgotten))
            suspects = self._suspects.get(worker, set())
            alone = (gen, index) in suspects
            suspects.discard((gen, index))
            h.send(Job(gen, index, sid, name, alone))
        except (BrokenPipeError, ConnectionResetError):  # other OSErrors propagate
            h.broken = True

    def new_generation(self, gen: int) -> None:
        """Nothing to do: a worker skips the jobs of older generations it finds queued when a
        newer one arrives (a Job or a Retarget), without a message per generation."""

    def reset(self, seq: Sequence[Any], gen: int) -> None:
        """Every worker reads ``seq`` from generation ``gen`` (a no-op before :meth:`launch`).

        Raises:
            TypeError: ``seq`` cannot be pickled (nothing is sent).
        """
        if not self.handles:
            return
        try:
            blob = dumps_seq(seq, self.shared)
        except Exception as exc:
            raise TypeError(f"prefetch.reset: seq cannot be pickled for the workers ({type(exc).__name__}: "
                            f"{exc})") from exc
        for h in self.handles:
            if not h.broken:
                try:
                    h.send(Retarget(gen, blob))
                except (BrokenPipeError, ConnectionResetError):
                    h.broken = True

    # -- what happened -------------------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Event]:
        """Replies and deaths, waiting up to ``timeout`` s (one ``poll`` on every result pipe and
        process sentinel; after a quiet wait, ``is_alive()`` on every worker)."""
        ready = self._poll.poll(int(timeout * 1000))
        events: list[Event] = []
        dead: list[WorkerHandle] = []
        for fd, _ in ready:
            h, is_sentinel = self._by_fd[fd]
            if is_sentinel:
                dead.append(h)
            else:
                self._drain(h, events)
        if not ready:
            dead = [h for h in self.handles if not h.process.is_alive()]
        for h in dead:
            if not h.reported:
                h.reported = True
                self._drain(h, events)  # a WorkerFailed it sent is reported before its death
                events.append(Died(h.worker_id))
        return events

    def _drain(self, h: WorkerHandle, events: list[Event]) -> None:
        """Every reply waiting on ``h``'s result pipe, as events."""
        pool, w = self.pool, h.worker_id
        while True:
            try:
                if not h.readable():
                    return
                msg = h.recv()
            except (EOFError, OSError):  # the worker died; its sentinel tells the rest
                return
            if type(msg) is Began:
                h.running[(msg.gen, msg.index)] = None
                continue
            if type(msg) is Warned:  # a worker's warning reaches the training process's filters
                warnings.warn_explicit(msg.message, msg.category, msg.filename, msg.lineno, registry=self._warned)
                continue
            if type(msg) is not Ready and type(msg) is not WorkerFailed:
                h.running.pop((msg.gen, msg.index), None)
            if type(msg) is Result or type(msg) is Failure:
                payload = msg.payload
                pool.mapped_by_worker(payload.slot_id)
                self.shm_bytes += payload.data_len + sum(n for _, n in payload.buffers)
                events.append(Done(w, msg.gen, msg.index, msg, msg.seconds, msg.stages, msg.cpu, msg.began))
            elif type(msg) is Cancelled:
                pool.mapped_by_worker(msg.slot_id)
                pool.release(msg.slot_id)
                events.append(Done(w, msg.gen, msg.index, None))
            elif type(msg) is Ready:
                events.append(Started(w))
            elif type(msg) is WorkerFailed:
                events.append(SetupFailed(w, msg.stage, rebuild_error(pickle.loads(msg.report))))

    def outcome(self, reply: Any) -> tuple[bool, Any]:
        value = read_and_release(reply.payload, self.pool)
        return (True, value) if type(reply) is Result else (False, rebuild_error(value))

    def drop(self, reply: Any) -> None:
        self.pool.release(reply.payload.slot_id)

    # -- naming ----------------------------------------------------------------------------------------

    def running(self, worker: int) -> Optional[list[tuple[int, int]]]:
        """With several threads per worker: the jobs ``(gen, index)`` worker ``worker`` had begun
        and not answered (after its death: what it was computing when it died), in the order
        begun; ``None`` with one thread (jobs run in the order sent: the first unanswered one)."""
        if self.concurrency == 1:
            return None
        return list(self.handles[worker].running)

    def who(self, worker: int) -> str:
        return f"worker {worker} (pid {self.handles[worker].pid})"

    def pid(self, worker: int) -> Optional[int]:
        return self.handles[worker].pid

    def death(self, worker: int) -> tuple[str, Optional[int]]:
        h = self.handles[worker]
        how = h.exit_description()
        return how, h.process.exitcode

    def counters(self) -> dict:
        return {"shm_bytes": self.shm_bytes}

    def forked(self) -> "ProcessExecutor":
        """Worker processes belong to the process that started them: a forked child cannot read."""
        raise RuntimeError("prefetch: this Prefetch was inherited by a forked child process, and its worker "
                           "processes belong to the parent; build a new prefetch in the child")

    # -- closing -------------------------------------------------------------------------------------

    def close(self) -> None:
        """The shutdown protocol (see the NOTE above); idempotent."""
        if self._closed or os.getpid() != self._owner_pid:
            return
        self._closed = True
        try:
            for h in self.handles:
                h.stop()
            deadline = time.monotonic() + JOIN_TIMEOUT
            for h in self.handles:
                h.join(deadline)
        finally:
            self.pool.close()
