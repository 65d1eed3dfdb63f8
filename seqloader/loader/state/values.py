"""The value checks of a loader state: every int below ``2**63``, and the shape of a refusal.

Part of the state's format (:mod:`seqloader.loader.state.state`, which re-exports these names): each
check raises ``ValueError: load_state_dict: '<key>' must be <expected> (got <value>)``, the value
cut short by :func:`shown`. Formerly ``validation.py``, then a part of ``state.py`` (now ``state/state.py``).
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["INT_LIMIT", "STAGE", "check_int_in", "check_value", "is_int", "is_int_in", "shown"]

#: The stage named in every error of a state that cannot be loaded.
STAGE = "load_state_dict"
#: Every int of a state is below this bound (int64).
INT_LIMIT = 2**63

_short = reprlib.Repr()
_short.maxlist = _short.maxdict = _short.maxtuple = 8
_short.maxstring = _short.maxother = 120
_short.maxlevel = 4


def is_int(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_int_in(v: Any, low: int = 0) -> bool:
    """An int (not a bool) in ``[low, 2**63)``.

    Example:
        >>> is_int_in(3), is_int_in(-1), is_int_in(2**63), is_int_in(-1, low=-2**63), is_int_in(True)
        (True, False, False, True, False)
    """
    return is_int(v) and low <= v < INT_LIMIT


def shown(value: Any) -> str:
    """``repr(value)`` for a message, cut short (long lists, deep nesting, ints of thousands of digits).

    Example:
        >>> shown(10**30), shown(10**5000), shown(list(range(100)))
        ('1000000000000000000000000000000', 'an int of 16610 bits', '[0, 1, 2, 3, 4, 5, 6, 7, ...]')
    """
    if is_int(value) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    try:
        return _short.repr(value)
    except Exception:  # a huge int nested in a list, a __repr__ that raises
        return f"a {type(value).__name__}"


def check_value(cond: bool, key: str, value: Any, expected: str) -> None:
    """``ValueError: load_state_dict: '<key>' must be <expected> (got <value>)`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{STAGE}: {key!r} must be {expected} (got {shown(value)})")


def check_int_in(key: str, value: Any, low: int = 0, none_ok: bool = False) -> None:
    """``value`` is an int in ``[low, 2**63)`` (or ``None`` when ``none_ok``), else ``ValueError``
    naming ``key``.

    Example:
        >>> check_int_in("epoch", 3); check_int_in("epoch", 10**30)
        Traceback (most recent call last):
        ValueError: load_state_dict: 'epoch' must be a non-negative int < 2**63 (got 1000000000000000000000000000000)
    """
    if none_ok and value is None:
        return
    what = {0: "a non-negative int", 1: "a positive int"}.get(low, f"an int >= {low}")
    check_value(is_int_in(value, low), key, value, ("None or " if none_ok else "") + what + " < 2**63")


