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
built once, read by the layer that starts the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from seqloader.errors import check_int
from seqloader.prefetcher.ray_options import RayWorkers

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

    Example:
        >>> ProcessWorkers(context="spawn", threads=2)
        ProcessWorkers(context='spawn', threads=2)
        >>> ProcessWorkers(threads=0)
        Traceback (most recent call last):
        ValueError: ProcessWorkers: threads_per_worker must be between 1 and 256 (got 0)
    """

    context: Any = None
    threads: int = 1

    def __post_init__(self) -> None:
        n = check_int("ProcessWorkers", "threads_per_worker", self.threads)
        if not 1 <= n <= MAX_THREADS_PER_WORKER:
            raise ValueError(f"ProcessWorkers: threads_per_worker must be between 1 and {MAX_THREADS_PER_WORKER} "
                             f"(got {n})")

    @property
    def name(self) -> str:
        """The executor's word in messages."""
        return "multiprocessing" if self.threads == 1 else f"multiprocessing with threads_per_worker={self.threads}"


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


ExecutorOptions = Union[ProcessWorkers, ThreadWorkers, RayWorkers]


def choose_executor(method: Any = "process", *, multiprocessing_context: Any = None, threads_per_worker: Any = 1,
                    stage: str = "prefetch", argument: str = "method") -> ExecutorOptions:
    """The executor that ``method`` names, with its options checked against it.

    Args:
        method: ``"process"`` (or torch's ``"multiprocessing"``), ``"thread"``, ``"ray"``, or an
            options object (:class:`ProcessWorkers`, :class:`ThreadWorkers`,
            :class:`~seqloader.RayWorkers`), returned as it is.
        multiprocessing_context: a start method or context; worker processes only.
        threads_per_worker: threads inside each worker process; worker processes only.
        stage, argument: who is asking and the name of its ``method`` argument, for messages
            (``"DataLoader"``, ``"worker_method"``).

    Raises:
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
            return given
        if not 1 <= threads <= MAX_THREADS_PER_WORKER:
            raise ValueError(f"{stage}: threads_per_worker must be between 1 and {MAX_THREADS_PER_WORKER} (got "
                             f"{threads}); each is an OS thread in every worker process")
        return ProcessWorkers(context=multiprocessing_context, threads=threads)
    why = {"multiprocessing_context": ("threads start no process" if word == "thread"
                                       else "Ray starts the actors' processes"),
           "threads_per_worker": ("each worker is one thread already: raise num_workers instead" if word == "thread"
                                  else "each actor computes one item at a time: raise num_workers instead")}
    shown = f"{argument}={word!r}" if given is None else f"{argument}={given!r}"
    for name, value in (("multiprocessing_context", multiprocessing_context),
                        ("threads_per_worker", None if threads == 1 else threads)):
        if value is not None:
            raise ValueError(f"{stage}: {name} applies to worker processes only (got {value!r} with {shown}); "
                             f"{why[name]}")
    if given is not None:
        return given
    return ThreadWorkers() if word == "thread" else RayWorkers()


def _refuse_both(stage: str, given: ProcessWorkers, context: Any, threads: int) -> None:
    """A ``ProcessWorkers`` carries its own start method and threads: refuse them given twice."""
    for name, value in (("multiprocessing_context", context), ("threads_per_worker", None if threads == 1 else threads)):
        if value is not None:
            raise ValueError(f"{stage}: {name}={value!r} given beside {given!r}; set it in the ProcessWorkers")
