"""Ops that call a user function on items: :func:`smap` and :func:`rng_map`.

Written here rather than taken from ``seqtools.smap``: seqtools wraps every error raised by the
user's function in ``seqtools.EvaluationError`` (unless a thread-local ``seterr`` switch is
flipped), whereas seqloader's errors keep their type and gain a note (``errors.annotate``). With stage timing on
(:mod:`seqloader.sequences.stage_times`), each call of ``f`` counts for the stage ``smap(f)`` or
``rng_map(f)``; when it is off the hook is one attribute check.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

import numpy as np

from seqloader.errors import note_stage
from seqloader.rng import check_seed, item_rng
from seqloader.sequences import stage_times
from seqloader.sequences._util import check_callable, check_sequence, fname, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage

__all__ = ["smap", "rng_map"]

T = TypeVar("T")
R = TypeVar("R")


class _Smap(LazySequence[R]):
    def __init__(self, f: Callable[..., R], seqs: tuple[Sequence[Any], ...]):
        check_callable("smap", "f", f)
        if not seqs:
            raise TypeError("smap: expected at least one sequence after f (got none)")
        lens = [check_sequence("smap", f"seqs[{k}]", s) for k, s in enumerate(seqs)]
        if any(n != lens[0] for n in lens):
            raise ValueError(f"smap: sequences must have equal lengths (got {', '.join(map(str, lens))}); "
                             "slice or repeat them to a common length first")
        self._f = f
        self._seqs = tuple(seqs)
        self._len = lens[0]
        self._stage = f"smap({fname(f)})"  # its name in the per-stage timing


    def _position_stage(self) -> Stage:
        return Stage("smap", {}, self._seqs, values=(self._f,))  # the function changes values only

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> R:
        args = [read(s, i) for s in self._seqs]
        if stage_times.ACTIVE is not None:
            return _timed(self, self._stage, self._f, args, i)
        try:  # (errors.annotate, without the cost of a context manager per item)
            return self._f(*args)
        except Exception as exc:
            note_stage(exc, self, i)
            raise

    @property
    def __getitems__(self) -> Optional[Callable[[Sequence[int]], list[R]]]:
        """A batched read when ``f`` maps one sequence that reads in batches (a source): the
        batch's items are read at once, then ``f`` is applied to each; else ``None``."""
        getitems = getattr(self._seqs[0], "__getitems__", None) if len(self._seqs) == 1 else None
        if not getitems:
            return None

        def read_many(positions: Sequence[int]) -> list[R]:
            items, f, out = getitems(positions), self._f, []
            times = stage_times.current() if stage_times.ACTIVE is not None else None
            token = times.begin() if times is not None else None
            k = 0
            try:  # (one try for the batch rather than a context manager per item)
                for k, x in enumerate(items):
                    out.append(f(x))
            except Exception as exc:
                note_stage(exc, self, int(positions[k]))
                raise
            finally:
                if times is not None and token is not None:
                    times.end(self._stage, token)
            return out

        return read_many

    def __repr__(self) -> str:
        return f"smap({fname(self._f)}, len={self._len})"


def _timed(stage: Any, name: str, f: Callable[..., R], args: list[Any], i: int) -> R:
    """``f(*args)`` as the stage ``name`` when this thread is timed (else untimed), errors noted."""
    times = stage_times.current()
    token = times.begin() if times is not None else None
    try:
        return f(*args)
    except Exception as exc:
        note_stage(exc, stage, i)
        raise
    finally:
        if times is not None and token is not None:
            times.end(name, token)


def smap(f: Callable[..., R], *seqs: Sequence[Any]) -> LazySequence[R]:
    """Lazily map ``f`` over one or more sequences: item ``i`` is ``f(*(s[i] for s in seqs))``.

    Args:
        f: a callable taking one argument per sequence. For ``spawn`` workers it must be picklable
            (a module-level function, not a lambda).
        *seqs: one or more sequences of equal length.

    Returns:
        A lazy sequence of ``len(seqs[0])`` items; nothing is computed until an item is read.

    Raises:
        TypeError: ``f`` is not callable, no sequence is given, or an argument is not a sequence.
        ValueError: the sequences have different lengths.

    An exception raised by ``f`` keeps its type and message and gains a note
    ``seqloader: raised in smap(f, len=n) at item i``.

    Example:
        >>> s = smap(lambda a, b: a + b, [1, 2, 3], [10, 20, 30])
        >>> len(s), s[0], s[-1], list(s[::2])
        (3, 11, 33, [11, 33])
        >>> smap(abs, [1, 2], [3])
        Traceback (most recent call last):
        ValueError: smap: sequences must have equal lengths (got 2, 1); slice or repeat them to a common length first
    """
    return _Smap(f, seqs)


class _RngMap(LazySequence[R], Generic[T, R]):
    def __init__(self, f: Callable[[T, np.random.Generator], R], seq: Sequence[T], seed: int):
        check_callable("rng_map", "f", f)
        self._len = check_sequence("rng_map", "seq", seq)
        self._seed = check_seed("rng_map", seed)
        self._f = f
        self._seq = seq
        self._stage = f"rng_map({fname(f)})"  # its name in the per-stage timing


    def _position_stage(self) -> Stage:
        return Stage("rng_map", {}, (self._seq,), values=(self._f, self._seed))  # values only

    def __len__(self) -> int:
        return self._len

    def _item(self, i: int) -> R:
        x = read(self._seq, i)
        rng = item_rng(self._seed, i)
        if stage_times.ACTIVE is not None:
            return _timed(self, self._stage, self._f, [x, rng], i)
        try:  # (errors.annotate, without the cost of a context manager per item)
            return self._f(x, rng)
        except Exception as exc:
            note_stage(exc, self, i)
            raise

    def __repr__(self) -> str:
        return f"rng_map({fname(self._f)}, seed={self._seed}, len={self._len})"


def rng_map(f: Callable[[T, np.random.Generator], R], seq: Sequence[T], seed: int) -> LazySequence[R]:
    """Map ``f(item, rng)`` over ``seq`` with a generator that depends only on ``(seed, i)``.

    Item ``i`` is ``f(seq[i], seqloader.rng.item_rng(seed, i))``: the draws of an item do not depend
    on which items were read before, in which order, or in which process.

    Args:
        f: a callable ``f(item, rng)`` with ``rng`` a ``numpy.random.Generator``.
        seq: the input sequence.
        seed: an int in ``[0, 2**64)``.

    Returns:
        A lazy sequence of ``len(seq)`` items.

    Raises:
        TypeError: ``f`` is not callable, ``seq`` is not a sequence, or ``seed`` is not an int.
        ValueError: ``seed`` is outside ``[0, 2**64)``.

    Example:
        >>> noisy = rng_map(lambda x, rng: x + int(rng.integers(10)), range(5), seed=0)
        >>> noisy[3] == noisy[3] == list(noisy)[3]
        True
        >>> rng_map(lambda x, rng: x, range(5), seed=-1)
        Traceback (most recent call last):
        ValueError: rng_map: seed must be a non-negative int (got -1)
    """
    return _RngMap(f, seq, seed)
