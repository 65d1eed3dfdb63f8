"""L3: save and restore the global RNGs (``random``, ``numpy.random``, torch's CPU generator) fast.

At ``num_workers=0`` every batch is computed in the caller's process, between a save and a
restore of the three global RNG states (:func:`~seqloader.loader.seeding.preserved_globals`).
The public APIs copy each state through Python objects: ``numpy.random.get_state()`` and
``set_state()`` alone cost about 70 µs per batch (a tuple, a 624-word array, validation; ``random``'s
``getstate()``/``setstate()`` 10 µs more), more than torch's own loader spends on a batch of 256
small items; the raw copies of all three cost about 5 µs.

A :class:`Snapshot` copies the same bytes directly:

* numpy: the legacy global ``RandomState``'s MT19937 state (624 words and a position), through
  the bit generator's public ``ctypes.state_address``, plus the ``RandomState``'s cached second
  Gaussian (``has_gauss``, ``gauss``), which ``get_state()`` also saves;
* ``random``: the Mersenne Twister words and index of ``random``'s hidden instance, plus its
  ``gauss_next``;
* torch: ``get_state()``/``set_state()`` (already a single copy).

The two raw locations are *found*, not assumed: :func:`layout` sets known states through the
public APIs on throwaway generators and looks for them in memory, and accepts a location only if
exactly one matches every probe. Where that fails (another Python or numpy build), snapshots use
the public APIs: the same states, only slower (:func:`layout` then returns ``None``; a test
checks that CI's build takes the fast path).

The plain ``snapshots`` route (``SEQLOADER_PLAIN_ROUTES=snapshots``,
:mod:`seqloader.loader.plain_routes`) takes the public APIs without looking for the layout: no
raw memory is read or written (``docs/design.md`` gives the cost per batch).
"""

from __future__ import annotations

import ctypes
import functools
import random
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from seqloader.loader.plain_routes import plain_routes

__all__ = ["Snapshot", "layout", "numpy_state", "reseeded", "reseeding", "reseeds"]

_MT_WORDS = 624
_MT_BYTES = 4 * _MT_WORDS + 4  # numpy's mt19937_state and CPython's RandomObject: 624 words + an int


class Layout(NamedTuple):
    """Where the raw states live (byte offsets from the object's address)."""

    numpy_gauss: int      # RandomState: ``int has_gauss`` (4 bytes, padding), ``double gauss``
    random_index: int     # _random.Random: ``int index`` followed by ``uint32_t state[624]``


def _find(blob: bytes, needle: bytes) -> list[int]:
    out, at = [], blob.find(needle)
    while at >= 0:
        out.append(at)
        at = blob.find(needle, at + 1)
    return out


def _numpy_gauss_offset() -> Optional[int]:
    rs = np.random.RandomState(0)
    size = type(rs).__basicsize__
    key = np.arange(_MT_WORDS, dtype=np.uint32)
    found: Optional[set[int]] = None
    for has_gauss, gauss in ((1, 0.8414709848078965), (0, -1.2345678912345678e-300), (1, 3.0e200)):
        rs.set_state(("MT19937", key, 5, has_gauss, gauss))
        mt = ctypes.string_at(rs._bit_generator.ctypes.state_address, _MT_BYTES)
        if mt != key.tobytes() + (5).to_bytes(4, "little"):  # the MT19937 words, then pos
            return None
        blob = ctypes.string_at(id(rs), size)
        hits = {at - 8 for at in _find(blob, np.float64(gauss).tobytes()) if at % 8 == 0 and at >= 8
                and int.from_bytes(blob[at - 8:at - 4], "little", signed=True) == has_gauss}
        found = hits if found is None else found & hits
    return found.pop() if found is not None and len(found) == 1 else None


def _random_index_offset() -> Optional[int]:
    r = random.Random()
    size = type(r).__basicsize__
    found: Optional[set[int]] = None
    for base, index in ((1000, 7), (77_000, 624), (5, 0)):
        words = tuple(range(base, base + _MT_WORDS))
        r.setstate((3, words + (index,), None))
        blob = ctypes.string_at(id(r), size)
        packed = np.array(words, dtype=np.uint32).tobytes()
        hits = {at - 4 for at in _find(blob, packed) if at >= 4
                and int.from_bytes(blob[at - 4:at], "little", signed=True) == index}
        found = hits if found is None else found & hits
    return found.pop() if found is not None and len(found) == 1 else None


@functools.lru_cache(maxsize=None)
def layout() -> Optional[Layout]:
    """The raw layout of this build's global RNG objects, or ``None`` (then the public APIs are used).

    Example:
        >>> layout() is None or layout().random_index > 0
        True
    """
    if not (isinstance(np.random.mtrand._rand, np.random.RandomState)
            and isinstance(np.random.mtrand._rand._bit_generator, np.random.MT19937)
            and type(random._inst).__mro__[1].__name__ == "Random"):
        return None
    gauss, index = _numpy_gauss_offset(), _random_index_offset()
    return None if gauss is None or index is None else Layout(gauss, index)


def _raw_layout() -> Optional[Layout]:
    """:func:`layout`, or ``None`` (the public APIs) on the plain ``snapshots`` route."""
    return None if plain_routes().snapshots else layout()


_started = 0  # how many times seqloader began setting the global states in this process (any thread)
_done = 0     # ... and finished


def reseeding() -> None:
    """Count the start of one setting of the global states by seqloader (seeding a batch,
    restoring a snapshot); :func:`reseeded` counts its end.

    Without a lock (it runs once per batch in every worker): on a free-threaded build two threads
    counting at the same instant may count once. What reads the counts (the thread workers' probe
    of numpy's global state) could then blame a thread worker for a reseed it did not do (a
    warning too many), never hide a draw."""
    global _started
    _started += 1


def reseeded() -> None:
    """Count the end of a setting begun with :func:`reseeding`."""
    global _done
    _done += 1


def reseeds() -> tuple[int, int]:
    """``(begun, finished)`` settings of the global states by seqloader so far: a window in which
    a global state changed may have seen seqloader's own setting if a setting was under way when
    it began (``begun != finished``) or began during it (``begun`` moved)."""
    return _started, _done


def numpy_state() -> Any:
    """The raw state of numpy's global ``RandomState`` (bytes, or ``get_state()`` with its words as
    bytes where the raw layout is unknown or on the plain route), for comparing, not restoring."""
    where = _raw_layout()
    if where is None:
        name, words, pos, has_gauss, gauss = np.random.get_state()  # the legacy tuple form
        return name, np.asarray(words).tobytes(), pos, has_gauss, gauss
    rs = np.random.mtrand._rand
    return (ctypes.string_at(rs._bit_generator.ctypes.state_address, _MT_BYTES),
            ctypes.string_at(id(rs) + where.numpy_gauss, 16))


class Snapshot:
    """The three global RNG states, taken when the snapshot is made; :meth:`restore` puts them back.

    Example:
        >>> import random
        >>> snap = Snapshot(); a = random.random(); b = float(np.random.rand())
        >>> snap.restore(); (random.random(), float(np.random.rand())) == (a, b)
        True
    """

    __slots__ = ("_where", "_numpy", "_random", "_gauss_next", "_torch")

    def __init__(self) -> None:
        self._where = where = _raw_layout()  # the route taken is the route restored
        self._torch = torch.default_generator.get_state()
        if where is None:
            self._numpy: Any = np.random.get_state()
            self._random: Any = random.getstate()
            return
        rs = np.random.mtrand._rand
        self._numpy = (ctypes.string_at(rs._bit_generator.ctypes.state_address, _MT_BYTES),
                       ctypes.string_at(id(rs) + where.numpy_gauss, 16))
        inst = random._inst
        self._random = ctypes.string_at(id(inst) + where.random_index, _MT_BYTES)
        self._gauss_next = inst.gauss_next  # type: ignore[attr-defined]  # C-level attribute

    def restore(self) -> None:
        """Put the saved states back (a snapshot can be restored more than once)."""
        reseeding()
        where = self._where
        torch.default_generator.set_state(self._torch)
        if where is None:
            np.random.set_state(self._numpy)
            random.setstate(self._random)
            reseeded()
            return
        rs = np.random.mtrand._rand
        ctypes.memmove(rs._bit_generator.ctypes.state_address, self._numpy[0], _MT_BYTES)
        ctypes.memmove(id(rs) + where.numpy_gauss, self._numpy[1], 16)
        inst = random._inst
        ctypes.memmove(id(inst) + where.random_index, self._random, _MT_BYTES)
        inst.gauss_next = self._gauss_next  # type: ignore[attr-defined]
        reseeded()
