"""What every source shares: the block index, batched reads and the file-list description.

A source's *index* is the number of items in each of its natural blocks (Parquet row groups,
Arrow record batches, tar shards, files), in file order. :class:`BlockIndex` holds their
cumulative ends and maps positions to ``(block, offset)`` by bisection, for a whole array of
positions at once. :class:`Source` is the base class of every source: a
:class:`~seqloader.LazySequence` with ``blocks()``, a batched ``__getitems__(positions)`` (what
torch's fetcher calls with a batch's indices), ``files()`` and ``fingerprint()``.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

from seqloader.errors import add_note, note_stage
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage

if TYPE_CHECKING:
    from seqloader.sources._storage import Files

__all__ = ["BlockIndex", "Source", "group_by_block", "transform_items"]

T_co = TypeVar("T_co", covariant=True)
Positions = npt.NDArray[np.int64]


class BlockIndex:
    """Blocks of ``lengths[k]`` items each, laid end to end; position ``p`` is in block ``k`` when
    ``ends[k-1] <= p < ends[k]``. Empty blocks hold no position.

    Example:
        >>> index = BlockIndex([3, 0, 2])
        >>> len(index), index.ends.tolist()
        (5, [3, 3, 5])
        >>> [a.tolist() for a in index.locate([0, 2, 3, 4])]
        [[0, 0, 2, 2], [0, 2, 0, 1]]
    """

    __slots__ = ("ends", "starts")

    def __init__(self, lengths: npt.ArrayLike):
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"BlockIndex: block lengths must be >= 0 (got {int(lengths.min())})")
        self.ends = np.cumsum(lengths, dtype=np.int64)
        self.starts = self.ends - lengths
        self.ends.setflags(write=False)
        self.starts.setflags(write=False)

    def __len__(self) -> int:
        return int(self.ends[-1]) if self.ends.size else 0

    @property
    def num_blocks(self) -> int:
        return int(self.ends.size)

    def locate(self, positions: npt.ArrayLike) -> tuple[Positions, Positions]:
        """``(blocks, offsets)`` of positions in ``[0, len)`` (one ``searchsorted`` for all)."""
        p = np.asarray(positions, dtype=np.int64)
        b = np.searchsorted(self.ends, p, side="right")
        return b, p - self.starts[b]

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.ends, self.starts)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.ends, self.starts = state


def group_by_block(blocks: Positions) -> list[tuple[int, Positions]]:
    """``[(block, where), ...]``: the distinct blocks in increasing order, each with the indices
    (into ``blocks``) of its positions, in their original order.

    Example:
        >>> [(b, w.tolist()) for b, w in group_by_block(np.array([4, 1, 4, 1, 2]))]
        [(1, [1, 3]), (2, [4]), (4, [0, 2])]
    """
    if blocks.size == 0:
        return []
    if blocks[0] == blocks[-1] and blocks.min() == blocks.max():  # the common case: one block
        return [(int(blocks[0]), np.arange(blocks.size))]
    order = np.argsort(blocks, kind="stable")
    sorted_blocks = blocks[order]
    bounds = [0, *(np.flatnonzero(sorted_blocks[1:] != sorted_blocks[:-1]) + 1).tolist(), int(blocks.size)]
    keys = sorted_blocks[bounds[:-1]].tolist()
    return [(b, order[s:e]) for b, s, e in zip(keys, bounds[:-1], bounds[1:])]


def transform_items(stage: Any, transform: Callable[[Any], Any], items: list[Any], positions: Positions,
                    where: Callable[[int], str]) -> list[Any]:
    """``items`` with ``transform`` applied to each, in place (one ``try`` for the batch rather than
    a context manager per item). An error gains the note of ``stage`` at ``positions[w]`` and
    ``where(w)`` (which row or sample of which file), and is raised again, its own type kept.

    Example:
        >>> transform_items("src", str.upper, ["a", "b"], np.array([4, 5]), lambda w: f"row {w}")
        ['A', 'B']
    """
    w = 0
    try:
        for w in range(len(items)):
            items[w] = transform(items[w])
    except Exception as exc:
        note_stage(exc, stage, int(positions[w]))
        add_note(exc, where(w))
        raise
    return items


def fingerprint_of(description: Sequence[Sequence[Any]]) -> str:
    """16 hex digits of SHA-256 over a file-list description (relative names, sizes, contents)."""
    text = json.dumps([list(f) for f in description], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Source(LazySequence[T_co]):
    """The base class of seqloader's sources: a lazy sequence of the items stored in files.

    Beyond ``len(src)``, ``src[i]`` and slices (every :class:`~seqloader.LazySequence` has
    them), a source has:

    * ``src.__getitems__(positions)``: the items at a batch of positions, read block by block
      (each block once); torch's fetcher, and so ``seqloader.DataLoader``, calls it with each
      batch's indices;
    * ``src.blocks()``: the cumulative ends of its natural blocks (row groups, record batches,
      shards, files), for a block shuffle that reads block by block;
    * ``src.files()`` and ``src.fingerprint()``: the file list it was built from, as
      ``[name, size, content]`` (``name`` relative to the folder the source was given,
      ``content`` a digest of what the index depends on: a Parquet or Arrow footer, a tar
      member table), and a short digest of it, to refuse resuming on other files
      (:func:`seqloader.check_same_files`); neither depends on where the files are or on their
      modification times, so a copy elsewhere (``cp -a``) or a new download fingerprints the same;
    * ``src.paths()``: where the files are (absolute paths or URLs).
    """

    _index: BlockIndex
    _files: Files

    def __len__(self) -> int:
        return len(self._index)

    def blocks(self) -> Positions:
        """The cumulative ends of the source's blocks: a read-only int64 array ``ends`` with
        ``ends[-1] == len(self)``; block ``k`` holds positions ``[ends[k-1], ends[k])``."""
        return self._index.ends

    def files(self) -> list[list[Any]]:
        """The files in the order their items appear, described by what they hold.

        Returns:
            ``[[name, size, content], ...]`` (JSON types; see the class docstring): the same for
            the same files wherever they are.

        Example:
            >>> import os, shutil, tempfile, pyarrow as pa, pyarrow.parquet as pq
            >>> from seqloader.sources import parquet
            >>> a = tempfile.mkdtemp(); pq.write_table(pa.table({"x": [1, 2]}), os.path.join(a, "p.parquet"))
            >>> b = shutil.copytree(a, os.path.join(tempfile.mkdtemp(), "copy"))
            >>> src, copy = parquet(a), parquet(b)
            >>> name, size, content = src.files()[0]
            >>> name, content.startswith("footer:"), src.fingerprint() == copy.fingerprint()
            ('p.parquet', True, True)
            >>> src.paths() == copy.paths()   # where they are differs
            False
        """
        return self._files.describe()

    def paths(self) -> list[str]:
        """The files' absolute paths or URLs, in the order their items appear."""
        return [f.path for f in self._files.infos]

    def fingerprint(self) -> str:
        """16 hex digits that change whenever a file is added, removed, renamed (relative to the
        source's folder), resized, or changed in what the index depends on."""
        return fingerprint_of(self.files())

    def _position_stage(self) -> Stage:
        """A source of files: what its positions are is its file list (``files()``, checked on
        load by ``check_same_files``); its ``transform=`` changes values only."""
        return Stage(getattr(self, "_op", type(self).__name__), {}, values=(getattr(self, "_transform", None),),
                     source=True)

    def _positions(self, positions: Any) -> Positions:
        """``positions`` as int64 in ``[0, len)`` (negative ones count from the end)."""
        p = np.asarray(positions, dtype=np.int64).reshape(-1)
        n = len(self)
        if not p.size or int(p.view(np.uint64).max()) < n:   # (one pass: a negative one reads as >= 2**63)
            return p
        lo, hi = p.min(), p.max()
        if lo < -n or hi >= n:
            bad = int(p[(p < -n) | (p >= n)][0])
            raise IndexError(f"{self!r}: index {bad} out of range [-{n}, {n})")
        return np.where(p < 0, p + n, p)

    def __getitems__(self, positions: Sequence[int]) -> Any:
        """The items at ``positions`` (a list of ints), as ``[self[i] for i in positions]``."""
        return self._items(self._positions(positions))

    def _items(self, positions: Positions) -> Any:  # pragma: no cover - overridden
        return [self._item(int(i)) for i in positions]
