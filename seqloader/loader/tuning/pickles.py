"""L3: whether what worker processes would be sent pickles, without keeping the bytes (autotune
tries processes under ``spawn``/``forkserver`` only for a pipeline that does: ``loader/epoch/tuned.py``)."""

from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["unpicklable"]


class _Discard:
    def write(self, b: Any) -> int:
        return len(b)


class _CheckPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:   # arrays and tensors pickle: their bytes are not needed here
        return (tuple, ()) if isinstance(obj, (torch.Tensor, np.ndarray)) else NotImplemented


def unpicklable(obj: Any) -> Optional[str]:
    """Why ``obj`` does not pickle (``"PicklingError: ..."``), or ``None`` if it does; nothing is
    kept (the bytes are dropped as written, and arrays and tensors are not copied).

    Example:
        >>> unpicklable((list, [1, 2], torch.zeros(3))) is None
        True
        >>> unpicklable([lambda x: x]).split(":")[0]
        'PicklingError'
    """
    try:
        _CheckPickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception as exc:   # whatever pickling raises is the reason
        return f"{type(exc).__name__}: {exc}"
    return None
