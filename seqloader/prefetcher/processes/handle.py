"""The reader's side of one worker process: the process, its two pipes, and how it ended.

:class:`WorkerHandle` starts the process (:func:`~seqloader.prefetcher.processes.worker.worker_main`)
and reads and writes whole messages with SIGINT held, so a Ctrl-C never leaves a pipe holding
half a message (see the shutdown NOTE in :mod:`seqloader.prefetcher.processes.executor`).
"""

from __future__ import annotations

import select
import signal
import time
from typing import Any

from seqloader.prefetcher.processes.messages import Stop, WorkerConfig
from seqloader.prefetcher.processes.worker import recv, send, worker_main

__all__ = ["WorkerHandle", "describe_exit"]

_SIGMASK = hasattr(signal, "pthread_sigmask")
_SIGINT_ONLY = (signal.SIGINT,)


def _hold_sigint() -> Any:
    """Hold SIGINT in this thread while one message is written or read whole: a Ctrl-C between a
    message's length and its bytes would leave the pipe out of step for good. The held signal is
    delivered by :func:`_release_sigint` (``KeyboardInterrupt`` right after the message). The public
    ``signal.pthread_sigmask`` (a set of enums per call: about 2 µs more than the C function under
    it, 7 µs a batch at four calls; docs/design.md, "Private details we depend on")."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT_ONLY) if _SIGMASK else None


def _release_sigint(held: Any) -> None:
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
    """One worker process with its job pipe (parent -> worker) and result pipe (worker -> parent)."""

    def __init__(self, ctx: Any, config: WorkerConfig, shared: Any, seq: Any):
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
        self.broken = False  # a send to it failed: it is gone
        self.reported = False  # its death was reported (Died)
        self.running: dict[tuple[int, int], None] = {}  # jobs begun and not answered (several threads)
        self._joined = False
        self._poll = select.poll()
        self._poll.register(self.results.fileno(), select.POLLIN)

    def readable(self) -> bool:
        """Whether a reply (or EOF) is waiting on the result pipe."""
        return bool(self._poll.poll(0))

    def send(self, msg: Any) -> None:
        held = _hold_sigint()
        try:
            send(self.jobs, msg)
        finally:
            _release_sigint(held)

    def recv(self) -> Any:
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
