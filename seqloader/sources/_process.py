"""What a source keeps per process: state rebuilt after ``fork``, dropped when pickled; its threads.

A source object travels to worker processes (copied by ``fork``, or pickled for ``spawn``).
Open files, decoded blocks and thread pools must not travel with it: :class:`ProcessLocal`
builds its value on first use in each process (it compares ``os.getpid()``) and pickles as an
empty holder. :class:`Threads` is a per-process ``seqloader.threads.ThreadPool`` behind the same
rule; with one thread, or one item, it calls the function in the caller's thread.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Generic, Iterable, TypeVar

from seqloader.errors import check_positive_int

__all__ = ["ProcessLocal", "Threads", "optional_import"]

T = TypeVar("T")
R = TypeVar("R")

_LOCK = threading.Lock()


class ProcessLocal(Generic[T]):
    """``factory()`` built once per process, on first :meth:`get`; pickles without its value.

    Example:
        >>> import pickle
        >>> local = ProcessLocal(dict)
        >>> local.get()["k"] = 1
        >>> local.get(), pickle.loads(pickle.dumps(local)).get()
        ({'k': 1}, {})
    """

    __slots__ = ("_factory", "_pid", "_value")

    def __init__(self, factory: Callable[[], T]):
        self._factory = factory
        self._pid: int | None = None
        self._value: T | None = None

    def get(self) -> T:
        pid = os.getpid()
        if self._pid != pid:
            with _LOCK:
                if self._pid != pid:
                    self._value = self._factory()
                    self._pid = pid
        return self._value  # type: ignore[return-value]

    def peek(self) -> T | None:
        """The value built in this process, or ``None`` when :meth:`get` has not built one here."""
        return self._value if self._pid == os.getpid() else None

    def put(self, value: T) -> None:
        """Make ``value`` this process's value (other processes still build theirs with the factory)."""
        with _LOCK:
            self._value, self._pid = value, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self._factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._factory, self._pid, self._value = state["factory"], None, None


def _make_pool(num_threads: int) -> Any:
    from seqloader.threads import ThreadPool

    return ThreadPool(num_threads)


class Threads:
    """Run a function over items on at most ``num_threads`` threads of this process, in order.

    The pool (``seqloader.threads.ThreadPool``) is created on the first call that needs more
    than one thread, once per process, and starts threads only as items wait for one.
    :meth:`release` stops it (a source's index is built, and local files need no threads after
    that); a later call that needs threads starts a new one. Results come back in item order; the
    first error (in item order) is re-raised with its type.

    Example:
        >>> import threading
        >>> before, threads = set(threading.enumerate()), Threads("demo", 2)
        >>> threads.map(lambda x: x * 2, [1, 2, 3])
        [2, 4, 6]
        >>> threads.release()                 # joins this process's threads; idempotent
        >>> threads.release(); set(threading.enumerate()) - before
        set()
        >>> threads.map(lambda x: x + 1, [1, 2])    # a new pool, started as needed
        [2, 3]
        >>> threads.release()
    """

    def __init__(self, op: str, num_threads: int):
        self.num_threads = check_positive_int(op, "num_threads", num_threads)
        self._pool: ProcessLocal[Any] = ProcessLocal(functools.partial(_make_pool, self.num_threads))

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        items = list(items)
        if self.num_threads == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self._pool.get().map(fn, items))

    def release(self) -> None:
        """Stop this process's pool, if one was started, and join its threads (not while another
        thread of this process is inside :meth:`map`)."""
        pool = self._pool.peek()
        if pool is not None:
            self._pool = ProcessLocal(functools.partial(_make_pool, self.num_threads))
            pool.close()


def optional_import(module: str, extra: str, op: str) -> Any:
    """Import an optional dependency, or raise ``ImportError`` naming the extra that installs it.

    Example:
        >>> optional_import("json", "none", "demo").__name__
        'json'
        >>> optional_import("no_such_module_xyz", "parquet", "parquet")
        Traceback (most recent call last):
        ImportError: parquet: needs the optional package 'no_such_module_xyz'; install it with `pip install seqloader[parquet]`
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{op}: needs the optional package {module.split('.')[0]!r}; install it with "
                          f"`pip install seqloader[{extra}]`") from exc
