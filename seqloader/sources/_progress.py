"""Progress of a long index build: a bar at a terminal, log lines otherwise.

Building a source's index costs one read per file (a footer, a tar pass), which for thousands
of files on object storage takes minutes. :class:`Progress` counts the files done, by how each
was obtained (``"cached"``, ``"scanned"``, ``"read"``), from any thread. When the build has at
least :data:`EVERY` files it shows a ``tqdm`` bar if ``tqdm`` is installed and stderr is a
terminal, else it logs an INFO line on the ``seqloader`` logger every :data:`EVERY` files and at
the end. What happened to each file is logged at DEBUG by the sources themselves.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

__all__ = ["Progress", "EVERY", "log"]

#: Files per progress line; builds of fewer files report nothing at INFO.
EVERY = 100

log = logging.getLogger("seqloader")


def _bar(op: str, total: int, unit: str) -> Any:
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=f"{op}: indexing", unit=unit.rstrip("s"), leave=False)


class Progress:
    """Count the files of an index build and report them (see the module docstring).

    Example:
        >>> p = Progress("demo", 3, "files")
        >>> for how in ("cached", "scanned", "cached"):
        ...     p.update(how)
        >>> p.close(); p.counts
        {'cached': 2, 'scanned': 1}
    """

    def __init__(self, op: str, total: int, unit: str):
        self.op, self.total, self.unit = op, total, unit
        self.done = 0
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._loud = total >= EVERY
        self._bar = _bar(op, total, unit) if self._loud else None

    def _line(self) -> str:
        how = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        return f"{self.op}: indexed {self.done}/{self.total} {self.unit}" + (f" ({how})" if how else "")

    def update(self, how: str) -> None:
        """One more file done, obtained ``how``."""
        with self._lock:
            self.done += 1
            self.counts[how] = self.counts.get(how, 0) + 1
            if self._bar is not None:
                self._bar.update(1)
            elif self._loud and (self.done % EVERY == 0 or self.done == self.total):
                log.info(self._line())

    def close(self) -> None:
        """Close the bar, if any (the summary stays in :attr:`counts`)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            log.info(self._line())
