"""What runs inside a Ray actor of :class:`~seqloader.prefetcher.ray.RayExecutor`, and the wire format.

:class:`RayWorker` is a plain class; the executor turns it into an actor class with
``ray.remote(...)`` (``ray`` is imported there, lazily), so this module imports neither ``ray``
nor ``torch``. One actor is one worker: a process on some node of the cluster, with its own
globals, exactly like a worker process of :class:`~seqloader.prefetcher.processes.executor.ProcessExecutor`.

Its methods run in three concurrency groups (one thread each):

* the default group, in submission order: :meth:`RayWorker.setup` (unpickles the set-up and the
  sequence, runs ``worker_init_fn(worker_id)``), :meth:`RayWorker.compute` (one job) and
  :meth:`RayWorker.retarget` (a new sequence). Set-up and jobs run in the same thread, so
  thread-local state set by ``worker_init_fn`` (stage timing, ``WorkerInfo``) holds for the jobs;
* ``"control"``: :meth:`RayWorker.hint`, the newest generation (queued jobs of older generations
  are skipped, each answered :data:`SKIPPED`);
* ``"watch"``: :meth:`RayWorker.watch`, a call that never returns. The driver keeps it pending for
  the actor's whole life, so a dead actor or node fails it: a sentinel, as a process's is, for
  idle workers too.

Wire format (the pickling is :mod:`seqloader.prefetcher.wire`'s, shared with the worker
processes). A job's reply is a small tuple: ``(SKIPPED,)``, or ``(DONE, ok, seconds, stages, data,
buffers, warned, began)`` where ``data`` is the value (``ok``) or an :func:`~seqloader.prefetcher.faults.error_report`
pickled with protocol 5, ``buffers`` its out-of-band buffers (numpy arrays' and plain CPU
tensors' bytes) as ``uint8`` numpy arrays, ``warned`` the warnings the item showed, which the
driver issues again (as a worker process's reach the training process), and ``began`` when
computing began (``time.perf_counter_ns()``: the driver's clock when the actor runs on its host). Ray stores numpy arrays in its object store without
pickling them (zero-copy on the reader's side), so large arrays are never pickled in band.
:func:`decode` rebuilds the value on the driver from *writable copies* of those buffers (see its
docstring for why). Sequences and the set-up are pickled with ``cloudpickle`` (what Ray users
expect: lambdas work), the ``shared`` object (the dataset) referred to by a persistent id and sent
once per actor.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import warnings
from typing import Any, Optional

import numpy as np

from seqloader.prefetcher import wire
from seqloader.prefetcher.faults import error_report
from seqloader.prefetcher.wire import TRANSFER, loads_with_shared
from seqloader.sequences import stage_times

__all__ = ["DONE", "FAILED", "SKIPPED", "STARTED", "TRANSFER", "RayWorker", "decode", "dumps_shared",
           "dumps_with_shared", "encode", "loads_with_shared"]

#: Reply tags (first item of every reply tuple).
STARTED, FAILED, DONE, SKIPPED = "started", "failed", "done", "skipped"
#: The pending :meth:`RayWorker.watch` call sleeps this many seconds at a time.
WATCH_INTERVAL = 1.0


# --------------------------------------------------------------------------- sequences and set-up


def dumps_with_shared(obj: Any, shared: Any, buffers: Optional[list] = None) -> bytes:
    """``obj`` pickled with ``cloudpickle`` (protocol 5) by the wire's
    :func:`~seqloader.prefetcher.wire.dumps_with_shared`: ``shared`` (sent to each actor once) is
    referred to by id, plain CPU tensors are reduced as values are. With ``buffers``, arrays and
    plain CPU tensors go there, out of band.

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    from ray import cloudpickle  # lazily: only a driver that uses Ray gets here

    return wire.dumps_with_shared(obj, shared, buffers, pickler=cloudpickle.CloudPickler, tensors=True)


def dumps_shared(shared: Any) -> tuple[bytes, list]:
    """The shared object for :meth:`RayWorker.setup`: pickle bytes and out-of-band buffers (uint8
    arrays, which Ray's object store keeps without pickling); each actor rebuilds it with
    :func:`decode` (its own writable copy, as each ``spawn`` worker process has)."""
    buffers: list = []
    data = dumps_with_shared(shared, None, buffers)
    return data, [np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers]


# --------------------------------------------------------------------------- values


def encode(value: Any) -> tuple[bytes, list]:
    """Pickle ``value`` (protocol 5, the wire's :func:`~seqloader.prefetcher.wire.encode`): the
    in-band bytes and the out-of-band buffers as ``uint8`` numpy arrays (numpy arrays, and plain
    CPU tensors, go out of band).

    Example:
        >>> data, buffers = encode({"x": np.arange(4, dtype=np.int64), "n": 3})
        >>> [b.nbytes for b in buffers], decode(data, buffers)["x"].tolist()
        ([32], [0, 1, 2, 3])
        >>> encode(threading.Lock())  # not picklable: the caller reports it as the item's error
        Traceback (most recent call last):
        TypeError: cannot pickle '_thread.lock' object
    """
    view, raws = wire.encode(value)
    return bytes(view), [np.frombuffer(r, dtype=np.uint8) for r in raws]


def decode(data: bytes, buffers: list) -> Any:
    """Rebuild a value from :func:`encode`'s output, its arrays and tensors over *writable copies*
    of ``buffers``.

    What Ray's ``ray.get`` hands back are read-only views of its object store: a tensor made over
    one is not writable (``x += 1`` would crash the process), and every view would pin its object
    in the store for as long as the batch lives (training code keeps batches around), filling it
    until Ray spills to disk. One copy per buffer (memory bandwidth: about 1 ms per 10 MB) gives
    the same writable values as the process and thread executors and frees the object at once.

    Example:
        >>> data, buffers = encode(np.ones(3))
        >>> buffers[0].flags.writeable = False   # as Ray returns them
        >>> out = decode(data, buffers); out += 1; out.tolist()
        [2.0, 2.0, 2.0]
        >>> decode(data, [])
        Traceback (most recent call last):
        _pickle.UnpicklingError: pickle stream refers to out-of-band data but no *buffers* argument was given
    """
    if not buffers:
        return pickle.loads(data)
    return pickle.loads(data, buffers=[np.array(b, dtype=np.uint8, copy=True) for b in buffers])


def _where() -> tuple[int, str, str]:
    """This actor's pid, node id and node address."""
    import ray  # inside an actor, ray is imported already

    ctx = ray.get_runtime_context()
    return os.getpid(), ctx.get_node_id(), ray.util.get_node_ip_address()


# --------------------------------------------------------------------------- the actor


def _warning(message: Any, category: Any, filename: Any, lineno: Any) -> tuple:
    """A warning shown in the actor, as the trainer issues it again:
    ``(category, message, filename, lineno)`` (a category that does not pickle becomes ``UserWarning``)."""
    try:
        pickle.dumps(category)
    except Exception:
        category = UserWarning
    return (category, str(message), str(filename), int(lineno))


class RayWorker:
    """One worker of a :class:`~seqloader.prefetcher.ray.RayExecutor` (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # _latest: read by the job thread, written by the control thread
        self._latest = -1
        self._shared: Any = None
        self._seq: Any = ()
        self._warned: list = []  # warnings shown since the last reply, sent with it (the actor's process is ours)
        warnings.showwarning = self._keep_warning  # once, as a worker process forwards its warnings

    def _keep_warning(self, message: Any, category: Any, filename: Any, lineno: Any, file: Any = None,
                      line: Any = None) -> None:
        """``warnings.showwarning`` in the actor: kept for the next reply, which the trainer issues again."""
        self._warned.append(_warning(message, category, filename, lineno))

    def setup(self, worker_id: int, shared: tuple, init_blob: bytes, seq_blob: bytes, gen: int) -> tuple:
        """Unpickle the shared object (:func:`dumps_shared`), the set-up and the sequence, run
        ``worker_init_fn(worker_id)``; reply ``(STARTED, pid, node_id, node_ip)`` or
        ``(FAILED, stage, error_report)``."""
        stage = "set-up"
        try:
            try:
                self._shared = decode(*shared)
                init_fn = loads_with_shared(init_blob, self._shared)
                self._seq = loads_with_shared(seq_blob, self._shared)
            except ImportError as exc:
                _import_hint(exc)
                raise
            with self._lock:
                self._latest = max(self._latest, gen)
            stage = "worker_init_fn"
            if init_fn is not None:
                init_fn(worker_id)
        except BaseException as exc:  # reported; the executor closes everything and raises it
            return (FAILED, stage, _report(exc))
        return (STARTED, *_where())

    def retarget(self, gen: int, seq_blob: bytes) -> tuple:
        """Read the sequence in ``seq_blob`` from generation ``gen`` on; reply ``(STARTED,)`` or
        ``(FAILED, "reset", error_report)``."""
        try:
            try:
                seq = loads_with_shared(seq_blob, self._shared)
            except ImportError as exc:
                _import_hint(exc)
                raise
        except BaseException as exc:
            return (FAILED, "reset", _report(exc))
        self._seq = seq
        with self._lock:
            self._latest = max(self._latest, gen)
        return (STARTED,)

    def hint(self, gen: int) -> None:
        """Jobs of generations older than ``gen`` are skipped from now on (control group)."""
        with self._lock:
            self._latest = max(self._latest, gen)

    def compute(self, gen: int, index: int) -> tuple:
        """Job ``(gen, index)``: the reply (see the module docstring). A job's exception,
        ``BaseException`` included, is its outcome; it never ends the actor."""
        with self._lock:
            if gen < self._latest:
                return (SKIPPED,)
            self._latest = gen
        times = stage_times.current()
        start = time.perf_counter_ns()  # when it began: the clock of every process of this host
        try:
            value, ok = self._seq[index], True
        except BaseException as exc:
            value, ok = exc, False
        seconds = (time.perf_counter_ns() - start) * 1e-9
        warned, self._warned = tuple(self._warned), []  # an actor computes one job at a time
        token = None if times is None else times.begin()
        try:
            data, buffers = encode(value if ok else _report(value))
        except BaseException as exc:  # the value does not pickle: that is the item's error
            data, buffers, ok = pickle.dumps(_report(_not_picklable(exc, value))), [], False
        if times is not None and token is not None:
            times.end(TRANSFER, token)
        stages = () if times is None else tuple(times.take().items())
        return (DONE, ok, seconds, stages, data, buffers, warned, start)

    def watch(self) -> None:
        """Never return (watch group): the call is pending for the actor's whole life, so that its
        failure tells the driver that the actor or its node died. It sleeps in bounded waits."""
        while True:
            time.sleep(WATCH_INTERVAL)


def _import_hint(exc: BaseException) -> None:
    from seqloader.errors import add_note

    add_note(exc, f"seqloader: a Ray actor on node {_where()[2]} could not import what the sequence or worker_init_fn "
                  "needs; every node must be able to import your dataset's and functions' modules (install them "
                  "there, or pass them with Ray's runtime_env, e.g. ray.init(runtime_env={'py_modules': [...]}))")


def _report(exc: BaseException) -> dict:
    report = error_report(exc)
    exc.__traceback__ = None  # the report holds its text; frames would keep the item's locals alive
    return report


def _not_picklable(exc: BaseException, value: Any) -> BaseException:
    err = TypeError(f"prefetch: the item's value ({type(value).__name__}) cannot be pickled to send it from the "
                    f"Ray actor ({type(exc).__name__}: {exc}); return picklable values (arrays, tensors, "
                    "module-level classes)")
    err.__cause__ = exc
    return err
