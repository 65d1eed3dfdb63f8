"""L1: the Feistel network of a block shuffle's windows, vectorised over windows of different sizes.

Offset ``r`` of a window of size ``m`` keyed by ``w`` is permuted by a Feistel network over
``[0, m)`` (the one of :mod:`seqloader.orders.permutation`, per element: radix ``a = ceil(sqrt(m))``,
``b = ceil(m / a)``, six rounds, cycle-walking) with round keys ``mix(mix(w ^ K) + (r+1)*G)``
(splitmix64's ``mix``, ``K`` the block shuffle's key, ``G`` the golden-ratio constant), so one
numpy pass serves positions of windows of different sizes. :func:`feistel` is the vectorised
map, :func:`feistel_int` the same in pure Python (moved out of
:mod:`seqloader.orders.block_permutation`; the order is unchanged and pinned there).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["feistel", "feistel_int"]

_U64 = npt.NDArray[np.uint64]

_ROUNDS = 6
_M64 = (1 << 64) - 1
_C1, _C2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9  # the round function of seqloader.orders.permutation
_S1, _S2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's finaliser
_G = 0x9E3779B97F4A7C15
_U = {c: np.uint64(c) for c in (_C1, _C2, _S1, _S2, 27, 30, 31, 32, 1)}



def _mix(x: _U64) -> _U64:
    x = x ^ (x >> _U[30])
    x *= _U[_S1]
    x ^= x >> _U[27]
    x *= _U[_S2]
    out: _U64 = x ^ (x >> _U[31])
    return out


def _mix_int(x: int) -> int:
    x = ((x ^ (x >> 30)) * _S1) & _M64
    x = ((x ^ (x >> 27)) * _S2) & _M64
    return x ^ (x >> 31)


def _round_keys(w: _U64, key: int) -> list[_U64]:
    base = _mix(w ^ np.uint64(key))
    return [_mix(base + np.uint64(((r + 1) * _G) & _M64)) for r in range(_ROUNDS)]


def _round_keys_int(w: int, key: int) -> list[int]:
    base = _mix_int(w ^ key)
    return [_mix_int((base + (r + 1) * _G) & _M64) for r in range(_ROUNDS)]


def _ceil_sqrt(m: _U64) -> _U64:
    """``isqrt(m - 1) + 1`` for ``1 <= m < 2**63``: a float estimate, corrected exactly."""
    v = m - _U[1]
    s = np.floor(np.sqrt(v.astype(np.float64))).astype(np.uint64)
    for _ in range(2):
        s = np.where(s * s > v, s - _U[1], s)
        s = np.where((s + _U[1]) * (s + _U[1]) <= v, s + _U[1], s)
    out: _U64 = s + _U[1]
    return out


def _network(x: _U64, a: _U64, b: _U64, keys: list[_U64]) -> _U64:
    for r, k in enumerate(keys):
        mod, q = (b, a) if r % 2 == 0 else (a, b)
        left, right = np.divmod(x, mod)
        h = (right ^ k) * _U[_C1]
        h ^= h >> _U[32]
        h *= _U[_C2]
        h >>= _U[32]
        x = right * q + (left + h % q) % q
    return x


def feistel(x: _U64, m: _U64, w: _U64, key: int) -> _U64:
    """Element ``i``: the image of ``x[i]`` under window ``w[i]``'s bijection of ``[0, m[i])``."""
    one = x.size > 1 and w[0] == w[-1] and bool((w == w[0]).all())
    if one:  # the usual call (a run inside one window): its shape and keys computed once, broadcast
        m, w = m[:1], w[:1]
    a = _ceil_sqrt(m)
    b = (m + a - _U[1]) // a
    keys = _round_keys(w, key)
    y = _network(x, a, b, keys)
    todo = np.flatnonzero(y >= m)
    while todo.size:  # cycle-walk the few that land in [m, a*b)
        sub: Any = slice(None) if one else todo  # (one window: the shape and keys broadcast)
        y[todo] = _network(y[todo], a[sub], b[sub], [k[sub] for k in keys])
        todo = todo[y[todo] >= m[sub]]
    return y


def feistel_int(x: int, m: int, w: int, key: int) -> int:
    a = math.isqrt(m - 1) + 1
    b = -(-m // a)
    keys = _round_keys_int(w, key)
    while True:
        for r, k in enumerate(keys):
            mod, q = (b, a) if r % 2 == 0 else (a, b)
            left, right = divmod(x, mod)
            h = ((right ^ k) * _C1) & _M64
            h ^= h >> 32
            h = ((h * _C2) & _M64) >> 32
            x = right * q + (left + h % q) % q
        if x < m:
            return x
