"""A weighted sampler (draws with replacement) whose weights can change at an exact position.

Position ``p`` of epoch ``e`` draws index ``i`` with probability ``w_i / sum(w)``, from a uniform
that is a pure function of ``(seed, epoch, segment, p)``: the ``p``-th output of a SplitMix64
counter keyed by ``derive_seed(seed, "weighted_sampler", epoch, segment)``, turned into an index
by ``numpy.searchsorted`` over the cumulative weights. No generator state: a resume is a seek, and
any read order gives the same indices. ``segment`` counts the weight changes: 0 for the weights the
sampler was built with, ``c`` from the ``c``-th :meth:`WeightedSampler.reweight` on.

Draws are independent, so a resumed run needs only the weights in force from the last change on:
the state holds a fingerprint of each weights array (16 hex digits of SHA-256 over its float64
bytes), never the arrays. On resume the user passes the weights again, a different array is an
error, and positions before the last change (whose weights the state does not hold) raise instead
of being guessed.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, cast

import numpy as np
import numpy.typing as npt
import torch

from seqloader.errors import check_nonnegative_int, check_positive_int
from seqloader.orders.orders import Indices
from seqloader.loader.world import draw_seed
from seqloader.rng import check_seed, derive_seed
from seqloader.loader.samplers.shuffle import SeekableSampler

__all__ = ["WeightedOrder", "WeightedSampler", "fingerprint"]

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def fingerprint(weights: Any) -> str:
    """16 hex digits of SHA-256 over the weights as little-endian float64 bytes.

    Example:
        >>> fingerprint([1, 2, 3]) == fingerprint(np.array([1.0, 2.0, 3.0]))
        True
        >>> fingerprint([1, 2, 3]) == fingerprint([1, 2, 3.5]), len(fingerprint([]))
        (False, 16)
    """
    data = np.ascontiguousarray(np.asarray(weights, dtype="<f8")).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _uniforms(key: int, positions: _I64) -> _F64:
    """Uniforms in ``[0, 1)``: output ``p`` of SplitMix64 seeded with ``key`` (mixes every bit)."""
    x = np.uint64(key) + (positions.astype(np.uint64) + np.uint64(1)) * _GOLDEN  # wraps mod 2**64
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    out: _F64 = (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return out


def _check_weights(op: str, weights: Any) -> _F64:
    """``weights`` as a float64 array: 1-D, non-empty, finite, ``>= 0``, with a positive finite sum."""
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().numpy()
    arr = np.asarray(weights) if not isinstance(weights, (str, bytes)) else np.asarray(None)
    if arr.dtype.kind not in "iuf" or arr.ndim != 1:
        raise TypeError(f"{op}: weights must be a 1-D sequence of numbers (got {type(weights).__name__}"
                        f"{' of dtype ' + str(arr.dtype) if arr.ndim else ''} with {arr.ndim} dimensions)")
    if not len(arr):
        raise ValueError(f"{op}: weights must not be empty")
    w: _F64 = arr.astype(np.float64)
    for bad, what in ((~np.isfinite(w), "finite"), (w < 0, ">= 0")):
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{op}: weights must be {what} (weights[{i}] is {arr[i].item()!r})")
    with np.errstate(over="ignore"):
        total = float(np.sum(w))
    if not total > 0:
        raise ValueError(f"{op}: weights are all 0; at least one must be > 0")
    if not np.isfinite(total):
        raise ValueError(f"{op}: weights sum to inf (largest {w.max().item()!r}); scale them down")
    return w


class _Weights:
    """One weights array, ready to draw from: its cumulative sums and last positive index."""

    def __init__(self, w: _F64):
        self.cdf: _F64 = np.cumsum(w)
        self.last = int(np.flatnonzero(w > 0)[-1])

    def draw(self, key: int, positions: _I64) -> _I64:
        x = _uniforms(key, positions) * self.cdf[-1]
        idx: _I64 = np.minimum(np.searchsorted(self.cdf, x, side="right"), self.last)  # x may round up to the total
        return idx


class WeightedOrder:
    """The :class:`~seqloader.orders.orders.Order` of one epoch of a :class:`WeightedSampler`.

    ``parts`` are ``(start, change, key, weights)``: from position ``start`` on, draws use the
    weights of change ``change`` (``(epoch, position)``), keyed by ``key``; ``weights`` is
    ``None`` when the sampler does not hold them (after ``load_state_dict``; reading there raises
    ``ValueError``). ``held_from`` is the sampler's last change.
    """

    def __init__(self, n: int, epoch: int, parts: list[tuple[int, tuple[int, int], int, Optional[_Weights]]],
                 held_from: tuple[int, int]):
        self.n, self.epoch, self.parts, self.held_from = n, epoch, parts, held_from
        self._starts = np.array([p[0] for p in parts], dtype=np.int64)

    def _draw(self, part: int, pos: _I64) -> _I64:
        _, change, key, weights = self.parts[part]
        if weights is None:
            raise ValueError(f"WeightedSampler: position {int(pos.min())} of epoch {self.epoch} draws with the "
                             f"weights of the change at (epoch {change[0]}, position {change[1]}), which this "
                             "sampler does not hold (a loaded state has their fingerprint, not the weights); "
                             f"read from its last change (epoch {self.held_from[0]}, position "
                             f"{self.held_from[1]}) on")
        return weights.draw(key, pos)

    def lookup(self, pos: np.ndarray) -> Indices:
        """The indices drawn at the (int64) positions ``pos``."""
        p = np.asarray(pos, dtype=np.int64).reshape(-1)
        if not p.size:
            return []
        if len(self.parts) == 1:
            return cast(Indices, self._draw(0, p).tolist())
        which = np.searchsorted(self._starts, p, side="right") - 1
        out = np.empty(len(p), dtype=np.int64)
        for s in np.unique(which).tolist():
            mask = which == s
            out[mask] = self._draw(s, p[mask])
        return cast(Indices, out.tolist())

    def run(self, first: int, count: int, stride: int) -> Indices:
        """The indices drawn at positions ``first, first + stride, ...`` (``count`` of them)."""
        return self.lookup(first + stride * np.arange(count, dtype=np.int64))


class WeightedSampler(SeekableSampler):
    """Draws ``num_samples`` indices with replacement, index ``i`` with probability ``w_i / sum(w)``.

    Like torch's ``WeightedRandomSampler``, but position ``p`` of epoch ``e`` is a pure function of
    ``(seed, epoch, p)`` and of the weights in force there, so :class:`seqloader.DataLoader` seeks
    into it (its :meth:`order`) and resumes exactly; torch's ``DataLoader`` iterates it (with
    :meth:`set_epoch`). :meth:`reweight` changes the weights from an exact ``(epoch, position)`` on;
    earlier positions keep their draws. The sampler holds each distinct weights array it was given
    (equal arrays once); its state holds their fingerprints, not the arrays: on resume, build the
    sampler with the weights of the last change. A loaded sampler holds only those, so reading a
    position before its last change raises ``ValueError`` (unless that stretch used an equal array).

    Args:
        weights: one finite number ``>= 0`` per dataset index (a sequence, array or tensor), at
            least one ``> 0``; indices of weight 0 are never drawn.
        num_samples: the number of draws per epoch, ``>= 1``.
        seed: an int in ``[0, 2**64)``; ``None`` draws one from torch's default generator.

    Raises:
        TypeError: ``weights`` is not a 1-D sequence of numbers, or ``num_samples``/``seed`` not an int.
        ValueError: ``weights`` empty, negative, not finite or all 0; ``num_samples < 1``; a bad ``seed``.

    Example:
        >>> s = WeightedSampler([0.0, 1.0, 3.0], num_samples=8, seed=0)
        >>> draws = list(s); len(draws), 0 in draws, set(draws) <= {1, 2}
        (8, False, True)
        >>> s.order(0).lookup(np.array([5, 2])) == [draws[5], draws[2]]
        True
        >>> s.reweight([1.0, 0.0, 0.0], epoch=0, position=4)
        >>> s.order(0).run(4, 4, 1), s.order(1).run(0, 3, 1)
        ([0, 0, 0, 0], [0, 0, 0])
        >>> WeightedSampler([0, 0], num_samples=3)
        Traceback (most recent call last):
        ValueError: WeightedSampler: weights are all 0; at least one must be > 0
    """

    def __init__(self, weights: Any, num_samples: int, *, seed: Optional[int] = None):
        op = "WeightedSampler"
        w = _check_weights(op, weights)
        self.num_samples = check_positive_int(op, "num_samples", num_samples)
        self.seed = draw_seed() if seed is None else check_seed(op, seed)
        self.epoch = 0
        self._num_weights = len(w)
        #: ``(epoch, position, fingerprint)`` per change; the first holds the initial weights at (0, 0)
        self._changes: list[tuple[int, int, str]] = [(0, 0, fingerprint(w))]
        #: the weights this sampler holds, by fingerprint
        self._held: dict[str, _Weights] = {self._changes[0][2]: _Weights(w)}

    def __len__(self) -> int:
        return self.num_samples

    @property
    def changes(self) -> list[tuple[int, int, str]]:
        """``[(epoch, position, fingerprint), ...]``: the initial weights at ``(0, 0)``, then each change."""
        return list(self._changes)

    def reweight(self, weights: Any, *, epoch: int, position: int) -> None:
        """Draw with ``weights`` from position ``position`` of ``epoch`` on (and in later epochs).

        ``(epoch, position)`` must not be before the last change; the same pair replaces it.
        Earlier positions keep their draws. Orders built before this call do not see it: read the
        order again (``seqloader.DataLoader`` does when told of a change).

        Raises:
            TypeError, ValueError: bad weights (as for the constructor), a different number of
                weights, ``position`` outside ``[0, num_samples]``, or a pair before the last change.
        """
        op = "WeightedSampler.reweight"
        w = _check_weights(op, weights)
        if len(w) != self._num_weights:
            raise ValueError(f"{op}: weights has {len(w)} entries but the sampler has {self._num_weights}; "
                             "give one weight per dataset index")
        epoch = check_nonnegative_int(op, "epoch", epoch)
        position = check_nonnegative_int(op, "position", position)
        if position > self.num_samples:
            raise ValueError(f"{op}: position must be <= num_samples ({self.num_samples}) (got {position})")
        last = self._changes[-1]
        if (epoch, position) < last[:2]:
            raise ValueError(f"{op}: (epoch={epoch}, position={position}) is before the last change at "
                             f"(epoch={last[0]}, position={last[1]}); changes come in order")
        if (epoch, position) == last[:2]:
            self._changes.pop()
        fp = fingerprint(w)
        self._changes.append((epoch, position, fp))
        if fp not in self._held:
            self._held[fp] = _Weights(w)
        self._held = {f: self._held[f] for f in {c[2] for c in self._changes}}  # a replaced one goes

    def order(self, epoch: int) -> WeightedOrder:
        """The draws of ``epoch`` as used by :class:`seqloader.DataLoader` (an ``Order``)."""
        epoch = check_nonnegative_int("WeightedSampler.order", "epoch", epoch)
        first = max(i for i, c in enumerate(self._changes) if c[:2] <= (epoch, 0))
        inside = [i for i, c in enumerate(self._changes) if c[0] == epoch and c[1] > 0 and i > first]
        parts = [(0 if i == first else self._changes[i][1], self._changes[i][:2],
                  derive_seed(self.seed, "weighted_sampler", epoch, i), self._held.get(self._changes[i][2]))
                 for i in [first] + inside]
        return WeightedOrder(self.num_samples, epoch, parts, self._changes[-1][:2])

    def state_dict(self) -> dict[str, Any]:
        """``{"seed", "num_samples", "num_weights", "changes": [[epoch, position, fingerprint], ...]}``."""
        return {"seed": self.seed, "num_samples": self.num_samples, "num_weights": self._num_weights,
                "changes": [list(c) for c in self._changes]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the seed and changes; the sampler's weights must be those of the last change.

        Raises:
            ValueError: a different ``num_samples`` or number of weights, a malformed ``changes``,
                or weights whose fingerprint differs from the last change's.
        """
        op = "WeightedSampler.load_state_dict"
        for key in ("num_samples", "num_weights"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ValueError(f"{op}: {key!r} is {state.get(key)!r} in the state but this sampler has "
                                 f"{mine!r}; build it with the same weights and num_samples")
        seed = check_seed(op, state.get("seed"))
        raw = state.get("changes")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{op}: 'changes' must be a non-empty list (got {raw!r})")
        changes: list[tuple[int, int, str]] = []
        for i, c in enumerate(raw):
            if (not isinstance(c, (list, tuple)) or len(c) != 3 or not isinstance(c[2], str)
                    or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in c[:2])
                    or c[1] > self.num_samples
                    or (c[0], c[1]) <= (changes[-1][:2] if changes else (-1, -1))
                    or (not changes and (c[0], c[1]) != (0, 0))):
                raise ValueError(f"{op}: 'changes'[{i}] must be [epoch, position, fingerprint], after the "
                                 f"previous change (the first at epoch 0, position 0) (got {c!r})")
            changes.append((c[0], c[1], c[2]))
        mine, saved = self._changes[-1][2], changes[-1][2]
        if mine != saved:
            raise ValueError(f"{op}: the weights' fingerprint is {mine} but the state's last change (epoch "
                             f"{changes[-1][0]}, position {changes[-1][1]}) has {saved}; build the sampler "
                             "with the weights in force when the state was saved")
        self.seed, self._changes, self._held = seed, changes, {mine: self._held[mine]}

    def __repr__(self) -> str:
        return (f"WeightedSampler(num_weights={self._num_weights}, num_samples={self.num_samples}, "
                f"changes={len(self._changes) - 1}, seed={self.seed})")
