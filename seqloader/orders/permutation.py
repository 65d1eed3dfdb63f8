"""L1 orders: a keyed pseudo-random permutation of ``[0, n)`` with O(1) memory (a Feistel network).

``shuffle`` needs item ``i`` of a permuted order without materialising the order, so that a
loader can seek to any position of an epoch of any length. :class:`FeistelPermutation` is a
bijection of ``[0, a * b)`` with ``a = ceil(sqrt(n))`` and ``b = ceil(n / a)``, built from Feistel
rounds over the mixed radix ``Z_a x Z_b`` (the "generalised Feistel" of format-preserving
encryption, with addition modulo the half's size instead of xor). Positions that land in
``[n, a * b)`` are walked again ("cycle-walking") until they fall inside ``[0, n)``, which keeps
it a bijection of ``[0, n)``. As ``a * b - n < a``, a walk is needed with probability below
``1 / sqrt(n)``: one pass of the network is almost always enough, which keeps a vectorised call
to a fixed handful of numpy operations.

Round ``r`` splits ``x = L * m + R`` with ``m = b`` for even ``r`` and ``m = a`` for odd ``r``, and
maps it to ``R * q + (L + F(R, key_r)) mod q`` with ``q = a * b / m``. ``F`` is a multiply/xor-shift
hash of ``R`` and the round key. Round keys are ``derive_seed(seed, "shuffle", n, r)``, so the
order depends on ``seed`` and ``n`` only. The permutation is statistically well mixed, not a
cryptographic object.

The map is vectorised over ``numpy.uint64`` arrays; :meth:`FeistelPermutation.index` computes the
same map for one position in pure Python. Long arrays (the loader's 4096-position chunks) take a
faster route to the same values: ``F`` read from a per-round table of its ``m`` values (for
``m <= 2**16``) and the two reductions ``% q`` done with a scalar division and a minimum, which
together halve a chunk's cost (about 150 µs instead of 300 µs).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import numpy.typing as npt

from seqloader.errors import check_int, check_nonnegative_int, check_positive_int
from seqloader.rng import check_seed, derive_seed

__all__ = ["FeistelPermutation", "MAX_N"]

#: The largest supported ``n`` (positions must fit in a signed 64-bit integer).
MAX_N = 2**63

_M64 = (1 << 64) - 1
_C1 = 0x9E3779B97F4A7C15
_C2 = 0xBF58476D1CE4E5B9
_U_C1 = np.uint64(_C1)
_U_C2 = np.uint64(_C2)
_U32 = np.uint64(32)

#: A uint64 array of positions (the network's working type).
_U64 = npt.NDArray[np.uint64]


#: From this many positions on, ``x % q`` is computed as ``x - (x // q) * q``: numpy divides a
#: uint64 array by a scalar with libdivide but computes ``%`` and ``divmod`` by a full division,
#: so the longer form is ~25% faster on a 4096-position chunk (the loader's) and slower on a few
#: hundred (``mix``), where the number of numpy calls dominates. Both give the same values.
_MANY = 1024

#: The largest half (``m``) whose round function is tabulated (see ``_round_functions``).
_TABLE_MAX = 1 << 16


def _divmod(x: _U64, m: np.uint64) -> tuple[_U64, _U64]:
    if x.size < _MANY:
        d, r = np.divmod(x, m)
        return d, r
    d = x // m
    return d, x - d * m


def _mod(x: _U64, q: np.uint64) -> _U64:
    """``x % q``, in place for the long form."""
    if x.size < _MANY:
        out: _U64 = x % q
        return out
    x -= (x // q) * q
    return x


def _mod_below_2q(x: _U64, q: np.uint64) -> _U64:
    """``x % q`` for ``x < 2 * q``: a subtraction and a minimum for the long form."""
    if x.size < _MANY:
        out: _U64 = x % q
        return out
    low: _U64 = np.minimum(x, x - q)  # x - q wraps above x when x < q (unsigned, q < 2**32)
    return low


class FeistelPermutation:
    """A pseudo-random bijection of ``[0, n)`` determined by ``(n, seed)``, in O(1) memory.

    Args:
        n: the size of the domain, ``0 <= n <= 2**63``.
        seed: an int in ``[0, 2**64)``.
        rounds: the number of Feistel rounds (default 6).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range.

    Example:
        >>> p = FeistelPermutation(10, seed=0)
        >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
        True
        >>> p.index(3) == int(p(np.array([3]))[0])
        True
        >>> int(p.inverse(p(np.array([7])))[0])
        7
        >>> FeistelPermutation(0, seed=0)(np.array([], dtype=np.int64)).tolist()
        []
        >>> p.index(10)
        Traceback (most recent call last):
        IndexError: FeistelPermutation(n=10, seed=0, rounds=6): index 10 out of range [0, 10)
    """

    def __init__(self, n: int, seed: int, rounds: int = 6):
        n = check_nonnegative_int("FeistelPermutation", "n", n)
        if n > MAX_N:
            raise ValueError(f"FeistelPermutation: n must be <= 2**63 (got {n})")
        self._n = n
        self._seed = check_seed("FeistelPermutation", seed)
        self._rounds = check_positive_int("FeistelPermutation", "rounds", rounds)
        self._setup()

    def _setup(self) -> None:
        n = self._n
        a = math.isqrt(n - 1) + 1 if n > 1 else 1  # ceil(sqrt(n))
        b = -(-n // a) if n > 1 else 1              # a * b >= n and a * b - n < a
        self._radix = (a, b)
        # Per round: (m, q, key): x = L * m + R with R < m, L < q, and m * q == a * b.
        params = []
        for r in range(self._rounds if n > 1 else 0):
            m, q = (b, a) if r % 2 == 0 else (a, b)
            if q == 1:  # L is always 0: the round is the identity
                continue
            params.append((m, q, derive_seed(self._seed, "shuffle", n, r)))
        self._params = tuple(params)
        self._np_params = tuple((np.uint64(m), np.uint64(q), np.uint64(key)) for m, q, key in params)
        self._tables: Optional[tuple[Optional[_U64], ...]] = None  # F per round, built on first long call

    def _round_functions(self, many: bool) -> tuple[Optional[_U64], ...]:
        """Per round, ``F`` of every right half (``F(R)`` for ``R < m``) as a table, or ``None``.

        ``F`` depends on the right half only, which takes ``m ~ sqrt(n)`` values: for an array of
        :data:`_MANY` positions or more, one gather from a table replaces the hash's seven numpy
        operations (the loader's 4096-position chunks then cost ~40% less). Tables are built once
        per permutation, only for ``m <= _TABLE_MAX`` (at most ``rounds * 512 KiB``, whatever
        ``n``), and never pickled.
        """
        if not many:
            return (None,) * len(self._np_params)
        if self._tables is None:
            self._tables = tuple(self._f(np.arange(int(m), dtype=np.uint64), key, q) if m <= _TABLE_MAX
                                 else None for m, q, key in self._np_params)
        return self._tables

    # -- the network on [0, a * b) ------------------------------------------------------------

    @staticmethod
    def _f(right: _U64, key: np.uint64, q: np.uint64) -> _U64:
        # numpy's stubs type some uint64 array arithmetic as Any: the annotations restore it.
        h: _U64 = right ^ key
        h *= _U_C1
        h ^= h >> _U32
        h *= _U_C2
        h >>= _U32
        return _mod(h, q)

    def _encrypt(self, x: _U64) -> _U64:
        tables = self._round_functions(x.size >= _MANY)
        for (m, q, key), table in zip(self._np_params, tables):
            left, right = _divmod(x, m)
            s = self._f(right, key, q) if table is None else table.take(right.view(np.int64))
            s += left
            x = right * q
            x += _mod_below_2q(s, q)
        return x

    def _decrypt(self, x: _U64) -> _U64:
        tables = self._round_functions(x.size >= _MANY)
        for (m, q, key), table in zip(reversed(self._np_params), reversed(tables)):
            right, low = _divmod(x, q)
            low += q
            low -= self._f(right, key, q) if table is None else table.take(right.view(np.int64))
            x = _mod_below_2q(low, q) * m
            x += right
        return x

    def _encrypt_int(self, x: int) -> int:
        for m, q, key in self._params:
            left, right = divmod(x, m)
            h = ((right ^ key) * _C1) & _M64
            h ^= h >> 32
            h = (h * _C2) & _M64
            x = right * q + (left + (h >> 32) % q) % q
        return x

    def _decrypt_int(self, x: int) -> int:
        for m, q, key in reversed(self._params):
            right, low = divmod(x, q)
            h = ((right ^ key) * _C1) & _M64
            h ^= h >> 32
            h = (h * _C2) & _M64
            x = ((low - (h >> 32) % q) % q) * m + right
        return x

    def _walk(self, x: _U64, step: Callable[[_U64], _U64], step_int: Callable[[int], int]) -> _U64:
        n = self._n
        y = step(x)
        todo = np.flatnonzero(y >= np.uint64(n))
        while todo.size > 16:  # many to walk again: vectorised
            z = step(y[todo])
            y[todo] = z
            todo = todo[z >= np.uint64(n)]
        for i in todo.tolist():  # a few (the usual case): a vectorised pass costs ~100 µs
            v = int(y[i])
            while v >= n:
                v = step_int(v)
            y[i] = v
        return y

    def _check(self, idx: npt.ArrayLike) -> _U64:
        a = np.asarray(idx)
        if a.dtype.kind not in "iu":
            if a.size == 0:
                return np.zeros(a.shape, dtype=np.uint64)
            raise TypeError(f"{self!r}: positions must be an integer array (got dtype {a.dtype})")
        if a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi >= self._n:
                bad = lo if lo < 0 else hi
                raise IndexError(f"{self!r}: position {bad} out of range [0, {self._n})")
        return a.astype(np.uint64, copy=True)

    # -- public API ---------------------------------------------------------------------------

    def __call__(self, idx: npt.ArrayLike) -> _U64:
        """Map an array of positions in ``[0, n)`` to their images, as a new ``uint64`` array.

        Raises:
            TypeError: ``idx`` is not an integer array.
            IndexError: a position is outside ``[0, n)``.
        """
        x = self._check(idx)
        if not self._params or x.size == 0:
            return x
        return self._walk(x.reshape(-1), self._encrypt, self._encrypt_int).reshape(x.shape)

    def inverse(self, idx: npt.ArrayLike) -> _U64:
        """The inverse map: ``p.inverse(p(x)) == x``; same arguments and errors as calling ``p``."""
        x = self._check(idx)
        if not self._params or x.size == 0:
            return x
        return self._walk(x.reshape(-1), self._decrypt, self._decrypt_int).reshape(x.shape)

    def index(self, i: int) -> int:
        """The image of one position (pure Python; equal to ``int(p(np.array([i]))[0])``).

        Raises:
            TypeError: ``i`` is not an int.
            IndexError: ``i`` is outside ``[0, n)``.
        """
        i = check_int(repr(self), "index", i)
        n = self._n
        if not 0 <= i < n:
            raise IndexError(f"{self!r}: index {i} out of range [0, {n})")
        x = self._encrypt_int(i)
        while x >= n:
            x = self._encrypt_int(x)
        return x

    def __len__(self) -> int:
        return self._n

    @property
    def n(self) -> int:
        """The size of the domain (``len`` fails for ``n == 2**63``, as for ``range``)."""
        return self._n

    @property
    def seed(self) -> int:
        return self._seed

    def __repr__(self) -> str:
        return f"FeistelPermutation(n={self._n}, seed={self._seed}, rounds={self._rounds})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FeistelPermutation):
            return NotImplemented
        return (self._n, self._seed, self._rounds) == (other._n, other._seed, other._rounds)

    def __hash__(self) -> int:
        return hash((FeistelPermutation, self._n, self._seed, self._rounds))

    def __getstate__(self) -> dict[str, int]:
        return {"n": self._n, "seed": self._seed, "rounds": self._rounds}

    def __setstate__(self, state: dict[str, int]) -> None:
        self._n, self._seed, self._rounds = state["n"], state["seed"], state["rounds"]
        self._setup()
