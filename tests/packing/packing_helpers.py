"""Helpers for the packing tests: documents whose tokens name their origin, and oracles.

Token ``t`` of document ``d`` is ``d * SCALE + t + 1``: every token of the input is distinct
and not the padding id 0, so a packed item says which document and offset each token came from.
"""

from __future__ import annotations

import numpy as np

import seqloader as sl

SCALE = 100_000


def tokens_of(d: int, n: int) -> np.ndarray:
    return d * SCALE + np.arange(1, n + 1, dtype=np.int64)


class Docs(sl.LazySequence):
    """Documents of the given lengths (module level: picklable for workers); counts its reads."""

    def __init__(self, lengths):
        self.lengths = [int(x) for x in lengths]
        self.reads = 0

    def __len__(self):
        return len(self.lengths)

    def _item(self, i):
        self.reads += 1
        return tokens_of(i, self.lengths[i])

    def __repr__(self):
        return f"Docs(len={len(self.lengths)})"


class BatchedDocs(Docs):
    """``Docs`` read in batches, as a source is: counts its ``__getitems__`` calls."""

    calls = 0

    def __getitems__(self, positions):
        self.calls += 1
        return [self._item(int(p)) for p in positions]


def as_lists(item: dict) -> tuple:
    """An item as plain lists (for equality)."""
    return tuple((k, item[k].dtype.str, item[k].tolist()) for k in ("tokens", "segment_ids", "positions", "loss_mask"))


def ref_assign(sizes, capacity, method):
    """Best or first fit the obvious way: scan every open bin."""
    rooms, out = [], []
    for s in sizes:
        fits = [b for b, r in enumerate(rooms) if r >= s]
        if not fits:
            rooms.append(capacity)
            b = len(rooms) - 1
        elif method == "best_fit":
            b = min(fits, key=lambda b: (rooms[b], b))
        else:
            b = fits[0]
        rooms[b] -= s
        out.append(b)
    return out, len(rooms)


def ref_pieces(lengths, length, overlong):
    out = []
    for d, n in enumerate(lengths):
        if n > length and overlong == "split":
            out += [(d, s, min(length, n - s)) for s in range(0, n, length)]
        elif n:
            out.append((d, 0, min(n, length)))
    return out


def ref_pack(lengths, length, window, method, overlong):
    """Every item's pieces ``[(doc, start, size), ...]``, window by window."""
    items = []
    for a in range(0, len(lengths), window):
        ps = [(d + a, s, z) for d, s, z in ref_pieces(lengths[a:a + window], length, overlong)]
        bins, nb = ref_assign([z for _, _, z in ps], length, method)
        items += [[p for p, b2 in zip(ps, bins) if b2 == b] for b in range(nb)]
    return items


def ref_split(lengths, length):
    """Concat and chunk: every item's pieces."""
    flat = [(d, t) for d, n in enumerate(lengths) for t in range(n)]
    items = []
    for j in range(0, len(flat), length):
        ps = []
        for d, t in flat[j:j + length]:
            if ps and ps[-1][0] == d:
                ps[-1] = (d, ps[-1][1], ps[-1][2] + 1)
            else:
                ps.append((d, t, 1))
        items.append(ps)
    return items


def item_from_pieces(pieces, length, pad_id=0):
    """The item a list of pieces makes, computed the plain way."""
    tokens, seg, pos = [], [], []
    for k, (d, s, z) in enumerate(pieces):
        tokens += tokens_of(d, s + z)[s:].tolist()
        seg += [k + 1] * z
        pos += list(range(z))
    pad = length - len(tokens)
    return tokens + [pad_id] * pad, seg + [0] * pad, pos + [0] * pad
