"""An op's index in this process: loaded from its file or built, once, behind a lock.

:class:`IndexHolder` runs the protocol every indexed op (``pack``, ``keep``) shares. On first use
it asks the op for its key (the index file's *location* and *content*, see ``_store``); when the
op can be cached it tries the file, else (or when the file is absent, stale or damaged) it
calls the op's ``_build()``, writes the file, and logs the cost on the ``seqloader`` logger. The
result and how it was obtained (``stats``) travel with the op when it is pickled (to ``spawn``
workers), so workers neither rebuild nor reload it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional, Protocol

import numpy as np

from seqloader.packing import _store

__all__ = ["IndexHolder", "IndexedOp"]

_log = logging.getLogger("seqloader")

class IndexedOp(Protocol):
    """What :class:`IndexHolder` needs from an op."""

    _op: str

    @property
    def _names(self) -> tuple[str, ...]:
        """The arrays of the index file."""

    def _key(self) -> tuple[dict[str, Any], Optional[dict[str, Any]], str]:
        """``(location, content, why)``: ``content`` is ``None`` when the index is not cached (``why`` says why)."""

    def _build(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The arrays of a new index and what building them cost."""

    def _adopt(self, arrays: dict[str, np.ndarray]) -> Any:
        """The in-memory index from its arrays."""

    def _summary(self, value: Any) -> dict[str, Any]:
        """Figures of the index for ``index_stats()`` (items, windows, ...)."""


class IndexHolder:
    """Holds one op's index once obtained; ``get(op)`` obtains it at most once per process."""

    def __init__(self, cache: bool, cache_dir: Optional[str]):
        self.cache, self.cache_dir = cache, cache_dir
        self.value: Any = None
        self.stats: Optional[dict[str, Any]] = None
        self._lock = threading.Lock()

    def get(self, op: IndexedOp) -> Any:
        value = self.value
        if value is None:
            with self._lock:
                if self.value is None:
                    self.value, self.stats = self._obtain(op)
                value = self.value
        return value

    def _obtain(self, op: IndexedOp) -> tuple[Any, dict[str, Any]]:
        t0 = time.perf_counter()
        location, content, why = op._key()
        path = None
        if not self.cache:
            why = "off: cache=False"
        elif content is not None:
            path = _store.file_for(op._op, location, self.cache_dir)
            got = _store.load(repr(op), path, location, content, op._names)
            if got is not None:
                header = got.pop("header")
                value = op._adopt(got)
                built = header.get("stats", {})  # with the summary: the same content gives the same figures
                stats = {**built, "index": "loaded", "seconds": time.perf_counter() - t0, "items_read": 0,
                         "cache": "hit", "cache_file": path}
                _log.debug("%r: index loaded from %s in %.3f s (built in %.3f s)", op, path, stats["seconds"],
                           built.get("built_in_seconds", float("nan")))
                return value, stats
        arrays, built = op._build()
        value = op._adopt(arrays)
        built.update(op._summary(value))
        built["built_in_seconds"] = time.perf_counter() - t0
        stats = {**built, "index": "built", "seconds": built["built_in_seconds"], "cache_file": path}
        if path is None:
            stats["cache"] = why if why.startswith("off") else f"off: {why}"
        else:
            try:
                _store.save(path, {"op": op._op, "location": location, "content": content, "stats": built}, arrays)
                stats["cache"] = "written"
            except OSError as exc:
                stats["cache"] = f"not written: {exc}"
                _log.warning("%r: could not write the index file %s (%s); it will be rebuilt next time", op, path, exc)
        _log.info("%r: index built in %.3f s (%s items read; %s); cache: %s", op, stats["seconds"],
                  f"{stats.get('items_read', 0):,}", ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v:,}" for k, v in op._summary(value).items()),
                  stats["cache"] if path is None else f"{stats['cache']} {path}")
        return value, stats

    def __getstate__(self) -> dict[str, Any]:
        return {"cache": self.cache, "cache_dir": self.cache_dir, "value": self.value, "stats": self.stats}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cache, self.cache_dir = state["cache"], state["cache_dir"]
        self.value, self.stats = state["value"], state["stats"]
        self._lock = threading.Lock()
