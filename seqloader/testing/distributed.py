"""L4: run a function in a small, real ``torch.distributed`` world of local processes.

:func:`run_distributed` is what seqloader's own distributed tests and the docs use to check
sharding and elastic resume without a cluster: it starts ``world_size`` fresh ``spawn``
processes, joins them into a gloo process group through a ``file://`` rendezvous in a
directory you choose, calls ``fn(rank, world_size, *args)`` in each, and returns the results in
rank order. Nothing is global: the rendezvous file, the result files and the processes belong to
one call, and every process is joined (or killed) before it returns.

Protocol (parent side):

1. create a fresh rendezvous file name and one result file name per rank in ``workdir``;
2. start one ``spawn`` process per rank; each calls ``init_process_group(backend,
   init_method="file://...")``, runs ``fn``, writes ``("ok", value)`` or ``("error", exc,
   traceback_text)`` to its result file with ``pickle``, always calls
   ``destroy_process_group()``, runs the ``atexit`` handlers and leaves with ``os._exit`` (the
   interpreter's native teardown can abort on gloo's threads after the work is done);
3. wait on the process sentinels until all have exited, one has failed or ``timeout`` passes.
   After a failure the others get 2 s to exit (a peer often fails *because of* the first
   failure, e.g. "connection reset" in a collective) and are then terminated: they would
   otherwise block in a collective until the gloo timeout. Stragglers are killed after 5 s;
4. re-raise the earliest failure (by the time each rank caught it) with its original type and a
   note with the rank's traceback, or return the values.
"""

from __future__ import annotations

import atexit
import datetime
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import tempfile
import time
import traceback
import uuid
from typing import Any, Callable, Optional, Sequence

from seqloader.errors import add_note, check_positive_int

__all__ = ["run_distributed"]

_OP = "run_distributed"
_KILL_GRACE_S = 5.0
_PEER_GRACE_S = 2.0


def _rank_main(fn: Callable, rank: int, world_size: int, args: tuple, init_file: str, result_file: str,
               backend: str, timeout: float, num_threads: Optional[int]) -> None:
    """Body of one rank (runs in the spawned process)."""
    import torch
    import torch.distributed as dist

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        try:
            outcome: tuple = ("ok", fn(rank, world_size, *args))
        except BaseException as exc:  # reported to the parent, which re-raises it
            outcome = ("error", exc, traceback.format_exc(), time.time())
        _report(result_file, outcome, rank)  # before leaving the group: peers may fail right after
    finally:
        dist.destroy_process_group()
    # The outcome is on disk. Run Python's exit handlers (multiprocessing's, weakref finalizers
    # that close loaders' workers), then leave without the interpreter's native teardown: gloo's
    # C++ threads can abort it ("terminate called without an active exception", SIGABRT) after
    # a rank has already succeeded.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if outcome[0] == "error" else 0)


def _report(result_file: str, outcome: tuple, rank: int) -> None:
    """Write ``outcome`` atomically; an outcome that does not pickle becomes a RuntimeError."""
    try:
        payload = pickle.dumps(outcome)
    except Exception:
        text = outcome[2] if outcome[0] == "error" else traceback.format_exc()
        payload = pickle.dumps(("error", RuntimeError(f"{_OP}: rank {rank}'s result does not pickle"), text,
                                time.time()))
    with open(result_file + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(result_file + ".tmp", result_file)


def _wait(procs: Sequence, deadline: float, stop_on_failure: bool) -> Optional[int]:
    """Reap processes until all have exited, ``deadline`` (monotonic) passes or, if
    ``stop_on_failure``, one exits with a non-zero code; return the first failed rank or ``None``."""
    while True:
        failed = next((r for r, p in enumerate(procs) if p.exitcode not in (None, 0)), None)
        pending = [p for p in procs if p.exitcode is None]  # one snapshot: never wait on an empty list
        left = deadline - time.monotonic()
        if not pending or left <= 0 or (stop_on_failure and failed is not None):
            return failed
        ready = multiprocessing.connection.wait([p.sentinel for p in pending], timeout=left)
        for p in pending:  # a sentinel is ready while its process is still exiting: reap it
            if p.sentinel in ready:
                p.join(max(0.0, min(_KILL_GRACE_S, deadline - time.monotonic())))


def _stop(procs: Sequence) -> None:
    """Terminate the processes still alive, then kill those that outlive the grace period."""
    procs = [p for p in procs if p.pid is not None]  # started ones only
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _KILL_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(_KILL_GRACE_S)


def run_distributed(fn: Callable[..., Any], world_size: int, args: tuple = (), *,
                    workdir: Optional[str | os.PathLike] = None, backend: str = "gloo",
                    timeout: float = 60.0, num_threads: Optional[int] = 1) -> list:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes forming a process group.

    Args:
        fn: a module-level function (it is pickled by reference into ``spawn`` processes). It may
            use ``torch.distributed`` collectives; its return value must pickle.
        world_size: the number of processes, ``>= 1``.
        args: extra positional arguments for ``fn`` (must pickle).
        workdir: a directory for the ``file://`` rendezvous and the result files; a temporary
            directory (removed afterwards) when ``None``.
        backend: the ``torch.distributed`` backend; ``"gloo"`` runs on any CPU.
        timeout: seconds for the whole run (and for each collective); past it every process
            is terminated.
        num_threads: ``torch.set_num_threads`` in each process (1 keeps several ranks on a
            laptop from fighting over cores); ``None`` leaves torch's default.

    Returns:
        ``[fn(0, ...), fn(1, ...), ...]``, the values returned by each rank.

    Raises:
        Exception: the first rank's exception, same type and message, with a note naming the
            rank and carrying its traceback.
        RuntimeError: a rank died without reporting (e.g. killed by a signal) or the run
            exceeded ``timeout``.
        TypeError, ValueError: ``world_size`` is not a positive int.

    Example:
        >>> run_distributed(_example_sum, 2)   # rank 0 contributes 1, the last rank 0
        [1, 1]
        >>> run_distributed(_example_sum, 0)
        Traceback (most recent call last):
        ValueError: run_distributed: world_size must be a positive int (got 0)
    """
    world_size = check_positive_int(_OP, "world_size", world_size)
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="seqloader-dist-") as tmp:
            return run_distributed(fn, world_size, args, workdir=tmp, backend=backend, timeout=timeout,
                                   num_threads=num_threads)
    tag = uuid.uuid4().hex[:12]
    init_file = os.path.join(os.fspath(workdir), f"rendezvous-{tag}")
    result_files = [os.path.join(os.fspath(workdir), f"result-{tag}-{r}.pkl") for r in range(world_size)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, name=f"seqloader-rank-{r}",
                         args=(fn, r, world_size, tuple(args), init_file, result_files[r], backend, timeout,
                               num_threads))
             for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        failed = _wait(procs, time.monotonic() + timeout, stop_on_failure=True)
        if failed is not None:  # let the peers that fail because of it report too, briefly
            _wait(procs, time.monotonic() + _PEER_GRACE_S, stop_on_failure=False)
        hung = [r for r, p in enumerate(procs) if p.exitcode is None]
    finally:
        _stop(procs)
    if failed is not None:
        errors = {}
        for r, path in enumerate(result_files):
            if procs[r].exitcode != 0 and os.path.exists(path):
                with open(path, "rb") as f:
                    report = pickle.load(f)
                if report[0] == "error":
                    errors[r] = report
        if not errors:
            raise RuntimeError(f"{_OP}: rank {failed} (pid {procs[failed].pid}) exited with code "
                               f"{procs[failed].exitcode} without reporting an error")
        first = min(errors, key=lambda r: errors[r][3])  # the root cause failed first
        _, exc, text, _ = errors[first]
        add_note(exc, f"seqloader: raised in {_OP} at rank {first} of {world_size}; its traceback:\n{text}")
        raise exc
    if hung:
        raise RuntimeError(f"{_OP}: rank(s) {hung} did not finish within {timeout} s and were terminated")
    results = []
    for r, path in enumerate(result_files):
        with open(path, "rb") as f:
            results.append(pickle.load(f)[1])
    return results


def _example_sum(rank: int, world_size: int) -> int:
    """All-reduce ``1`` from every rank except the last (used by the docstring example)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([0 if rank == world_size - 1 else 1])
    dist.all_reduce(t)
    return int(t)
