"""Error helpers shared by every layer: argument checks and notes on user errors.

Our own checks raise ``TypeError``, ``ValueError`` or ``IndexError`` with messages shaped
``<stage>: <what failed> (<values>)[; <what to do>]``. Errors raised by user code (a dataset's
``__getitem__``, a function given to ``smap``, a ``collate_fn``) keep their type and message and
gain a note naming the stage and the index; see :func:`annotate`.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Iterator

__all__ = [
    "add_note",
    "annotate",
    "check_int",
    "check_nonnegative_int",
    "check_positive_int",
    "normalize_index",
]


def add_note(exc: BaseException, note: str) -> BaseException:
    """Attach ``note`` to ``exc`` (``BaseException.add_note`` on 3.11+, ``__notes__`` on 3.10).

    Args:
        exc: the exception to annotate; it is modified in place.
        note: one line of text.

    Returns:
        The same exception object, for chaining.

    Example:
        >>> e = add_note(ValueError("bad"), "seqloader: raised in smap(f) at item 3")
        >>> e.__notes__
        ['seqloader: raised in smap(f) at item 3']
    """
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            setattr(exc, "__notes__", notes)  # not in BaseException's stubs before 3.11
        notes.append(note)
    return exc


@contextlib.contextmanager
def annotate(stage: Any, index: int, **context: Any) -> Iterator[None]:
    """Re-raise any ``Exception`` from the block unchanged, with a note naming stage and index.

    Only the innermost stage adds its note, so an error travelling through several stages
    names the one where user code failed.

    Args:
        stage: the sequence op (its ``repr`` is used) or a short name.
        index: the item index the stage was computing.
        **context: extra ``key=value`` pairs shown in parentheses (e.g. ``batch=3``).

    Raises:
        Exception: whatever the block raised, same type and message, with one extra note.

    Example:
        >>> try:
        ...     with annotate("smap(f)", 8):
        ...         raise KeyError("x")
        ... except KeyError as e:
        ...     print(e.__notes__)
        ['seqloader: raised in smap(f) at item 8']
    """
    try:
        yield
    except Exception as exc:
        note_stage(exc, stage, index, **context)
        raise


def note_stage(exc: BaseException, stage: Any, index: int, **context: Any) -> None:
    """Add :func:`annotate`'s note to ``exc`` unless an inner stage already did (for hot paths
    that use ``try``/``except`` instead of a ``with`` block).

    Example:
        >>> e = KeyError("x"); note_stage(e, "DataLoader", 3, batch=0); note_stage(e, "outer", 1)
        >>> e.__notes__
        ['seqloader: raised in DataLoader at item 3 (batch 0)']
    """
    if getattr(exc, "_seqloader_annotated", False):
        return
    extra = ", ".join(f"{k} {v}" for k, v in context.items())
    where = f"seqloader: raised in {stage!r}" if not isinstance(stage, str) else f"seqloader: raised in {stage}"
    add_note(exc, f"{where} at item {index}" + (f" ({extra})" if extra else ""))
    try:
        setattr(exc, "_seqloader_annotated", True)  # a private marker, not a declared attribute
    except AttributeError:  # pragma: no cover - exceptions with __slots__
        pass


def check_int(op: str, arg: str, value: Any) -> int:
    """Return ``value`` as an ``int`` or raise ``TypeError`` naming ``op`` and ``arg``.

    ``bool`` is rejected: ``shuffle(seq, seed=True)`` is almost certainly a mistake.

    Example:
        >>> check_int("shard", "rank", 2)
        2
        >>> check_int("shard", "rank", 1.5)
        Traceback (most recent call last):
        TypeError: shard: rank must be an int (got float 1.5)
    """
    if isinstance(value, bool):
        raise TypeError(f"{op}: {arg} must be an int (got bool {value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {arg} must be an int (got {type(value).__name__} {value!r})") from None


def check_nonnegative_int(op: str, arg: str, value: Any) -> int:
    """Like :func:`check_int`, and ``ValueError`` when ``value < 0``.

    Example:
        >>> check_nonnegative_int("shuffle", "seed", -1)
        Traceback (most recent call last):
        ValueError: shuffle: seed must be a non-negative int (got -1)
    """
    i = check_int(op, arg, value)
    if i < 0:
        raise ValueError(f"{op}: {arg} must be a non-negative int (got {i})")
    return i


def check_positive_int(op: str, arg: str, value: Any) -> int:
    """Like :func:`check_int`, and ``ValueError`` when ``value <= 0``.

    Example:
        >>> check_positive_int("batch", "k", 0)
        Traceback (most recent call last):
        ValueError: batch: k must be a positive int (got 0)
    """
    i = check_int(op, arg, value)
    if i <= 0:
        raise ValueError(f"{op}: {arg} must be a positive int (got {i})")
    return i


def normalize_index(key: Any, length: int, stage: Any) -> int:
    """Map an integer index in ``[-length, length)`` to ``[0, length)``.

    Args:
        key: the index (any object with ``__index__``, numpy integers included; not ``bool``).
        length: the length of the sequence.
        stage: the sequence being indexed; its ``repr`` names it in errors.

    Returns:
        The non-negative index.

    Raises:
        TypeError: ``key`` is not an integer.
        IndexError: ``key`` is out of range.

    Example:
        >>> normalize_index(-1, 10, "seq")
        9
        >>> normalize_index(10, 10, "seq")
        Traceback (most recent call last):
        IndexError: seq: index 10 out of range [-10, 10)
    """
    if type(key) is int and 0 <= key < length:  # the common case: no repr, no conversion
        return key
    name = stage if isinstance(stage, str) else repr(stage)  # only for an error or an unusual key
    if isinstance(key, bool):
        raise TypeError(f"{name}: indices must be integers or slices, not bool")
    try:
        i = operator.index(key)
    except TypeError:
        raise TypeError(f"{name}: indices must be integers or slices, not {type(key).__name__}") from None
    j = i + length if i < 0 else i
    if not 0 <= j < length:
        raise IndexError(f"{name}: index {i} out of range [-{length}, {length})")
    return j
