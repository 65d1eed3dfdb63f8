"""The worker process: its loop and pipe framing (the pickling of sequences is the wire's).

A worker owns one sequence (replaced by :class:`~seqloader.prefetcher.processes.messages.Retarget`), reads
:class:`~seqloader.prefetcher.processes.messages.Job` messages from its own pipe, computes ``seq[index]``
and writes the result into the job's shared-memory slot (:mod:`seqloader.prefetcher.processes.shm`); a
result that is a :class:`~seqloader.prefetcher.wire.SlotWriter` writes itself there, as part
of computing the item. With stage timing on in the process (:mod:`seqloader.sequences.stage_times`,
enabled by the caller's ``worker_init_fn``), pickling and writing the result count as the stage
``"transfer"`` (:data:`~seqloader.prefetcher.wire.TRANSFER`), and each reply carries the item's
stage times. Set-up:
SIGINT ignored, one intra-op torch thread, glibc's heap told to keep large freed buffers
(:mod:`seqloader.prefetcher.processes.heap`), then ``worker_init_fn(worker_id)``, reported with
:class:`~seqloader.prefetcher.processes.messages.Ready` (or :class:`~seqloader.prefetcher.processes.messages.WorkerFailed`);
whatever else a worker needs (seeds, torch's ``WorkerInfo``) is the caller's ``worker_init_fn``'s business.
The parent's side (process handles, the shutdown protocol) is in :mod:`seqloader.prefetcher.processes.executor`.
"""

from __future__ import annotations

import collections
import os
import pickle
import select
import signal
import threading
import time
import traceback
import warnings
from typing import Any

import torch

from seqloader.prefetcher.faults import error_report
from seqloader.prefetcher.processes.heap import keep_large_buffers
from seqloader.prefetcher.processes.messages import (
    Began,
    Cancelled,
    Failure,
    Forget,
    Job,
    Ready,
    Result,
    Retarget,
    Stop,
    Warned,
    WorkerConfig,
    WorkerFailed,
)
from seqloader.prefetcher.processes.payload import Encoded, Reservation, encode_payload
from seqloader.prefetcher.processes.runner import Runner
from seqloader.prefetcher.processes.shm import WorkerSlots, unlink_segment, write_payload
from seqloader.prefetcher.wire import SLOT_ITEM, TRANSFER, SlotWriter, dumps_with_shared, loads_with_shared
from seqloader.sequences import stage_times

__all__ = ["TRANSFER", "dumps_seq", "error_report", "loads_seq", "recv", "send", "worker_main"]

#: How often (seconds) an idle worker checks that its parent is alive.
PARENT_CHECK_INTERVAL = 0.25


# --------------------------------------------------------------------------- pipes and sequences


def send(conn, msg) -> None:
    """Send one message (plain pickle: ``Connection.send`` builds a ForkingPickler per call)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn):
    """Receive one message sent by :func:`send`."""
    return pickle.loads(conn.recv_bytes())


#: A sequence for a :class:`Retarget`, pickled with ``shared`` (sent at start) referred to by id,
#: and its inverse in a worker holding ``shared``: the wire's (:mod:`seqloader.prefetcher.wire`).
dumps_seq = dumps_with_shared
loads_seq = loads_with_shared


# --------------------------------------------------------------------------- the worker process


def _set_up(config: WorkerConfig) -> None:
    torch.set_num_threads(1)  # workers are processes: one intra-op thread each, as in torch
    keep_large_buffers()  # no page faults per item for a large result built in a fresh buffer
    if config.worker_init_fn is not None:
        config.worker_init_fn(config.worker_id)


#: Guards the result pipe: runner threads and forwarded warnings write it from several threads.
_send_lock = threading.Lock()


def _forward_warnings(results: Any) -> None:
    """Send every warning shown in this process to the parent (:class:`Warned`), which issues it
    again: the training process sees a worker's warnings as it sees a thread worker's."""
    shown = warnings.showwarning

    def forward(message, category, filename, lineno, file=None, line=None):
        try:
            try:
                pickle.dumps(category)
            except Exception:
                category = UserWarning
            with _send_lock:
                send(results, Warned(category, str(message), str(filename), int(lineno)))
        except Exception:  # the pipe is gone: show it here, as before
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = forward


def _parent_alive(ppid: int, parent_pid: int) -> bool:
    if os.getppid() != ppid:
        return False
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - pid reused by another user
        return True
    return True


class _Unsendable(Exception):
    """Pickling an item's value failed (wraps the error, which :func:`_compute` reports)."""


def _evaluate(seq, job: Job, slots: WorkerSlots, times) -> Encoded:
    """``seq.slot_item(job.index)`` if the sequence has it (the value may be a :class:`SlotWriter`,
    which writes itself into the slot), else ``seq[job.index]``; pickled but not written: the
    value, and every view of the slot it holds, die with this frame."""
    slot_item = getattr(seq, SLOT_ITEM, None)
    value = seq[job.index] if slot_item is None else slot_item(job.index)
    token = times.begin() if times is not None else None
    reservation = None
    if isinstance(value, SlotWriter):  # part of computing the item: its errors are the item's
        reservation = Reservation(slots, job.slot_id)
        value = value.write_into_slot(reservation.reserve)
    try:
        encoded = encode_payload(value, reservation)
    except Exception as exc:
        raise _Unsendable() from exc
    if token is not None:
        times.end(TRANSFER, token)
    return encoded


def _clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of the finished frames of ``exc`` and its causes: a view of the slot held
    there would keep the slot from growing for the error report."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def _stages(times) -> tuple:
    return () if times is None else tuple(times.take().items())


def _compute(seq, job: Job, slots: WorkerSlots):
    start, cpu = time.perf_counter_ns(), time.thread_time()  # when it began: a trace's clock too
    times = stage_times.current()
    try:
        encoded = _evaluate(seq, job, slots, times)
        token = times.begin() if times is not None else None
        payload = encoded.write(slots, job.slot_id)
        if times is not None and token is not None:
            times.end(TRANSFER, token)
        return Result(job.gen, job.index, payload, (time.perf_counter_ns() - start) * 1e-9, _stages(times),
                      time.thread_time() - cpu, start)
    except _Unsendable as wrapped:
        cause = wrapped.__cause__
        exc: BaseException = TypeError(f"prefetch: item {job.index} cannot be sent to the parent process "
                                   f"({type(cause).__name__}: {cause}); items must be picklable")
        exc.__cause__ = cause
    except BaseException as err:  # SystemExit, KeyboardInterrupt, GeneratorExit: the item's outcome too
        exc = err  # (the reader reports them as a RuntimeError naming the item: inbox.Inbox.result)
    report = error_report(exc)
    _clear_frames(exc)
    del exc
    return Failure(job.gen, job.index, write_payload(report, slots, job.slot_id),
                   (time.perf_counter_ns() - start) * 1e-9, _stages(times), time.thread_time() - cpu, start)


class _Stopped(Exception):
    """The worker loop ends: a :class:`Stop`, a failed reset or mapping (reported), or a dead parent."""

    def __init__(self, parent_gone: bool = False):
        super().__init__()
        self.parent_gone = parent_gone


class _Worker:
    """One worker's state between messages: its sequence, its slots, the newest generation seen
    and the messages read but not handled yet. :meth:`handle` dispatches one message."""

    def __init__(self, config: WorkerConfig, jobs: Any, results: Any, shared: Any, seq: Any):
        self.config, self.jobs, self.results, self.shared, self.seq = config, jobs, results, shared, seq
        self.slots = WorkerSlots()
        self.ppid = os.getppid()  # at start: a later change means the parent died
        self.latest = config.gen  # written by this thread only; runner threads read it
        self.pending: collections.deque = collections.deque()
        self.poller = select.poll()
        self.poller.register(jobs.fileno(), select.POLLIN)
        self.send_lock = _send_lock  # runner threads reply on the same pipe, warnings too
        self.failed = False  # a runner thread reported a failure: stop
        self.runner: Runner | None = None

    def start_threads(self) -> None:
        """With ``config.threads > 1``: start the runner and wait for its threads' set-up.

        Raises:
            Exception: a ``thread_init_fn`` raised (reported as the worker's set-up failure).
        """
        c = self.config
        if c.threads > 1:
            self.runner = Runner(c.threads, self.run_job_announced, c.worker_id, c.thread_init_fn, self.runner_failed)
            self.runner.wait_ready(lambda: _parent_alive(self.ppid, c.parent_pid))

    def reply(self, msg: Any) -> None:
        with self.send_lock:
            send(self.results, msg)

    def run_job(self, job: Job, seq: Any) -> None:
        """Answer one job (in this thread or a runner thread)."""
        if job.gen < self.latest:
            self.reply(Cancelled(job.gen, job.index, job.slot_id))
        else:
            self.reply(_compute(seq, job, self.slots))

    def run_job_announced(self, job: Job, seq: Any) -> None:
        """Answer one job in a runner thread, announcing it first (:class:`Began`): several run at
        once, so the parent learns from these which were running if the process dies."""
        if job.gen >= self.latest:
            self.reply(Began(job.gen, job.index))
        self.run_job(job, seq)

    def runner_failed(self, stage: str, exc: BaseException) -> None:
        """A runner thread cannot go on: report it; the message loop then stops."""
        try:
            self.reply(WorkerFailed(stage, pickle.dumps(error_report(exc))))
        finally:
            self.failed = True

    def next_message(self) -> Any:
        """The next message to handle (waiting in bounded steps, checking the parent is alive),
        after reading every message already in the pipe: a :class:`Stop` or a newer generation
        among them takes effect before older jobs are computed."""
        if not self.pending:
            while not self.poller.poll(int(PARENT_CHECK_INTERVAL * 1000)):
                if not _parent_alive(self.ppid, self.config.parent_pid):
                    raise _Stopped(parent_gone=True)
                if self.failed:
                    raise _Stopped()
            self.pending.append(recv(self.jobs))
        while self.poller.poll(0):
            self.pending.append(recv(self.jobs))
        for m in self.pending:
            if isinstance(m, Stop):
                raise _Stopped()
            if isinstance(m, (Job, Retarget)) and m.gen > self.latest:
                self.latest = m.gen
        return self.pending.popleft()

    def handle(self, msg: Any) -> None:
        """Dispatch one message: forget slots, switch sequence, or answer a job."""
        if isinstance(msg, Forget):
            self.slots.forget(msg.slot_ids)
        elif isinstance(msg, Retarget):
            if any(isinstance(m, Retarget) for m in self.pending):
                return  # superseded before we got to it
            try:
                self.seq = loads_seq(msg.blob, self.shared)
            except Exception as exc:
                self.fail("reset", exc)
        elif isinstance(msg, Job):
            try:
                self.slots.open(msg.slot_id, msg.slot_name)
            except OSError as exc:  # e.g. EMFILE: every slot the reader still holds is mapped here
                self.fail("mapping shared memory", exc)
            if self.failed:
                raise _Stopped()
            if self.runner is not None:
                self.runner.put(msg, self.seq)
            else:
                self.run_job(msg, self.seq)

    def fail(self, stage: str, exc: BaseException) -> None:
        """Report that this worker cannot go on (:class:`WorkerFailed`), then stop."""
        self.reply(WorkerFailed(stage, pickle.dumps(error_report(exc))))
        raise _Stopped()


def worker_main(config: WorkerConfig, jobs: Any, results: Any, shared: Any, seq: Any) -> None:
    """Entry point of a worker process (see the module docstring and the shutdown NOTE).

    Set-up (SIGINT ignored, one torch thread, ``worker_init_fn``), then :class:`Ready`, then one
    message at a time until :class:`Stop`, a failure it reported, or its parent's death.

    Args:
        config: ids, the parent's pid and ``worker_init_fn``.
        jobs: the receiving end of this worker's job pipe.
        results: the sending end of this worker's result pipe.
        shared: the object persistent ids refer to (``None`` if the caller gave none).
        seq: the initial sequence.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's business
    _forward_warnings(results)
    try:
        _set_up(config)
    except Exception as exc:
        send(results, WorkerFailed("worker_init_fn", pickle.dumps(error_report(exc))))
        return
    worker = _Worker(config, jobs, results, shared, seq)
    try:
        worker.start_threads()
    except Exception as exc:
        worker.reply(WorkerFailed("thread_init_fn", pickle.dumps(error_report(exc))))
        return
    parent_gone = False
    try:
        worker.reply(Ready(config.worker_id))
        while True:
            worker.handle(worker.next_message())
    except _Stopped as stop:
        parent_gone = stop.parent_gone
    except (EOFError, BrokenPipeError, ConnectionResetError):
        parent_gone = True
    finally:
        if worker.runner is not None:
            worker.runner.stop()
        if parent_gone:
            _unlink_queued_slots(jobs, worker.poller, worker.pending)
        worker.slots.close(unlink=parent_gone)


def _unlink_queued_slots(jobs, poller, pending) -> None:
    """The parent died: remove the names of slots sent to us that we never opened."""
    queued = list(pending)
    try:
        while poller.poll(0):
            queued.append(recv(jobs))
    except (EOFError, OSError, pickle.UnpicklingError):
        pass
    for m in queued:
        if isinstance(m, Job):
            unlink_segment(m.slot_name)
