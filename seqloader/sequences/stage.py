"""What an op answers when asked what decides its positions: a :class:`Stage` (see :mod:`seqloader.sequences.describe`).

Apart from the walk so that :mod:`seqloader.sequences.base` (whose slices answer too) imports it
without a cycle; :func:`digest` and :func:`function_name` are the two helpers a stage's parameters use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

__all__ = ["Stage", "digest", "function_name"]


@dataclasses.dataclass(frozen=True)
class Stage:
    """An op's answer to "what decides which sample my positions are" (see :mod:`seqloader.sequences.describe`)."""

    name: str
    params: dict[str, Any]
    children: tuple[Any, ...] = ()
    values: tuple[Any, ...] = ()
    source: bool = False


def digest(value: Any, n: int = 16) -> str:
    """``n`` hex digits of the SHA-256 of ``value``: bytes as they are, anything else as sorted JSON
    (what is not JSON by its ``repr``).

    Example:
        >>> digest({"b": 1, "a": [2]}) == digest({"a": [2], "b": 1}), len(digest(b"x", 8))
        (True, 8)
    """
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, default=repr).encode()
    return hashlib.sha256(data).hexdigest()[:n]


def function_name(f: Any) -> str:
    """A function's identity: ``module.qualname`` (a ``partial`` by its function's).

    Example:
        >>> import functools, math
        >>> function_name(math.floor), function_name(functools.partial(math.floor))
        ('math.floor', 'math.floor')
    """
    f = getattr(f, "func", f)
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__qualname__
    return f"{getattr(f, '__module__', None) or type(f).__module__}.{name}"
