"""L3: the switch to the plain routes of seqloader's three process-wide mechanisms.

seqloader changes things beyond its own objects in three places, each to be fast or exact where
the public route is slow or inexact (``docs/design.md``, "Private details we depend on"):

* ``probe``: the thread workers' global-draw probe puts a profile hook (``sys.setprofile``) on a
  thread worker's own thread during its first batch of an epoch
  (:class:`~seqloader.loader.rngs.probe.GlobalDrawProbe`). Plain route: no hook; a draw from
  the global ``random``, ``numpy.random`` or torch generator in a thread worker is then not reported.
* ``snapshots``: at ``num_workers=0`` the global RNG states are saved and put back around each
  batch by copying their raw memory (``ctypes``; :class:`~seqloader.loader.rngs.snapshots.Snapshot`).
  Plain route: ``numpy.random.get_state``/``set_state`` and ``random.getstate``/``setstate``, the
  same states, slower (the measured cost is in ``docs/design.md``).
* ``worker_info``: while thread workers live, torch's ``get_worker_info`` and
  ``torch.random.initial_seed`` run a thread-aware body (their code objects are replaced in place;
  :mod:`seqloader.loader.torch_compat`). Plain route: nothing of torch's is replaced, and so thread
  workers (``worker_method="thread"``, ``threads_per_worker > 1``) are refused with
  :class:`PlainRouteRefused` (a ``ValueError``) when a loader opens them: torch's module-global
  ``WorkerInfo`` would show one thread's info to every thread.

The switch is one frozen :class:`PlainRoutes`, read once, when this module is first imported,
from the environment variable ``SEQLOADER_PLAIN_ROUTES`` (comma-separated route names, or
``all``; an unknown name raises ``ValueError`` there). Worker processes read the same variable
from the environment they inherit. :func:`using_plain_routes` switches it inside a block, for
tests (in this process only: a ``spawn`` worker reads the environment).

Example:
    >>> PlainRoutes.parse("snapshots, probe")
    PlainRoutes(probe=True, snapshots=True, worker_info=False)
    >>> with using_plain_routes("worker_info"):
    ...     plain_routes().worker_info
    True
    >>> PlainRoutes.parse("snapshot")
    Traceback (most recent call last):
    ...
    ValueError: SEQLOADER_PLAIN_ROUTES: unknown route(s) ['snapshot'] (known: probe, snapshots, worker_info, all)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator, Union

__all__ = ["ENV", "ROUTES", "PlainRouteRefused", "PlainRoutes", "plain_routes", "using_plain_routes"]

#: the environment variable read once at import
ENV = "SEQLOADER_PLAIN_ROUTES"
#: the route names, in the order :class:`PlainRoutes` lists them
ROUTES = ("probe", "snapshots", "worker_info")


@dataclasses.dataclass(frozen=True)
class PlainRoutes:
    """Which of the three mechanisms take their plain route (``True``) instead of the default."""

    probe: bool = False
    snapshots: bool = False
    worker_info: bool = False

    @classmethod
    def parse(cls, text: str) -> "PlainRoutes":
        """The routes named in ``text`` (``"probe,snapshots"``, ``"all"``, ``""`` for none)."""
        names = {name.strip() for name in text.split(",") if name.strip()}
        if "all" in names:
            names = (names - {"all"}) | set(ROUTES)
        unknown = sorted(names - set(ROUTES))
        if unknown:
            raise ValueError(f"{ENV}: unknown route(s) {unknown} (known: {', '.join(ROUTES)}, all)")
        return cls(**{name: name in names for name in ROUTES})

    def __str__(self) -> str:
        return ",".join(name for name in ROUTES if getattr(self, name))


class PlainRouteRefused(ValueError):
    """What the plain ``worker_info`` route refuses (thread workers); a ``ValueError`` naming the
    switch and the reason."""


_routes = PlainRoutes.parse(os.environ.get(ENV, ""))


def plain_routes() -> PlainRoutes:
    """The routes in force (read from ``SEQLOADER_PLAIN_ROUTES`` at import, or set by
    :func:`using_plain_routes`)."""
    return _routes


@contextlib.contextmanager
def using_plain_routes(routes: Union[PlainRoutes, str]) -> Iterator[PlainRoutes]:
    """Take ``routes`` inside the block (this process only), then the previous ones again; for tests.

    A loader decides at construction or when it opens its workers: switch before either.
    """
    global _routes
    new = PlainRoutes.parse(routes) if isinstance(routes, str) else routes
    if not isinstance(new, PlainRoutes):
        raise TypeError(f"using_plain_routes: routes must be a PlainRoutes or a str (got {type(routes).__name__})")
    previous, _routes = _routes, new
    try:
        yield new
    finally:
        _routes = previous
