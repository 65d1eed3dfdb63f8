"""What a :class:`~seqloader.prefetcher.prefetch.Prefetch` raises when something goes wrong.

Two infrastructure errors (:class:`WorkerDied`, :class:`ItemTimeout`, both ``RuntimeError``),
:func:`error_report` (what a worker sends about an error: the exception when it pickles, else its
type, message and traceback), and :func:`rebuild_error`, which turns such a report back into the
user's own exception:
same type and message, a note naming the item or stage, worker and pid, and the worker-side
traceback chained as ``__cause__``.
"""

from __future__ import annotations

import pickle
import traceback

from seqloader.errors import add_note

__all__ = ["INDEX_ATTR", "SETUP_STEP", "ItemTimeout", "RemoteTraceback", "WorkerDied", "error_report", "rebuild_error"]

#: The attribute a read sets on an item's error: the index of the item that raised it.
INDEX_ATTR = "seqloader_index"
#: The attribute an error of a ``worker_init_fn`` may carry: which step of it failed, named in the
#: note instead of ``worker_init_fn`` (the loader's own set-up, whose user never passed one).
SETUP_STEP = "seqloader_setup_step"


class WorkerDied(RuntimeError):
    """A worker process ended (signal, ``os._exit``, crash) while the reader needed it.

    Attributes:
        worker_id, pid: which worker.
        exitcode: its exit status (negative: killed by signal ``-exitcode``; ``None``: unknown).
        item: the item it was producing, or ``None`` if it was idle or setting up.
        poison: ``item`` killed two workers (the original and its replacement, see
            :mod:`seqloader.prefetcher.healing`): it is not computed again.
        suspects: the items a worker running several threads was computing when it died, when
            there were several (``item`` is then ``None``: which one ended it cannot be told).
    """

    def __init__(self, message: str, *, worker_id: int, pid: int | None, exitcode: int | None,
                 item: int | None, poison: bool = False, suspects: tuple = ()):
        super().__init__(message)
        self.worker_id, self.pid, self.exitcode, self.item = worker_id, pid, exitcode, item
        self.poison, self.suspects = poison, suspects


class ItemTimeout(RuntimeError):
    """Waiting for one item took longer than ``timeout`` seconds; the ``Prefetch`` stays usable.

    Attributes:
        seconds: the timeout; item: the item waited for (for :meth:`Prefetch.take`: the oldest
        item in flight); worker_id, pid: its worker, if known.
    """

    def __init__(self, message: str, *, seconds: float, item: int, worker_id: int | None,
                 pid: int | None):
        super().__init__(message)
        self.seconds, self.item, self.worker_id, self.pid = seconds, item, worker_id, pid


class RemoteTraceback(Exception):
    """The worker-side traceback of an item's error, chained as ``__cause__`` in the reader."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def rebuild_error(report: dict, note: str | None = None, index: int | None = None) -> BaseException:
    """The exception described by a worker's error report (:func:`error_report`).

    Args:
        report: the report; its ``exc`` is used when it survived pickling, else ``type(message)``,
            else ``RuntimeError("TypeName: message")``.
        note: added with :func:`~seqloader.errors.add_note`, if given.
        index: when given, stored as the attribute ``seqloader_index`` (:data:`INDEX_ATTR`).

    Returns:
        The exception, ready to raise, with the remote traceback as ``__cause__``.

    Example:
        >>> report = {"exc": None, "type": KeyError, "type_name": "KeyError", "message": "'k'",
        ...           "traceback": "Traceback ...\\nKeyError: 'k'\\n"}
        >>> e = rebuild_error(report, "seqloader: raised while computing item 3", index=3)
        >>> type(e).__name__, e.seqloader_index, e.__notes__
        ('KeyError', 3, ['seqloader: raised while computing item 3'])
        >>> report["type"] = None  # its class did not survive pickling
        >>> rebuild_error(report, "note")
        RuntimeError("KeyError: 'k'")
    """
    exc = report["exc"]
    if exc is None and report["type"] is not None:
        try:
            exc = report["type"](report["message"])
        except Exception:
            exc = None
    if exc is None:
        exc = RuntimeError(f"{report['type_name']}: {report['message']}")
    if note is not None:
        add_note(exc, note)
    if index is not None:
        setattr(exc, INDEX_ATTR, index)
    exc.__cause__ = RemoteTraceback(report["traceback"])
    return exc


def error_report(exc: BaseException) -> dict:
    """A picklable description of ``exc``: the exception itself when it survives a round trip."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickle.loads(pickle.dumps(exc))
        keep = exc
    except Exception:
        keep = None
    try:
        pickle.dumps(type(exc))
        typ = type(exc)
    except Exception:
        typ = None
    return {"exc": keep, "type": typ, "type_name": type(exc).__qualname__, "message": str(exc),
            "traceback": tb}
