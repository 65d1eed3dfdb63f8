"""The parent's side of the workers: process handles, job scheduling, the shutdown protocol and
the healing protocol (replacing a dead worker, :mod:`seqloader.prefetcher.healing`).

:class:`WorkerHandle` is one worker process with its two pipes and the jobs it has not answered;
:class:`Crew` is the set of workers plus their shared-memory :class:`~seqloader.prefetcher.shm.SlotPool`:
everything a :class:`~seqloader.prefetcher.prefetch.Prefetch` must release in ``close()``.
"""

from __future__ import annotations

import collections
import os
import pickle
import select
import signal
import time
from typing import Any

from seqloader.prefetcher.messages import Forget, Job, Stop, WorkerConfig
from seqloader.prefetcher.shm import SlotPool
from seqloader.prefetcher.worker import recv, send, worker_main

__all__ = ["Crew", "WorkerHandle", "describe_exit"]

#: How long :meth:`Prefetch.close` lets workers exit on their own before SIGTERM.
JOIN_TIMEOUT = 2.0

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
# per Job, in order, or WorkerFailed before exiting. Pipe messages are small (bulk data is in
# the slots), so a worker never blocks on a full result pipe while the parent blocks sending it
# a Retarget.
#
# Starting. Prefetch.start() (idempotent; the first read, in order or take(), calls it) starts
# the processes and waits until every worker has sent Ready or failed: a WorkerFailed raises the
# worker's own exception (type kept, a note naming worker and pid, the remote traceback
# chained), a worker that dies first raises WorkerDied, and a set-up longer than START_TIMEOUT
# (300 s, or `timeout` if longer) raises RuntimeError; each of these closes everything first.
# Jobs are sent only once every worker is Ready.
#
# Every blocking wait is bounded and checks liveness.
#   * Reader (Inbox.pump in inbox.py, used by in-order reads, take() and start()): one
#     select.poll() on all result pipes *and* all process sentinels, at most 5 s at a time then
#     is_alive() on every worker, so a worker's death (SIGKILL, os._exit, segfault) wakes it at
#     once; it drains that worker's pipe, then raises RuntimeError (WorkerDied) naming worker,
#     pid and signal, after closing everything (below). With timeout > 0, waiting longer than
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
# (Crew.submit) keeps the job in `unsent` and marks the worker broken (no room); the next pump
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
#   4. Crew.replace: unregister and reap the dead process, close its pipes, SlotPool.retire its
#      slots (free and busy ones destroyed, their names unlinked if still there; leased ones kept
#      valid and destroyed when their values die), start a new process with the same
#      WorkerConfig (worker_id, worker_init_fn, parent pid) reading seq, in the same place;
#   5. resubmit the owed items to it in increasing order (they queue in its pipe while it runs
#      its set-up; it sends Ready first); log a WARNING on the `seqloader` logger; count it.
# A replacement whose set-up takes longer than the start bound raises RuntimeError at a pump.
# Busy time, items and restarts of a worker id carry over to its replacement (counters()).


class Crew:
    """The workers, their slots and their pending jobs: everything :meth:`close` releases."""

    def __init__(self, ctx, num_workers: int, prefetch_factor: int, worker_init_fn, shared: Any,
                 affinity: bool = True):
        self.ctx, self.num_workers, self.prefetch_factor = ctx, num_workers, prefetch_factor
        self.affinity = affinity
        self.worker_init_fn, self.shared = worker_init_fn, shared
        self.handles: list[WorkerHandle] = []
        self.pool = SlotPool(num_workers, keep=prefetch_factor + 1)
        self.closed = False
        self.running = False  # every worker has reported Ready (set by Inbox.wait_started)
        self._owner_pid = os.getpid()  # a forked copy of this object must not stop our workers
        self._poll = select.poll()  # every result pipe and process sentinel
        self._by_fd: dict[int, tuple[WorkerHandle, bool]] = {}

    def start(self, seq, gen: int) -> None:
        try:
            for w in range(self.num_workers):
                config = WorkerConfig(w, self.num_workers, os.getpid(), self.worker_init_fn, gen)
                self.handles.append(self._launch(config, seq))
        except BaseException:
            self.close()
            raise

    def _launch(self, config: WorkerConfig, seq) -> "WorkerHandle":
        try:
            h = WorkerHandle(self.ctx, config, self.shared, seq)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise TypeError(f"prefetch: cannot start worker {config.worker_id} with the "
                            f"{self.ctx.get_start_method()!r} start method, which pickles the "
                            f"sequence, shared object and worker_init_fn ({type(exc).__name__}: "
                            f"{exc}); make them picklable (module-level functions) or use 'fork'") from exc
        self._poll.register(h.results.fileno(), select.POLLIN)
        self._poll.register(h.sentinel, select.POLLIN)
        self._by_fd[h.results.fileno()] = (h, False)
        self._by_fd[h.sentinel] = (h, True)
        return h

    def replace(self, h: "WorkerHandle", seq) -> "WorkerHandle":
        """Start a replacement for the dead worker ``h``: the same ``WorkerConfig`` (id, set-up),
        reading ``seq``; ``h`` is reaped and its slots retired (see the healing NOTE above)."""
        for fd in (h.results.fileno(), h.sentinel):
            self._poll.unregister(fd)
            del self._by_fd[fd]
        h.join(time.monotonic())
        self.pool.retire(h.worker_id)
        new = self._launch(h.config, seq)
        new.busy_s, new.items, new.restarts = h.busy_s, h.items, h.restarts + 1
        self.handles[h.worker_id] = new
        return new

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, bool]]:
        """Wait up to ``timeout`` s for replies or exits: ``[(worker, is_exit), ...]``."""
        return [self._by_fd[fd] for fd, _ in self._poll.poll(int(timeout * 1000))]

    def worker_for(self, index: int) -> WorkerHandle | None:
        """The worker for item ``index``, if it has room for a job: worker ``index % num_workers``
        (torch's assignment) with ``affinity``, else the least busy one."""
        if self.affinity:
            h = self.handles[index % len(self.handles)]
            return h if h.room(self.prefetch_factor) > 0 else None
        best = max(self.handles, key=lambda h: h.room(self.prefetch_factor))
        return best if best.room(self.prefetch_factor) > 0 else None

    def submit(self, h: WorkerHandle, gen: int, index: int) -> None:
        """Send job ``(gen, index)`` to ``h``. A worker whose job pipe is broken is gone: the job
        is kept in ``h.unsent`` and the death is handled by the reader's next wait (which sees
        the process sentinel), never in the middle of handing out results."""
        sid, name = self.pool.acquire(h.worker_id)
        if not h.broken:
            try:
                forgotten = self.pool.take_forgotten(h.worker_id)
                if forgotten:
                    h.send(Forget(forgotten))
                h.send(Job(gen, index, sid, name))
                h.pending.append((gen, index, sid))
                return
            except (BrokenPipeError, ConnectionResetError):  # other OSErrors propagate
                h.broken = True
        h.unsent.append((gen, index, sid))

    def close(self) -> None:
        """The shutdown protocol (see the NOTE above); idempotent."""
        if self.closed or os.getpid() != self._owner_pid:
            return
        self.closed = True
        try:
            for h in self.handles:
                h.stop()
            deadline = time.monotonic() + JOIN_TIMEOUT
            for h in self.handles:
                h.join(deadline)
        finally:
            self.pool.close()


_SIGMASK = hasattr(signal, "pthread_sigmask")


def _hold_sigint():
    """Hold SIGINT in this thread while one message is written or read whole: a Ctrl-C between a
    message's length and its bytes would leave the pipe out of step for good. The held signal is
    delivered by :func:`_release_sigint` (``KeyboardInterrupt`` right after the message)."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if _SIGMASK else None


def _release_sigint(held) -> None:
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def describe_exit(exitcode: int | None) -> str:
    """How a worker ended, for error messages.

    Example:
        >>> describe_exit(-9), describe_exit(3)
        ('was killed by SIGKILL', 'exited unexpectedly with exit code 3')
    """
    if exitcode is None:
        return "exited (its exit status was collected elsewhere)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:  # pragma: no cover
            name = f"signal {-exitcode}"
        if name == "SIGBUS":  # writing a sparse shared-memory page with /dev/shm full
            return "was killed by SIGBUS (is /dev/shm full? in docker, raise --shm-size)"
        return f"was killed by {name}"
    return f"exited unexpectedly with exit code {exitcode}"


class WorkerHandle:
    """The parent's side of one worker: process, job pipe, result pipe, jobs awaiting a reply."""

    def __init__(self, ctx, config: WorkerConfig, shared: Any, seq: Any):
        self.worker_id = config.worker_id
        jobs_r, self.jobs = ctx.Pipe(duplex=False)
        self.results, results_w = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=worker_main, args=(config, jobs_r, results_w, shared, seq),
                                   name=f"seqloader-worker-{config.worker_id}", daemon=True)
        try:
            self.process.start()
        except BaseException:
            self.jobs.close()
            self.results.close()
            raise
        finally:
            jobs_r.close()
            results_w.close()
        self.config = config
        self.pid = self.process.pid
        self.sentinel = self.process.sentinel
        self.started_at = time.monotonic()
        self.pending: collections.deque = collections.deque()  # (gen, index, slot_id)
        self.unsent: list = []  # jobs not sent: the job pipe broke (the worker is gone)
        self.broken = False
        self.set_up = False  # it has sent Ready
        self.busy_s, self.items = 0.0, 0  # time spent computing items, and how many
        self.restarts = 0  # workers with this id that died and were replaced before this one
        self.replaces_starting = False  # it replaces a worker that died before its set-up finished
        self._joined = False
        self._poll = select.poll()
        self._poll.register(self.results.fileno(), select.POLLIN)

    def room(self, prefetch_factor: int) -> int:
        """How many more jobs it may take (none once its job pipe broke)."""
        return 0 if self.broken else prefetch_factor - len(self.pending)

    def readable(self) -> bool:
        """Whether a reply (or EOF) is waiting on the result pipe."""
        return bool(self._poll.poll(0))

    def send(self, msg) -> None:
        held = _hold_sigint()
        try:
            send(self.jobs, msg)
        finally:
            _release_sigint(held)

    def recv(self):
        held = _hold_sigint()
        try:
            return recv(self.results)
        finally:
            _release_sigint(held)

    def exit_description(self) -> str:
        self.process.join(timeout=1.0)  # the sentinel fires a moment before the exit code is ready
        return describe_exit(self.process.exitcode)

    def stop(self) -> None:
        """Ask the worker to exit (it does so before computing anything else)."""
        try:
            send(self.jobs, Stop())
        except (OSError, ValueError):  # already dead or closed
            pass

    def join(self, deadline: float) -> None:
        """Wait until ``deadline`` (``time.monotonic``), then SIGTERM, then SIGKILL; close pipes.
        Idempotent."""
        if self._joined:
            return
        self._joined = True
        p = self.process
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=1.0)
            if p.is_alive():  # pragma: no cover - ignores SIGTERM
                p.kill()
                p.join(timeout=5.0)
        for conn in (self.jobs, self.results):
            conn.close()
        try:
            p.close()
        except ValueError:  # pragma: no cover - still running after SIGKILL
            pass
