"""Where work runs, chosen once: one validated options object per executor.

:func:`choose_executor` turns the words a caller uses (torch's ``worker_method=`` and
``multiprocessing_context=``, seqloader's ``threads_per_worker=``; :func:`~seqloader.prefetch`'s
``method=``) into exactly one of

* :class:`ProcessWorkers`: worker processes over shared memory (a start method, and threads inside
  each process);
* :class:`ThreadWorkers`: threads of this process;
* :class:`~seqloader.prefetcher.ray_options.RayWorkers`: Ray actors on a cluster;

and refuses, there and then, an argument that means nothing for the executor chosen (naming it).
One vocabulary: ``"process"`` and torch's ``"multiprocessing"`` are the same word everywhere.
Compare SPDL's ``ExecutorConfig`` and Grain's ``options.py``: a plain frozen object per choice,
built once.

An options object carries its executor's behaviour, so that no layer branches on its type. Each
of the three has

* ``build(workers, worker_init_fn, shared, prefetch_factor)``: its executor
  (:class:`~seqloader.prefetcher.executor.Executor`), imported on first use (the process executor
  imports torch, the Ray executor ``ray``);
* ``check(shared=, restarts=, respawn=)``: refuses what means nothing for it (threads share this
  process and do not die as processes do), and returns the number of restarts;
* ``check_num_workers(num_workers)``: refuses ``num_workers=0`` where the options need workers
  (a loader computes in its own process then);
* ``in_this_process`` (its workers are threads of this process: nothing is pickled or sent),
  ``threads`` (items one worker computes at once), ``name`` (its words in messages) and ``word``
  (torch's ``worker_method`` for it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from seqloader.errors import check_int
from seqloader.prefetcher.checks import check_restarts, resolve_context
from seqloader.prefetcher.ray_options import RayWorkers

if TYPE_CHECKING:
    from seqloader.prefetcher.executor import Executor

__all__ = ["MAX_THREADS_PER_WORKER", "ExecutorOptions", "ProcessWorkers", "ThreadWorkers", "choose_executor"]

#: ``threads_per_worker`` above this is refused at once (each thread is an OS thread with its own
#: stack; 100,000 failed after 43 s with "can't start new thread", naming nothing).
MAX_THREADS_PER_WORKER = 256

#: the words for each executor (``worker_method=`` / ``method=``)
_PROCESS_WORDS = ("process", "multiprocessing")
_WORDS = (*_PROCESS_WORDS, "thread", "ray")


@dataclass(frozen=True)
class ProcessWorkers:
    """Worker processes over shared memory.

    Args:
        context: ``None`` (the platform's default start method), ``"fork"``, ``"spawn"``,
            ``"forkserver"`` or a ``multiprocessing`` context object (torch's
            ``multiprocessing_context``).
        threads: items each worker process computes at once, in its own threads
            (``threads_per_worker``), ``1 <= threads <=`` :data:`MAX_THREADS_PER_WORKER`.
        thread_init_fn: ``thread_init_fn(worker_id, thread)``, run first in each of those threads
            (``threads > 1``), or ``None``.

    Example:
        >>> ProcessWorkers(context="spawn", threads=2)
        ProcessWorkers(context='spawn', threads=2)
        >>> ProcessWorkers(threads=0)
        Traceback (most recent call last):
        ValueError: ProcessWorkers: threads_per_worker must be between 1 and 256 (got 0)
        >>> ProcessWorkers(thread_init_fn=print)
        Traceback (most recent call last):
        ValueError: ProcessWorkers: thread_init_fn runs in the threads of a worker process; pass threads > 1 too (got threads=1)
    """

    context: Any = None
    threads: int = 1
    thread_init_fn: Optional[Callable[[int, int], None]] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = check_int("ProcessWorkers", "threads_per_worker", self.threads)
        if not 1 <= n <= MAX_THREADS_PER_WORKER:
            raise ValueError(f"ProcessWorkers: threads_per_worker must be between 1 and {MAX_THREADS_PER_WORKER} "
                             f"(got {n})")
        fn = self.thread_init_fn
        if fn is not None and not callable(fn):
            raise TypeError(f"ProcessWorkers: thread_init_fn must be callable or None (got {type(fn).__name__})")
        if fn is not None and n == 1:
            raise ValueError("ProcessWorkers: thread_init_fn runs in the threads of a worker process; pass "
                             "threads > 1 too (got threads=1)")

    def __repr__(self) -> str:
        fn = "" if self.thread_init_fn is None else f", thread_init_fn={self.thread_init_fn!r}"
        return f"ProcessWorkers(context={self.context!r}, threads={self.threads!r}{fn})"

    @property
    def name(self) -> str:
        """The executor's word in messages."""
        return "multiprocessing" if self.threads == 1 else f"multiprocessing with threads_per_worker={self.threads}"

    #: the workers are other processes: items, sequences and ``shared`` are pickled and sent
    in_this_process = False

    @property
    def word(self) -> str:
        """torch's ``worker_method`` for these options."""
        return "multiprocessing"

    def check_num_workers(self, num_workers: int, stage: str = "DataLoader") -> None:
        """Refuse threads inside worker processes when there is no worker process (``num_workers=0``).

        Example:
            >>> ProcessWorkers().check_num_workers(0)  # the loader computes in its own process
            >>> ProcessWorkers(threads=2).check_num_workers(0)
            Traceback (most recent call last):
            ValueError: DataLoader: threads_per_worker=2 needs num_workers > 0 (got num_workers=0): the threads run inside the worker processes
        """
        if self.threads > 1 and num_workers == 0:
            raise ValueError(f"{stage}: threads_per_worker={self.threads} needs num_workers > 0 (got "
                             "num_workers=0): the threads run inside the worker processes")

    def check(self, stage: str = "prefetch", *, shared: Any = None, restarts: Any = 0, respawn: Any = None) -> int:
        """Worker processes take every argument: ``restarts`` and ``respawn`` checked; the restarts.

        Example:
            >>> ProcessWorkers().check(restarts=2, respawn=lambda w: None)
            2
            >>> ProcessWorkers().check(respawn=print)
            Traceback (most recent call last):
            ValueError: prefetch: respawn is called only when a dead worker is replaced; pass restarts > 0 too (got restarts=0)
        """
        return check_restarts(restarts, respawn)

    def build(self, workers: int, worker_init_fn: Optional[Callable[[int], None]], shared: Any,
              prefetch_factor: int) -> Executor:
        """The process executor: ``workers`` processes over shared memory, each keeping
        ``prefetch_factor + 1`` slots; ``shared`` is sent to each once (torch is imported here)."""
        from seqloader.prefetcher.processes.executor import ProcessExecutor  # lazily: it imports torch

        return ProcessExecutor(resolve_context(self.context), workers, worker_init_fn, shared, self.threads,
                               keep=prefetch_factor + 1, thread_init_fn=self.thread_init_fn)


#: why an argument means nothing for thread workers (``ThreadWorkers.check``)
_NOT_FOR_THREADS = {
    "shared": "threads share this process's objects",
    "restarts": "threads do not die as processes do (an item's exception is its outcome)",
    "respawn": "threads do not die as processes do (an item's exception is its outcome)",
}


@dataclass(frozen=True)
class ThreadWorkers:
    """Threads of this process (torch's ``worker_method="thread"``): nothing is pickled or copied.

    Example:
        >>> ThreadWorkers().name
        'thread'
    """

    @property
    def name(self) -> str:
        """The executor's word in messages."""
        return "thread"

    #: the workers are threads of this process: nothing is pickled or sent
    in_this_process = True
    #: each worker is one thread, computing one item at a time
    threads = 1

    @property
    def word(self) -> str:
        """torch's ``worker_method`` for these options."""
        return "thread"

    def check_num_workers(self, num_workers: int, stage: str = "DataLoader") -> None:
        """Nothing to refuse: with ``num_workers=0`` a loader computes in its own process."""

    def check(self, stage: str = "prefetch", *, shared: Any = None, restarts: Any = 0, respawn: Any = None) -> int:
        """Refuse the arguments of worker processes (``shared``, ``restarts``, ``respawn``); ``0`` restarts.

        Example:
            >>> ThreadWorkers().check(restarts=0)
            0
            >>> ThreadWorkers().check(shared=[1])
            Traceback (most recent call last):
            ValueError: prefetch: shared applies to worker processes only (got [1] with method='thread'); threads share this process's objects
        """
        given = {"shared": shared, "restarts": None if restarts == 0 else restarts, "respawn": respawn}
        for name, value in given.items():
            if value is not None:
                raise ValueError(f"{stage}: {name} applies to worker processes only (got {value!r} with "
                                 f"method='thread'); {_NOT_FOR_THREADS[name]}")
        return 0

    def build(self, workers: int, worker_init_fn: Optional[Callable[[int], None]], shared: Any,
              prefetch_factor: int) -> Executor:
        """The thread executor: ``workers`` daemon threads of this process (``shared`` and
        ``prefetch_factor`` mean nothing here: nothing is sent, nothing is kept per worker)."""
        from seqloader.prefetcher.threads import ThreadExecutor

        return ThreadExecutor(workers, worker_init_fn)


ExecutorOptions = Union[ProcessWorkers, ThreadWorkers, RayWorkers]


def choose_executor(method: Any = "process", *, multiprocessing_context: Any = None, threads_per_worker: Any = 1,
                    thread_init_fn: Any = None, stage: str = "prefetch", argument: str = "method") -> ExecutorOptions:
    """The executor that ``method`` names, with its options checked against it.

    Args:
        method: ``"process"`` (or torch's ``"multiprocessing"``), ``"thread"``, ``"ray"``, or an
            options object (:class:`ProcessWorkers`, :class:`ThreadWorkers`,
            :class:`~seqloader.RayWorkers`), returned as it is.
        multiprocessing_context: a start method or context; worker processes only.
        threads_per_worker: threads inside each worker process; worker processes only.
        thread_init_fn: run first in each of those threads; worker processes only, with
            ``threads_per_worker > 1`` (added to a :class:`ProcessWorkers` that has none).
        stage, argument: who is asking and the name of its ``method`` argument, for messages
            (``"DataLoader"``, ``"worker_method"``).

    Raises:
        TypeError: ``thread_init_fn`` is not callable.
        ValueError: an unknown word, or an argument that means nothing for the chosen executor
            (named, with the reason).

    Example:
        >>> choose_executor("multiprocessing", threads_per_worker=2) == choose_executor("process", threads_per_worker=2)
        True
        >>> choose_executor("thread")
        ThreadWorkers()
        >>> choose_executor("thread", multiprocessing_context="spawn", stage="DataLoader", argument="worker_method")
        Traceback (most recent call last):
        ValueError: DataLoader: multiprocessing_context applies to worker processes only (got 'spawn' with worker_method='thread'); threads start no process
        >>> choose_executor("threads")
        Traceback (most recent call last):
        ValueError: prefetch: method must be 'process' (or 'multiprocessing'), 'thread', 'ray', or a ProcessWorkers, ThreadWorkers or RayWorkers (got 'threads')
    """
    if isinstance(method, (ProcessWorkers, ThreadWorkers, RayWorkers)):
        given = method
        word = "ray" if isinstance(method, RayWorkers) else ("thread" if isinstance(method, ThreadWorkers) else "process")
    elif isinstance(method, str) and method in _WORDS:
        given, word = None, method
    else:
        raise ValueError(f"{stage}: {argument} must be 'process' (or 'multiprocessing'), 'thread', 'ray', or a "
                         f"ProcessWorkers, ThreadWorkers or RayWorkers (got {method!r})")
    threads = check_int(stage, "threads_per_worker", threads_per_worker)
    if word in _PROCESS_WORDS:
        if isinstance(given, ProcessWorkers):
            _refuse_both(stage, given, multiprocessing_context, threads)
            return _with_thread_init_fn(stage, given, thread_init_fn)
        if not 1 <= threads <= MAX_THREADS_PER_WORKER:
            raise ValueError(f"{stage}: threads_per_worker must be between 1 and {MAX_THREADS_PER_WORKER} (got "
                             f"{threads}); each is an OS thread in every worker process")
        return _with_thread_init_fn(stage, ProcessWorkers(context=multiprocessing_context, threads=threads),
                                    thread_init_fn)
    why = {"multiprocessing_context": ("threads start no process" if word == "thread"
                                       else "Ray starts the actors' processes"),
           "threads_per_worker": ("each worker is one thread already: raise num_workers instead" if word == "thread"
                                  else "each actor computes one item at a time: raise num_workers instead"),
           "thread_init_fn": ("worker_init_fn runs in each thread already" if word == "thread"
                              else "each actor computes one item at a time: use worker_init_fn")}
    shown = f"{argument}={word!r}" if given is None else f"{argument}={given!r}"
    _check_callable(stage, thread_init_fn)
    for name, value in (("multiprocessing_context", multiprocessing_context),
                        ("threads_per_worker", None if threads == 1 else threads),
                        ("thread_init_fn", thread_init_fn)):
        if value is not None:
            got = "it" if name == "thread_init_fn" and word == "ray" else repr(value)
            raise ValueError(f"{stage}: {name} applies to worker processes only (got {got} with {shown}); "
                             f"{why[name]}")
    if given is not None:
        return given
    return ThreadWorkers() if word == "thread" else RayWorkers()


def _check_callable(stage: str, fn: Any) -> None:
    if fn is not None and not callable(fn):
        raise TypeError(f"{stage}: thread_init_fn must be callable or None (got {type(fn).__name__})")


def _with_thread_init_fn(stage: str, options: ProcessWorkers, fn: Any) -> ProcessWorkers:
    """``options`` with ``thread_init_fn`` (given as an argument beside it) added."""
    if fn is None:
        return options
    _check_callable(stage, fn)
    if options.thread_init_fn is not None:
        raise ValueError(f"{stage}: thread_init_fn={fn!r} given beside {options!r}; set it in the ProcessWorkers")
    if options.threads == 1:
        raise ValueError(f"{stage}: thread_init_fn runs in the threads of a worker process; pass "
                         "threads_per_worker > 1 too (got threads_per_worker=1)")
    return dataclasses.replace(options, thread_init_fn=fn)


def _refuse_both(stage: str, given: ProcessWorkers, context: Any, threads: int) -> None:
    """A ``ProcessWorkers`` carries its own start method and threads: refuse them given twice."""
    for name, value in (("multiprocessing_context", context), ("threads_per_worker", None if threads == 1 else threads)):
        if value is not None:
            raise ValueError(f"{stage}: {name}={value!r} given beside {given!r}; set it in the ProcessWorkers")
