"""L3: save and restore the global RNGs (``random``, ``numpy.random``, torch's CPU generator) fast.

At ``num_workers=0`` every batch is computed in the caller's process, between a save and a
restore of the three global RNG states (:func:`~seqloader.loader.rngs.seeding.preserved_globals`).
The public APIs copy each state through Python objects: ``numpy.random.get_state()`` and
``set_state()`` alone cost about 70 µs per batch (a tuple, a 624-word array, validation; ``random``'s
``getstate()``/``setstate()`` 10 µs more), more than torch's own loader spends on a batch of 256
small items; the raw copies of all three cost about 2.6 µs.

A :class:`Snapshot` copies the same bytes directly, through writable ``memoryview`` s of their
memory made once per process (:func:`raw_views`):

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

__all__ = ["Snapshot", "Views", "layout", "numpy_state", "random_state", "raw_views", "reseeded", "reseeding",
           "reseeds"]

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


class Views(NamedTuple):
    """Writable byte views of the three raw states, and the objects they lie in (held, so the
    memory stays theirs while the views are used)."""

    rs: Any                    # numpy's global RandomState
    bit_generator: Any         # its MT19937
    inst: Any                  # random's hidden Random instance
    numpy_mt: memoryview       # the MT19937 words and position
    numpy_gauss: memoryview    # the RandomState's has_gauss and gauss
    random_mt: memoryview      # random's index and words


def _view(address: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


_views: Optional[Views] = None


def raw_views() -> Optional[Views]:
    """Views of the raw states for this build's :func:`layout` (``None``: the public APIs, on
    the plain ``snapshots`` route or where the layout is unknown).

    Made once and reused while numpy's global ``RandomState`` (and its bit generator) and
    ``random``'s instance are the same objects; made again, checked, when one was replaced.
    A copy through a view costs about 0.2 µs, against about 1 µs for a ``ctypes.string_at`` or
    ``memmove`` call (what the snapshots used before).

    Example:
        >>> v = raw_views()
        >>> v is None or (len(v.numpy_mt), len(v.random_mt)) == (2500, 2500)
        True
    """
    global _views
    where = _raw_layout()
    if where is None:
        return None
    rs, inst = np.random.mtrand._rand, random._inst
    views = _views
    if views is not None and views.rs is rs and views.inst is inst and views.bit_generator is rs._bit_generator:
        return views
    bit_generator = rs._bit_generator
    if not isinstance(rs, np.random.RandomState) or type(bit_generator) is not np.random.MT19937:
        return None   # (numpy's global generator was replaced by another kind: its layout is not known)
    views = Views(rs, bit_generator, inst, _view(bit_generator.ctypes.state_address, _MT_BYTES),
                  _view(id(rs) + where.numpy_gauss, 16), _view(id(inst) + where.random_index, _MT_BYTES))
    _views = views   # (a race between threads makes two equal views; either is right)
    return views


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


def _numpy_public_state() -> Any:
    """``numpy.random.get_state()``: the legacy tuple for MT19937, else the dict (without the
    warning numpy gives when asked for a tuple it cannot make)."""
    if type(np.random.mtrand._rand._bit_generator) is np.random.MT19937:
        return np.random.get_state(legacy=True)
    return np.random.get_state(legacy=False)


def numpy_state() -> Any:
    """The raw state of numpy's global ``RandomState`` (bytes, or ``get_state()`` with its words as
    bytes where the raw layout is unknown or on the plain route), for comparing, not restoring."""
    views = raw_views()
    if views is None:
        state = _numpy_public_state()
        if isinstance(state, dict):   # another bit generator than MT19937 (np.random.set_bit_generator)
            return repr(state)
        name, words, pos, has_gauss, gauss = state  # the legacy tuple form
        return name, np.asarray(words).tobytes(), pos, has_gauss, gauss
    return views.numpy_mt.tobytes(), views.numpy_gauss.tobytes()


def random_state() -> Any:
    """The raw state of ``random``'s hidden instance (its words, index and cached Gaussian; or
    ``random.getstate()`` where the raw layout is unknown or on the plain route), for comparing.

    Example:
        >>> before = random_state(); _ = random.random(); random_state() == before
        False
    """
    views = raw_views()
    if views is None:
        return random.getstate()
    return views.random_mt.tobytes(), views.inst.gauss_next


class Snapshot:
    """The three global RNG states, taken when the snapshot is made; :meth:`restore` puts them back.

    Example:
        >>> import random
        >>> snap = Snapshot(); a = random.random(); b = float(np.random.rand())
        >>> snap.restore(); (random.random(), float(np.random.rand())) == (a, b)
        True
    """

    __slots__ = ("_views", "_numpy", "_numpy_gauss", "_random", "_gauss_next", "_torch")

    def __init__(self) -> None:
        self._views = views = raw_views()  # the route taken is the route restored
        self._torch = torch.default_generator.get_state()
        if views is None:
            self._numpy: Any = _numpy_public_state()
            self._random: Any = random.getstate()
            return
        self._numpy = views.numpy_mt.tobytes()
        self._numpy_gauss = views.numpy_gauss.tobytes()
        self._random = views.random_mt.tobytes()
        self._gauss_next = views.inst.gauss_next

    def restore(self) -> None:
        """Put the saved states back (a snapshot can be restored more than once)."""
        reseeding()
        views = self._views
        torch.default_generator.set_state(self._torch)
        if views is None:
            np.random.set_state(self._numpy)
            random.setstate(self._random)
            reseeded()
            return
        views.numpy_mt[:] = self._numpy
        views.numpy_gauss[:] = self._numpy_gauss
        views.random_mt[:] = self._random
        views.inst.gauss_next = self._gauss_next
        reseeded()
