"""``pack``: documents packed into items of exactly ``length`` tokens, item ``j`` computed from ``j``.

The input is cut into *windows* of ``window`` consecutive documents. A window is packed on its
own (best fit or first fit, see ``_bins``), from its documents' lengths only, so the items of
window ``w`` are a pure function of those lengths. The *count index* holds the cumulative number
of items at each window's end: item ``j`` is item ``j - ends[w - 1]`` of the window ``w`` with
``ends[w - 1] <= j < ends[w]`` (one bisection). The index also keeps the bin of every piece (2
bytes per document), so reading item ``j`` costs one vectorised pass over its window's lengths
and reads only that item's documents: no window is packed again. In the split layout (concat
and chunk) the index holds the cumulative tokens at each window's end, and item ``j`` reads the
documents overlapping its ``length`` tokens.

No state: the same item ``j`` whatever the process, the order of reads, or a resume.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Optional, Sequence

import numpy as np

from seqloader.errors import check_int, check_positive_int, normalize_index, note_stage
from seqloader.packing import _bins
from seqloader.packing._index import IndexHolder
from seqloader.packing._inputs import check_lengths, describe, read_items, read_lengths
from seqloader.packing._store import array_digest
from seqloader.sequences._util import check_bool, check_sequence, read
from seqloader.sequences.base import LazySequence
from seqloader.sequences.describe import Stage, digest

__all__ = ["pack"]

Item = dict[str, np.ndarray]
Ints = np.ndarray


@dataclasses.dataclass(frozen=True)
class _Params:
    length: int
    window: int
    method: str
    split: bool
    overlong: str
    pad_id: int
    dtype: np.dtype

    def indexed(self) -> dict[str, Any]:
        """The parameters the index depends on."""
        return {"length": self.length, "window": self.window, "method": self.method, "split": self.split,
                "overlong": self.overlong}


@dataclasses.dataclass(frozen=True)
class _Index:
    lengths: Ints     # tokens of each document (int32, or int64 if needed)
    ends: Ints        # cumulative items (tokens in the split layout) at each window's end
    piece_ends: Ints  # cumulative pieces at each window's end (empty in the split layout)
    bins: Ints        # the item (within its window) of every piece (empty in the split layout)
    len: int


def _choice(arg: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"pack: {arg} must be one of {', '.join(map(repr, allowed))} (got {value!r})")
    return value


def _check_params(length: Any, window: Any, method: Any, split: Any, overlong: Any, pad_id: Any,
                  dtype: Any) -> _Params:
    dt = np.dtype(dtype)
    if dt.kind not in "iu":
        raise TypeError(f"pack: dtype must be an integer dtype (got {dt})")
    pad = check_int("pack", "pad_id", pad_id)
    info = np.iinfo(dt)
    if not info.min <= pad <= info.max:
        raise ValueError(f"pack: pad_id={pad} does not fit dtype {dt} ([{info.min}, {info.max}])")
    return _Params(check_positive_int("pack", "length", length), check_positive_int("pack", "window", window),
                   _choice("method", method, _bins.METHODS), check_bool("pack", "split", split),
                   _choice("overlong", overlong, _bins.OVERLONG), pad, dt)


class _Pack(LazySequence[Item]):
    _op = "pack"

    def __init__(self, seq: Sequence[Any], p: _Params, lengths: Any, cache: bool, cache_dir: Optional[str]):
        self._n = check_sequence("pack", "seq", seq)
        self._seq, self._p = seq, p
        self._given = None if lengths is None else check_lengths("pack", lengths, self._n, p.window)
        check_bool("pack", "cache", cache)
        if cache_dir is not None and not isinstance(cache_dir, str):
            raise TypeError(f"pack: cache_dir must be a str or None (got {type(cache_dir).__name__})")
        self._holder = IndexHolder(cache, cache_dir)
        self._lengths: Optional[str] = None  # the digest of the documents' lengths, once asked for

    # -- the index (see _index.IndexHolder) -----------------------------------------------------

    @property
    def _names(self) -> tuple[str, ...]:
        names = ("ends",) if self._p.split else ("ends", "piece_ends", "bins")
        return names if self._given is not None else (*names, "lengths")

    def _position_stage(self) -> Stage:
        """Which documents item ``j`` holds: the indexed parameters and a digest of the documents'
        lengths (of the index, obtained if it was not yet); ``pad_id`` and ``dtype`` change values only."""
        if self._lengths is None:
            self._lengths = digest(array_digest(self._index().lengths).encode(), 12)
        return Stage("pack", {**self._p.indexed(), "lengths": self._lengths}, (self._seq,),
                     values=(self._p.pad_id, str(self._p.dtype)))

    def _key(self) -> tuple[dict[str, Any], Optional[dict[str, Any]], str]:
        location = {"op": "pack", "params": self._p.indexed(), "n": self._n}
        if self._given is not None:
            if self._p.split:
                return location, None, "not needed: the split layout's index is one cumsum of lengths="
            return {**location, "lengths": "argument"}, {"lengths": array_digest(self._given)}, ""
        where, why = describe(self._seq, content=False)
        what, why2 = describe(self._seq, content=True) if where is not None else (None, why)
        if what is None:
            return location, None, f"{why or why2}; give lengths= to cache it"
        return {**location, "input": where}, {"input": what}, ""

    def _build(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        p = self._p
        if self._given is not None:
            lengths, read_n, source = self._given, 0, "argument"
        else:
            lengths = check_lengths("pack", read_lengths(self, self._seq, p.window), self._n, p.window)
            read_n, source = self._n, "read from the input"
        if p.split:
            arrays = {"ends": _bins.chunk_ends(lengths, p.window)}
        else:
            try:
                counts, piece_ends, bins = _bins.window_bins(lengths, p.window, p.length, p.method, p.overlong)
            except ValueError as exc:
                raise ValueError(f"{self!r}: {exc}; pass overlong='split' or 'truncate'") from None
            arrays = {"ends": np.cumsum(counts), "piece_ends": piece_ends, "bins": bins}
        if self._given is None:
            arrays["lengths"] = lengths
        return arrays, {"lengths": source, "items_read": read_n}

    def _adopt(self, arrays: dict[str, np.ndarray]) -> _Index:
        lengths = self._given if self._given is not None else arrays["lengths"]
        for a in arrays.values():
            a.setflags(write=False)
        ends, none = arrays["ends"], np.zeros(0, dtype=np.int64)
        total = int(ends[-1]) if ends.size else 0
        n = -(-total // self._p.length) if self._p.split else total
        return _Index(lengths, ends, arrays.get("piece_ends", none), arrays.get("bins", none), n)

    def _summary(self, index: _Index) -> dict[str, Any]:
        tokens = int(index.lengths.sum(dtype=np.int64))
        if self._p.overlong == "truncate" and not self._p.split:
            tokens = int(np.minimum(index.lengths, self._p.length).sum(dtype=np.int64))
        slots = index.len * self._p.length
        return {"documents": self._n, "windows": int(index.ends.size), "items": index.len, "tokens": tokens,
                "padding": 1 - tokens / slots if slots else 0.0}

    def _index(self) -> _Index:
        index: _Index = self._holder.get(self)
        return index

    def index_stats(self) -> dict[str, Any]:
        """How the count index was obtained in this process, and what it holds.

        Keys: ``index`` (``"built"`` or ``"loaded"``), ``seconds`` (to build or load it here),
        ``built_in_seconds`` (the build's own cost, also when loaded), ``lengths`` (where the
        build took the lengths from), ``items_read`` (input items read here), ``cache``
        (``"hit"``, ``"written"``, ``"off: <why>"``, ``"not written: <error>"``), ``cache_file``,
        ``documents``, ``windows``, ``items``, ``tokens`` and ``padding`` (the fraction of the
        items' tokens that are padding). Obtains the index if it was not yet.
        """
        self._index()
        return dict(self._holder.stats or {})

    # -- the sequence ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._index().len

    def blocks(self) -> np.ndarray:
        """Cumulative ends of the items of each window (for a block shuffle that keeps reads local)."""
        index = self._index()
        if self._p.split:
            out: np.ndarray = np.minimum(-(-index.ends // self._p.length), index.len)
            return out
        return index.ends

    def _pieces(self, j: int) -> tuple[Ints, Ints, Ints]:
        index, p = self._index(), self._p
        if p.split:
            return _bins.chunk_pieces(index.lengths, index.ends, p.window, p.length, j)
        w = int(np.searchsorted(index.ends, j, side="right"))
        b = j - (int(index.ends[w - 1]) if w else 0)
        lo, hi = (int(index.piece_ends[w - 1]) if w else 0), int(index.piece_ends[w])
        a = w * p.window
        return _bins.item_pieces(index.lengths[a:a + p.window], a, index.bins[lo:hi], b, p.length, p.overlong)

    def documents(self, j: int) -> list[tuple[int, int, int]]:
        """Which input documents make item ``j``: ``[(position, start, stop), ...]``, one per segment.

        Segment ``k + 1`` of the item (``segment_ids == k + 1``) is tokens ``start:stop`` of
        input item ``position``, in this order; nothing is read (only lengths are used).

        Raises:
            IndexError: ``j`` is out of range.
        """
        doc, start, size = self._pieces(normalize_index(j, len(self), stage=self))
        return [(int(d), int(s), int(s + z)) for d, s, z in zip(doc, start, size)]

    def _tokens(self, position: int, x: Any, lengths: Ints) -> np.ndarray:
        """Document ``position`` as a 1-D integer array, checked against its indexed length."""
        a = np.asarray(x)
        if a.ndim != 1 or (a.dtype.kind not in "iu" and a.size):
            raise TypeError(f"{self!r}: document {position} must be a 1-D array of token ids (got "
                            f"{type(x).__name__} of shape {a.shape}, dtype {a.dtype})")
        if a.size != int(lengths[position]):
            where = ("lengths=" if self._given is not None else
                     f"the index file {self._holder.stats.get('cache_file') if self._holder.stats else None}")
            raise ValueError(f"{self!r}: document {position} has {a.size} tokens but {where} says "
                             f"{int(lengths[position])}; the lengths do not describe this input (if the input "
                             "changed, delete the index file or pass the new lengths)")
        dt = self._p.dtype
        if a.size and not np.can_cast(a.dtype, dt, "safe"):
            info = np.iinfo(dt)
            if int(a.min()) < info.min or int(a.max()) > info.max:
                raise ValueError(f"{self!r}: document {position} has token ids outside dtype {dt}; pass a wider dtype=")
        return a

    def _assemble(self, doc: Ints, start: Ints, size: Ints, docs: dict[int, np.ndarray]) -> Item:
        p = self._p
        tokens = np.full(p.length, p.pad_id, dtype=p.dtype)
        segment_ids = np.zeros(p.length, dtype=np.int32)
        positions = np.zeros(p.length, dtype=np.int32)
        ramp = _ramp(p.length)
        o = 0
        for k, (d, s, z) in enumerate(zip(doc.tolist(), start.tolist(), size.tolist()), 1):
            tokens[o:o + z] = docs[d][s:s + z]
            segment_ids[o:o + z] = k
            positions[o:o + z] = ramp[:z]
            o += z
        return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions, "loss_mask": segment_ids > 0}

    def _read(self, wanted: list[int], lengths: Ints, batched: bool) -> dict[int, np.ndarray]:
        if batched:
            items = read_items(self, _Gathered(self._seq, wanted), 0, len(wanted))
        else:
            items = []
            for d in wanted:
                try:
                    items.append(read(self._seq, d))
                except Exception as exc:
                    note_stage(exc, self, d)
                    raise
        return {d: self._tokens(d, x, lengths) for d, x in zip(wanted, items)}

    def _item(self, j: int) -> Item:
        doc, start, size = self._pieces(j)
        wanted = sorted(set(doc.tolist()))
        return self._assemble(doc, start, size, self._read(wanted, self._index().lengths, False))

    def __getitems__(self, positions: Sequence[int]) -> list[Item]:
        """The items at ``positions``: their documents read with one ``__getitems__`` call of the
        input when it has one (what ``seqloader.DataLoader`` calls with a batch's indices)."""
        n = len(self)
        pieces = [self._pieces(normalize_index(operator.index(j), n, stage=self)) for j in positions]
        wanted = sorted({d for doc, _, _ in pieces for d in doc.tolist()})
        docs = self._read(wanted, self._index().lengths, bool(getattr(self._seq, "__getitems__", None)))
        return [self._assemble(doc, start, size, docs) for doc, start, size in pieces]

    def __repr__(self) -> str:
        p = self._p
        layout = "split=True" if p.split else f"method={p.method!r}, overlong={p.overlong!r}"
        return f"pack(length={p.length}, window={p.window}, {layout}, documents={self._n})"


@functools.lru_cache(maxsize=8)
def _ramp(n: int) -> np.ndarray:
    """``0, 1, ..., n - 1`` as int32 (read-only, shared)."""
    out = np.arange(n, dtype=np.int32)
    out.setflags(write=False)
    return out


class _Gathered:
    """``seq`` at ``positions``, for one ``__getitems__`` call of ``seq`` (``read_items``)."""

    def __init__(self, seq: Any, positions: list[int]):
        self._seq, self._positions = seq, positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitems__(self, idx: list[int]) -> Any:
        return self._seq.__getitems__([self._positions[i] for i in idx])


def pack(seq: Sequence[Any], length: int, *, method: str = "best_fit", window: int = 1024, split: bool = False,
         overlong: str = "split", lengths: Any = None, pad_id: int = 0, dtype: Any = np.int64,
         cache: bool = True, cache_dir: Optional[str] = None) -> LazySequence[Item]:
    """Pack documents (1-D arrays of token ids) into items of exactly ``length`` tokens.

    Item ``j`` is a pure function of the arguments and ``j``: the same whatever the number of
    workers, the world size, the order of reads or a resume, and ``pack(...)[j]`` reads only
    the documents of item ``j``. The documents are cut into windows of ``window`` consecutive
    documents; each window is packed on its own from its documents' lengths (``method``), its
    items numbered after those of the windows before it. Their count per window is the *count
    index*: built on first use (``len``) from the lengths, cached as a file (see
    ``docs/packing.md``), and reported by ``index_stats()``.

    Each item is a dict of 1-D numpy arrays of ``length`` entries:

    * ``tokens`` (``dtype``): the documents' tokens, then ``pad_id``;
    * ``segment_ids`` (int32): ``k`` on the tokens of the item's ``k``-th segment (1-based), 0 on padding;
    * ``positions`` (int32): each token's position within its segment (from 0), 0 on padding;
    * ``loss_mask`` (bool): ``segment_ids > 0``, the real tokens. For next-token prediction, the
      target of token ``t`` is ``tokens[t + 1]`` where ``loss_mask[t + 1]`` and
      ``segment_ids[t + 1] == segment_ids[t]``.

    The returned sequence also has ``documents(j)``: the ``(position, start, stop)`` of each
    segment of item ``j`` (tokens ``start:stop`` of input item ``position``; nothing is read);
    ``blocks()``: the cumulative ends of each window's items (for a block shuffle); ``files()``:
    the files of the data sources under the input, which ``seqloader.DataLoader`` records in its
    state to refuse resuming on other files; and
    ``index_stats()``: how the index was obtained in this process and what it holds (``index``
    ``"built"`` or ``"loaded"``, ``seconds``, ``built_in_seconds``, ``items_read``, ``cache``,
    ``cache_file``, ``documents``, ``windows``, ``items``, ``tokens``, ``padding``).

    Args:
        seq: the documents: a sequence whose items are 1-D integer arrays (or lists).
        length: tokens per item (> 0).
        method: ``"best_fit"`` (the fullest bin that fits) or ``"first_fit"`` (the first bin that
            fits), in input order within each window.
        window: documents per window (> 0): the memory and seek bound of an item, and the index's
            granularity. Larger windows pad less (``docs/packing.md`` has measurements).
        split: ``True`` for concat and chunk: the documents laid end to end and cut every
            ``length`` tokens (no padding but in the last item; a document may span items).
        overlong: for a document longer than ``length`` (without ``split``): ``"split"`` into
            full items and a remainder piece (no token lost), ``"truncate"`` to its first
            ``length`` tokens, or ``"error"``.
        lengths: the documents' lengths, when known without reading them (a Parquet length
            column): an array of ints, a sequence of ints, or a callable ``lengths(start, stop)``.
            ``None``: read every document once to measure it (the costly way; cached).
        pad_id: the token id of padding.
        dtype: the integer dtype of ``tokens``.
        cache: keep the count index in a file (when the input can be described, see
            ``docs/packing.md``); ``False``: build it in memory in each new process.
        cache_dir: the folder of index files (default: ``$SEQLOADER_CACHE/packing``, else
            ``~/.cache/seqloader/packing``).

    Returns:
        A lazy sequence of packed items; ``len`` builds (or loads) the count index.

    Raises:
        TypeError: ``seq`` is not a sequence, or an argument has the wrong type.
        ValueError: an argument is out of range, ``lengths`` does not match ``seq``; when the index
            is built, a document longer than ``length`` with ``overlong="error"``; when an item is
            read, a document whose length differs from the index's (stale lengths).

    Example:
        >>> docs = [np.arange(1, 4), np.arange(11, 17), np.arange(21, 25)]
        >>> packed = pack(docs, 8, cache=False)
        >>> len(packed), packed[0]["tokens"].tolist(), packed[0]["segment_ids"].tolist()
        (2, [1, 2, 3, 21, 22, 23, 24, 0], [1, 1, 1, 2, 2, 2, 2, 0])
        >>> packed.documents(0), packed.documents(-1), packed[1]["positions"].tolist()
        ([(0, 0, 3), (2, 0, 4)], [(1, 0, 6)], [0, 1, 2, 3, 4, 5, 0, 0])
        >>> [x["tokens"].tolist() for x in pack(docs, 4, split=True, cache=False)]
        [[1, 2, 3, 11], [12, 13, 14, 15], [16, 21, 22, 23], [24, 0, 0, 0]]
        >>> pack(docs, 4, overlong="error", cache=False)[0]
        Traceback (most recent call last):
        ValueError: pack(length=4, window=1024, method='best_fit', overlong='error', documents=3): document 1 has 6 tokens, more than length=4; pass overlong='split' or 'truncate'
    """
    return _Pack(seq, _check_params(length, window, method, split, overlong, pad_id, dtype), lengths, cache,
                 cache_dir)
