"""Ops whose item ``i`` is an item of one of several sequences: :func:`interleave`, :func:`case`, :func:`switch`.

``interleave`` takes turns: position ``p`` falls in a *phase* during which the same sequences are
still running (they are dropped from the turn as they run out, shortest first), and inside it
``p`` is a division by the number of sequences left. ``case`` and ``switch`` pick per position,
from a sequence of choices. seqtools' names and meanings (``seqtools.interleave``, ``case``,
``switch``), with the choices checked when read.
"""

from __future__ import annotations

import bisect
import operator
import sys
from typing import Any, Sequence, TypeVar

import numpy as np

from seqloader.sequences._util import check_sequence, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage

__all__ = ["interleave", "case", "switch"]

T = TypeVar("T")


class _Interleave(LazySequence[Any]):
    def __init__(self, seqs: tuple[Sequence[Any], ...]):
        if not seqs:
            raise TypeError("interleave: expected at least one sequence (got none)")
        lens = [check_sequence("interleave", f"seqs[{k}]", s) for k, s in enumerate(seqs)]
        total = sum(lens)
        if total > sys.maxsize:
            raise ValueError(f"interleave: the total length must be < 2**63 (got {total})")
        # Phase h: the sequences longer than in_starts[h] take turns, in argument order, for their
        # items in_starts[h] .. (the next shortest length) - 1, from position out_starts[h] on.
        self._out_starts: list[int] = []
        self._in_starts: list[int] = []
        self._turns: list[tuple[int, ...]] = []
        done = out = 0
        for level in sorted(set(lens)):
            if level == done:
                continue
            turn = tuple(k for k, n in enumerate(lens) if n > done)
            self._out_starts.append(out)
            self._in_starts.append(done)
            self._turns.append(turn)
            out += (level - done) * len(turn)
            done = level
        self._seqs = seqs
        self._len = total


    def _position_stage(self) -> Stage:
        return Stage("interleave", {"lengths": [len(s) for s in self._seqs]}, self._seqs)

    def __len__(self) -> int:
        return self._len

    def origin(self, p: int) -> tuple[int, int]:
        """``(k, j)``: position ``p`` (``0 <= p < len``) is item ``j`` of ``seqs[k]``."""
        h = bisect.bisect_right(self._out_starts, p) - 1
        turn = self._turns[h]
        q, r = divmod(p - self._out_starts[h], len(turn))
        return turn[r], self._in_starts[h] + q

    def _item(self, p: int) -> Any:
        k, j = self.origin(p)
        return read(self._seqs[k], j)

    def __repr__(self) -> str:
        return f"interleave({len(self._seqs)} seqs, len={self._len})"


def interleave(*seqs: Sequence[Any]) -> LazySequence[Any]:
    """Take turns between ``seqs``: item 0 of each, then item 1 of each, and so on.

    When a sequence runs out, the others go on taking turns without it, so every item of every
    sequence appears exactly once and ``len`` is the sum of the lengths (seqtools' ``interleave``).

    ``interleave`` vs :func:`seqloader.mix`: ``interleave`` is an exact round-robin whose shares
    follow the lengths (equal turns while every sequence lasts) and reads everything once; use it
    to alternate sources item by item (views of the same data, channels, languages in lockstep).
    ``mix`` follows weights you give, whatever the lengths (a source may run out and stop the
    mixture, or start over), with an optional seeded order inside each block; use it to sample
    datasets in chosen proportions.

    Args:
        *seqs: one or more sequences, of any lengths (empty ones are skipped).

    Returns:
        A lazy sequence of ``sum(len(s) for s in seqs)`` items.

    Raises:
        TypeError: no sequence is given, or an argument is not a sequence.
        ValueError: the total length is ``2**63`` or more.

    Example:
        >>> list(interleave([1, 2, 3, 4, 5], ["a", "b", "c"], [0.1, 0.2, 0.3, 0.4]))
        [1, 'a', 0.1, 2, 'b', 0.2, 3, 'c', 0.3, 4, 0.4, 5]
        >>> list(interleave([], "xy", "z"))
        ['x', 'z', 'y']
    """
    return _Interleave(seqs)


class _Case(LazySequence[Any]):
    _op = "case"
    _what = "selector"

    def __init__(self, selector: Sequence[Any], seqs: tuple[Sequence[Any], ...], names: Sequence[str] = ()):
        op = self._op
        n = check_sequence(op, self._what, selector)
        if not seqs:
            raise TypeError(f"{op}: expected at least one sequence after {self._what} (got none)")
        for k, s in enumerate(seqs):
            name = names[k] if names else f"seqs[{k}]"
            m = check_sequence(op, name, s)
            if m != n:
                raise ValueError(f"{op}: every sequence must have len({self._what}) = {n} items ({name} has {m})")
        self._selector = selector
        self._seqs = seqs
        self._len = n


    def _position_stage(self) -> Stage:
        name = "switch" if isinstance(self, _Switch) else "case"
        return Stage(name, {"len": self._len}, (self._selector, *self._seqs))

    def __len__(self) -> int:
        return self._len

    def _choice(self, value: Any, i: int) -> int:
        """The index into ``seqs`` that the selector's item ``i`` (``value``) names."""
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{self!r}: selector[{i}] is a bool ({value!r}); use switch(condition, a, b) "
                            "for a choice by condition, or give ints")
        try:
            k = operator.index(value)
        except TypeError:
            raise TypeError(f"{self!r}: selector[{i}] must be an int (got {type(value).__name__} {value!r})") from None
        if not 0 <= k < len(self._seqs):
            raise IndexError(f"{self!r}: selector[{i}] = {k} out of range [0, {len(self._seqs)})")
        return k

    def _item(self, i: int) -> Any:
        k = self._choice(read(self._selector, i), i)
        return read(self._seqs[k], i)

    def __repr__(self) -> str:
        return f"case({len(self._seqs)} seqs, len={self._len})"


def case(selector: Sequence[int], *seqs: Sequence[Any]) -> LazySequence[Any]:
    """Pick each item from one of ``seqs``: item ``i`` is ``seqs[selector[i]][i]``.

    seqtools' ``case``: ``selector`` is a sequence of ints (a lazy one is read item by item, so a
    choice computed from the index is ``smap(f, range(n))``). Only the chosen sequence is read.

    Args:
        selector: a sequence of ints in ``[0, len(seqs))``, one per position.
        *seqs: one or more sequences, each of ``len(selector)`` items.

    Returns:
        A lazy sequence of ``len(selector)`` items.

    Raises:
        TypeError: no sequence is given, or an argument is not a sequence; on read, a choice that
            is not an int (a bool: use :func:`switch`).
        ValueError: the lengths differ.
        IndexError: on read, a choice outside ``[0, len(seqs))`` (negative ones included).

    Example:
        >>> c = case([0, 2, 1, 2], "abcd", "ABCD", [10, 20, 30, 40])
        >>> list(c), c[-1]
        (['a', 20, 'C', 40], 40)
        >>> case([0, 3], "ab", "AB")[1]
        Traceback (most recent call last):
        IndexError: case(2 seqs, len=2): selector[1] = 3 out of range [0, 2)
    """
    return _Case(selector, seqs)


class _Switch(_Case):
    _op = "switch"
    _what = "condition"

    def __init__(self, condition: Sequence[Any], a: Sequence[Any], b: Sequence[Any]):
        super().__init__(condition, (b, a), ("b", "a"))  # as seqtools: seqs[True] is a, seqs[False] is b

    def _choice(self, value: Any, i: int) -> int:
        if isinstance(value, (bool, np.bool_)):
            return int(value)
        try:
            k = operator.index(value)
        except TypeError:
            raise TypeError(f"{self!r}: condition[{i}] must be a bool (got {type(value).__name__} {value!r})") from None
        if k not in (0, 1):
            raise ValueError(f"{self!r}: condition[{i}] must be a bool, or 0 or 1 (got {k})")
        return k

    def __repr__(self) -> str:
        return f"switch(len={self._len})"


def switch(condition: Sequence[bool], a: Sequence[Any], b: Sequence[Any]) -> LazySequence[Any]:
    """Item ``i`` is ``a[i]`` where ``condition[i]`` is true, else ``b[i]`` (seqtools' ``switch``).

    Only the chosen sequence is read. ``condition`` holds bools (numpy bools, or the ints 0 and 1).

    Args:
        condition: a sequence of bools, one per position.
        a: the items where the condition holds.
        b: the items where it does not; ``a`` and ``b`` have ``len(condition)`` items.

    Returns:
        A lazy sequence of ``len(condition)`` items.

    Raises:
        TypeError: an argument is not a sequence; on read, a condition that is not a bool.
        ValueError: the lengths differ; on read, an int condition other than 0 or 1.

    Example:
        >>> list(switch([True, False, True], "abc", "ABC"))
        ['a', 'B', 'c']
        >>> len(switch([], [], []))
        0
        >>> switch([True], "a", "AB")
        Traceback (most recent call last):
        ValueError: switch: every sequence must have len(condition) = 1 items (b has 2)
    """
    return _Switch(condition, a, b)
