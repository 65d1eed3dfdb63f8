"""L3: the value checks of a loaded state (shared by the state's modules)."""

from __future__ import annotations

from typing import Any

__all__ = ["STAGE", "check_value", "is_int"]

#: The stage named in every error of a state that cannot be loaded.
STAGE = "load_state_dict"


def is_int(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def check_value(cond: bool, key: str, value: Any, expected: str) -> None:
    """``ValueError: load_state_dict: '<key>' must be <expected> (got <value>)`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{STAGE}: {key!r} must be {expected} (got {value!r})")
