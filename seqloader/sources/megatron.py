"""A Megatron indexed dataset (``prefix.bin`` + ``prefix.idx``) as a sequence of token arrays: :func:`megatron`.

The format is megatron-core's ``IndexedDatasetBuilder`` (``megatron/core/datasets/indexed_dataset.py``;
version 1, what megatron-core 0.16 writes). The ``.idx`` file is, little-endian::

    b"MMIDIDX\\x00\\x00"   9 bytes, the magic
    version             uint64, 1
    dtype code          uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    sequence count n    uint64
    document count d    uint64 (the entries of the document index: documents + 1)
    lengths             n x int32, tokens per sequence
    pointers            n x int64, byte offset of each sequence in the .bin
    document indices    d x int64, the sequence each document starts at, then n
    modes               n x int8, only in a multimodal dataset (the mode of each sequence)

and the ``.bin`` file is the sequences' tokens end to end. Nothing in the header says whether
modes follow: the file's size does (``34 + 12 n + 8 d``, plus ``n`` with modes).

At construction the index is read once (mapped, checked and hashed); the ``.bin`` is only
``stat``-ed and sampled (its first and last 64 KiB, for the fingerprint). Both files are
memory-mapped once per process, on first use, and item ``i`` is one slice of the ``.bin``'s
mapping, copied. What is checked: the magic, version and dtype code, the index's size against its
header, every pointer against the ``.bin``'s size (a truncated ``.bin`` is refused, naming both
files), the document indices (from 0 to ``n``, non-decreasing); at every read, that neither file
changed since (size, inode, ctime, mtime). In a fingerprint the ``.idx`` is described by the
digest of all of its bytes (``index:<hex>``) and the ``.bin`` by its dtype and a sample
(``tokens:<dtype>+data:<hex>``).
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any, NamedTuple, Optional

import numpy as np

from seqloader.sources._listing import resolve
from seqloader.sources._mapped import Layout, MappedArrays, refuse_urls
from seqloader.sources._process import ProcessLocal
from seqloader.sources._sample import sample_digest
from seqloader.sources._storage import Files
from seqloader.sources.base import Positions, Source

__all__ = ["megatron"]

_OP = "megatron"
MAGIC = b"MMIDIDX\x00\x00"
HEADER = 34   # magic 9, version 8, dtype code 1, sequence count 8, document count 8
#: megatron-core's ``DType`` codes
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
#: index entries checked (and hashed) at a time while indexing: bounds the memory of the check
CHUNK = 1 << 20
_BIN, _IDX = 0, 1


class _Views(NamedTuple):
    """The arrays of the ``.idx`` file: views of its mapping in one process."""

    lengths: np.ndarray
    pointers: np.ndarray
    document_indices: np.ndarray
    modes: Optional[np.ndarray]


class _Megatron(Source[np.ndarray]):
    _op = _OP

    def __init__(self, prefix: Any):
        if not isinstance(prefix, (str, os.PathLike)):
            raise TypeError(f"{_OP}: prefix must be a path (the dataset's files without .bin/.idx), got "
                            f"{type(prefix).__name__}")
        prefix = os.fspath(prefix)
        refuse_urls(_OP, [prefix])
        if prefix.endswith((".bin", ".idx")) and not os.path.exists(prefix + ".idx"):
            prefix = prefix[:-4]   # (the path of one of the two files: its prefix is meant)
        self._prefix = prefix
        self._files = Files(_OP, resolve(_OP, [prefix + ".bin", prefix + ".idx"], None))
        bin_info, idx_info = self._files.infos
        self._dtype, self._n, self._d, self._modes = self._header(idx_info.path, idx_info.size)
        itemsize = np.dtype(self._dtype).itemsize
        self._arrays = MappedArrays(self._files, [Layout(0, self._dtype, bin_info.size // itemsize),
                                                  Layout(0, "uint8", idx_info.size)])
        self._views: ProcessLocal[list[_Views]] = ProcessLocal(list)   # (empty until the first read)
        idx_digest = self._check_index(bin_info.size, itemsize)
        self._files.contents = [f"tokens:{self._dtype}+data:{sample_digest(self._files, _BIN)}",
                                f"index:{idx_digest}"]

    def _header(self, path: str, size: int) -> tuple[str, int, int, bool]:
        """``(dtype, n, d, modes)`` from the ``.idx`` header, its size checked against them."""
        head = self._files.read(_IDX, 0, min(size, HEADER), check=False)
        where = f"{_OP}({self._prefix!r}): {path}"
        if not head.startswith(MAGIC[:len(head)]) or not head:
            raise ValueError(f"{where} is not a Megatron index (magic {head[:9]!r}, expected {MAGIC!r})")
        if len(head) < HEADER:
            raise ValueError(f"{where} is truncated: {size} bytes, shorter than the {HEADER}-byte header of a "
                             "Megatron index")
        version, code, n, d = struct.unpack("<QBQQ", head[9:HEADER])
        if version != 1:
            raise ValueError(f"{where}: index version {version}; only version 1 (megatron-core's "
                             "IndexedDatasetBuilder) is known")
        if code not in DTYPES:
            raise ValueError(f"{where}: unknown dtype code {code} (known: "
                             f"{', '.join(f'{k} {v}' for k, v in DTYPES.items())})")
        expected = HEADER + 12 * n + 8 * d
        if size == expected or (size == expected + n and n > 0):
            return DTYPES[code], n, d, size != expected
        what = "truncated" if size < expected else "not the size its header says"
        raise ValueError(f"{where} is {what}: its header describes {n} sequences and {d} document indices "
                         f"({expected} bytes, or {expected + n} with modes) but it has {size} bytes")

    def _index_views(self) -> _Views:
        """This process's ``lengths``, ``pointers``, ``document_indices`` and ``modes``: views of the
        ``.idx`` file's mapping (mapped on first use, its ``stat`` checked)."""
        views = self._views.get()
        if not views:
            raw = self._arrays.get(_IDX)
            n, d = self._n, self._d
            a, b, c, e = HEADER, HEADER + 4 * n, HEADER + 12 * n, HEADER + 12 * n + 8 * d
            views.append(_Views(raw[a:b].view("<i4"), raw[b:c].view("<i8"), raw[c:e].view("<i8"),
                                raw[e:e + n].view("i1") if self._modes else None))
        return views[0]

    def _check_index(self, bin_size: int, itemsize: int) -> str:
        """Check the index against itself and the ``.bin``'s size; the digest of all its bytes."""
        raw = self._arrays.get(_IDX, check=False)
        h = hashlib.sha256()
        for k in range(0, raw.size, CHUNK * 8):
            h.update(raw[k:k + CHUNK * 8].data)
        v = self._index_views()
        idx, where = self._files.infos[_IDX].path, f"{self!r}: {self._files.infos[_BIN].path}"
        for a in range(0, self._n, CHUNK):
            lengths, pointers = v.lengths[a:a + CHUNK].astype(np.int64), v.pointers[a:a + CHUNK]
            ends = pointers + lengths * itemsize
            bad = np.flatnonzero((lengths < 0) | (pointers < 0) | (pointers % itemsize != 0) | (ends > bin_size))
            if bad.size:
                i = int(bad[0])
                if lengths[i] >= 0 and pointers[i] >= 0 and pointers[i] % itemsize == 0:
                    raise ValueError(f"{where} has {bin_size} bytes, but its index {idx} says sequence {a + i} ends "
                                     f"at byte {int(ends[i])}; the .bin is truncated or belongs to another index")
                raise ValueError(f"{self!r}: {idx} is corrupt: sequence {a + i} has length {int(lengths[i])} at byte "
                                 f"{int(pointers[i])} (lengths must be >= 0, pointers multiples of {itemsize})")
        docs = v.document_indices
        if self._d < 1 or docs[0] != 0 or docs[-1] != self._n or np.any(docs[1:] < docs[:-1]):
            shown = docs[:3].tolist() + (["...", int(docs[-1])] if self._d > 3 else [])
            raise ValueError(f"{self!r}: {idx} is corrupt: its document indices {shown} must go from 0 to the "
                             f"sequence count {self._n} without decreasing")
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        return self._n

    @property
    def lengths(self) -> np.ndarray:
        """The tokens of each sequence (read-only int32, from the index alone; for ``pack(..., lengths=)``)."""
        return self._index_views().lengths

    @property
    def document_indices(self) -> np.ndarray:
        """Megatron's document index (read-only int64): document ``k`` is sequences
        ``document_indices[k]:document_indices[k + 1]``; ``documents + 1`` entries, the last ``len(self)``."""
        return self._index_views().document_indices

    @property
    def modes(self) -> Optional[np.ndarray]:
        """The mode of each sequence (read-only int8) for a multimodal dataset, else ``None``."""
        return self._index_views().modes

    @property
    def dtype(self) -> np.dtype:
        """The tokens' dtype (from the index header)."""
        return np.dtype(self._dtype)

    def blocks(self) -> Positions:
        """The cumulative ends of the documents (``document_indices[1:]``): one block per document."""
        return self.document_indices[1:]

    def _tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens, lengths, pointers)`` in this process, both files' ``stat`` checked."""
        v = self._index_views()
        self._files.check(_IDX)
        return self._arrays.get(_BIN), v.lengths, v.pointers

    def _item(self, i: int) -> np.ndarray:
        tokens, lengths, pointers = self._tokens()
        start = int(pointers[i]) // tokens.itemsize
        return tokens[start:start + int(lengths[i])].copy()

    def _items(self, positions: Positions) -> list[np.ndarray]:
        tokens, lengths, pointers = self._tokens()
        starts = (pointers[positions] // tokens.itemsize).tolist()
        return [tokens[s:s + z].copy() for s, z in zip(starts, lengths[positions].tolist())]

    def __repr__(self) -> str:
        extra = ", modes" if self._modes else ""
        return (f"megatron({self._prefix!r}, sequences={self._n}, documents={max(self._d - 1, 0)}, "
                f"dtype={self._dtype}{extra})")


def megatron(prefix: Any) -> Source[np.ndarray]:
    """The sequences of a Megatron indexed dataset (``prefix.bin`` + ``prefix.idx``) as a lazy,
    position-addressable sequence of 1-D token arrays.

    Item ``i`` is sequence ``i``: a writable 1-D numpy array of the file's dtype, copied from a
    memory map of the ``.bin`` (mapped once per process, on first read). Building the source reads
    the ``.idx`` only (checked and hashed; see the module docstring for the format and the checks).
    Beyond a source's ``files()``, ``blocks()`` (one block per document) and batched
    ``__getitems__``, it has ``lengths`` (tokens per sequence, from the index: give them to
    :func:`seqloader.pack` as ``lengths=`` and nothing is read to pack), ``document_indices``,
    ``modes`` (multimodal datasets, else ``None``) and ``dtype``. ``seqloader.DataLoader`` records
    both files in its state and refuses to resume on a changed one.

    Args:
        prefix: the dataset's local path without ``.bin``/``.idx`` (what Megatron's
            ``--data-path`` takes); the path of either file is accepted too. Several datasets:
            :func:`seqloader.concatenate` or :func:`seqloader.mix` of one source each.

    Returns:
        A :class:`seqloader.sources.Source` of token arrays.

    Raises:
        TypeError: ``prefix`` is not a path.
        ValueError: ``prefix`` is a URL (memory maps need local files); the ``.idx`` is not a
            Megatron index, of an unknown version or dtype, truncated or corrupt; the ``.bin``
            is shorter than its index says (each naming the file).
        FileNotFoundError: ``prefix.bin`` or ``prefix.idx`` does not exist.
        RuntimeError: at read time, a file changed since the source was built (naming it).

    Example:
        >>> import os, struct, tempfile
        >>> prefix = os.path.join(tempfile.mkdtemp(), "corpus")   # 2 documents: [1 2 3], then [4 5] [6]
        >>> np.array([1, 2, 3, 4, 5, 6], dtype=np.uint16).tofile(prefix + ".bin")
        >>> with open(prefix + ".idx", "wb") as f:
        ...     _ = f.write(b"MMIDIDX\\x00\\x00" + struct.pack("<QBQQ", 1, 8, 3, 3))
        ...     _ = f.write(np.array([3, 2, 1], "<i4").tobytes() + np.array([0, 6, 10], "<i8").tobytes())
        ...     _ = f.write(np.array([0, 1, 3], "<i8").tobytes())
        >>> src = megatron(prefix)
        >>> len(src), src[0].tolist(), src[-1].tolist(), src.lengths.tolist(), src.document_indices.tolist()
        (3, [1, 2, 3], [6], [3, 2, 1], [0, 1, 3])
        >>> _ = open(prefix + ".bin", "r+b").truncate(10)   # an edge case: a truncated .bin
        >>> megatron(prefix)
        Traceback (most recent call last):
        ValueError: megatron('.../corpus', sequences=3, documents=2, dtype=uint16): .../corpus.bin has 10 bytes, but its index .../corpus.idx says sequence 2 ends at byte 12; the .bin is truncated or belongs to another index
    """
    return _Megatron(prefix)
