"""Fixed windows over flat token files: :func:`token_windows`.

A flat token file is a 1-D array of token ids: raw binary (the tokens end to end, one dtype,
given by the caller) or a ``.npy`` file (numpy's header says the dtype and the count). Window
``j`` of a file is ``tokens[j * stride : j * stride + length]``; windows never cross files, a
file's tail shorter than ``length`` is dropped (``repr`` says how many tokens), and the windows of
the files follow each other in the order of the paths. The blocks are the files.

At construction each file is ``stat``-ed, a ``.npy``'s header is read, and its first and last
64 KiB are sampled for the fingerprint (``tokens:<dtype>+data:<hex>``); nothing else is read. A
file is memory-mapped once per process on its first read, after checking that it did not change
since (size, inode, ctime, mtime), and a window is copied out of the mapping (a batch of windows
of one file: one fancy-indexing copy).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from seqloader.errors import check_positive_int
from seqloader.sequences.describe import Stage
from seqloader.sources._listing import resolve
from seqloader.sources._mapped import Layout, MappedArrays, refuse_urls
from seqloader.sources._sample import sample_digest
from seqloader.sources._storage import Files
from seqloader.sources.base import BlockIndex, Positions, Source, group_by_block

__all__ = ["token_windows"]

_OP = "token_windows"
_NPY_MAGIC = b"\x93NUMPY"


def _npy_layout(path: str) -> Layout:
    """The layout of a ``.npy`` file's array from its header (``np.load(mmap_mode="r")`` reads only it)."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{_OP}: {path} is not a readable .npy file ({exc})") from None
    if not isinstance(arr, np.memmap) or arr.ndim != 1 or arr.dtype.kind not in "iu":
        what = (f"shape {arr.shape}, dtype {arr.dtype}" if isinstance(arr, np.ndarray) else type(arr).__name__)
        raise ValueError(f"{_OP}: {path} must hold a 1-D array of integer token ids (got {what}); flatten it "
                         "with np.save(path, tokens.reshape(-1))")
    layout = Layout(int(arr.offset), arr.dtype.str, int(arr.shape[0]))
    del arr
    return layout


class _TokenWindows(Source[np.ndarray]):
    _op = _OP
    #: reading copies out of a local memory map and draws from no global RNG, so the loader skips
    #: seeding them per batch (``seqloader.loader.rngs.draws``; about 30 µs of a batch of 8 windows)
    draws_globals = False

    def __init__(self, paths: Any, length: int, dtype: Any, stride: Any):
        self._length = check_positive_int(_OP, "length", length)
        self._stride = self._length if stride is None else check_positive_int(_OP, "stride", stride)
        want = None
        if dtype is not None:
            try:
                want = np.dtype(dtype)
            except TypeError:
                raise TypeError(f"{_OP}: dtype must be a numpy integer dtype such as np.uint16 (got {dtype!r})") from None
            if want.kind not in "iu":
                raise ValueError(f"{_OP}: dtype must be an integer dtype for token ids (got {want})")
        refuse_urls(_OP, [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else
                                                 paths if isinstance(paths, (list, tuple)) else [])])
        self._files = Files(_OP, resolve(_OP, paths, None))
        layouts = [self._layout(k, want) for k in range(len(self._files))]
        kinds = {np.dtype(lay.dtype) for lay in layouts}
        if len(kinds) > 1:
            k = next(k for k, lay in enumerate(layouts) if np.dtype(lay.dtype) != np.dtype(layouts[0].dtype))
            raise ValueError(f"{_OP}: the files hold different dtypes ({self._files.infos[0].path}: "
                             f"{np.dtype(layouts[0].dtype)}, {self._files.infos[k].path}: {np.dtype(layouts[k].dtype)});"
                             " windows of one source share one dtype")
        self._dtype = np.dtype(layouts[0].dtype)
        counts = [0 if lay.count < self._length else (lay.count - self._length) // self._stride + 1
                  for lay in layouts]
        self._dropped = sum(lay.count - ((c - 1) * self._stride + self._length if c else 0)
                            for lay, c in zip(layouts, counts))
        self._tokens = sum(lay.count for lay in layouts)
        self._index = BlockIndex(counts)
        self._arrays = MappedArrays(self._files, layouts)
        self._files.contents = [f"tokens:{self._dtype.str}+data:{sample_digest(self._files, k)}"
                                for k in range(len(self._files))]

    def _layout(self, k: int, want: np.dtype | None) -> Layout:
        info = self._files.infos[k]
        head = self._files.read(k, 0, min(info.size, len(_NPY_MAGIC)), check=False)
        if head == _NPY_MAGIC:
            lay = _npy_layout(info.path)
            if want is not None and np.dtype(lay.dtype) != want:
                raise ValueError(f"{_OP}: {info.path} holds {np.dtype(lay.dtype)} tokens but dtype={want} was given; "
                                 "pass dtype=None for .npy files (their header says the dtype)")
            return lay
        if want is None:
            what = ("is not a .npy file (no numpy header)" if info.path.endswith(".npy") else
                    "is a raw token file (no .npy header)")
            raise ValueError(f"{_OP}: {info.path} {what}; pass dtype= (the dtype its tokens were written with, "
                             "such as np.uint16)")
        if info.size % want.itemsize:
            raise ValueError(f"{_OP}: {info.path} has {info.size} bytes, not a multiple of the size of dtype={want} "
                             f"({want.itemsize} bytes); is the dtype right, or is the file truncated?")
        return Layout(0, want.str, info.size // want.itemsize)

    @property
    def dtype(self) -> np.dtype:
        """The tokens' dtype."""
        return self._dtype

    def _position_stage(self) -> Stage:
        """A source whose positions also depend on the window (``length``, ``stride``) and, for raw
        files, on the dtype (it decides how many tokens a file holds)."""
        return Stage(_OP, {"length": self._length, "stride": self._stride, "dtype": self._dtype.str}, source=True)

    def _item(self, i: int) -> np.ndarray:
        b, o = self._index.locate([i])
        start = int(o[0]) * self._stride
        return self._arrays.get(int(b[0]))[start:start + self._length].copy()

    def _items(self, positions: Positions) -> list[np.ndarray]:
        blocks, offsets = self._index.locate(positions)
        out: list[Any] = [None] * positions.size
        ramp = np.arange(self._length, dtype=np.int64)
        for b, where in group_by_block(blocks):
            rows = self._arrays.get(b)[(offsets[where] * self._stride)[:, None] + ramp]
            for w, row in zip(where.tolist(), rows):
                out[w] = row
        return out

    def __repr__(self) -> str:
        dropped = f", dropped={self._dropped} tail tokens" if self._dropped else ""
        return (f"token_windows(files={len(self._files)}, length={self._length}, stride={self._stride}, "
                f"dtype={self._dtype}, len={len(self)}{dropped})")


def token_windows(paths: Any, length: int, *, dtype: Any = None, stride: int | None = None) -> Source[np.ndarray]:
    """Fixed windows of ``length`` tokens over flat token files, as a lazy, position-addressable sequence.

    Item ``j`` of a file is ``tokens[j * stride : j * stride + length]``, a writable 1-D array of
    the file's dtype copied from a memory map (one per file and process, opened on first read).
    Windows never cross files; a file's tail shorter than ``length`` is dropped (``repr`` says how
    many tokens were). ``length=L + 1, stride=L`` gives next-token-prediction examples: inputs
    ``w[:-1]`` and labels ``w[1:]``, every token a label once. ``blocks()`` are the files;
    ``seqloader.DataLoader`` records them in its state and refuses to resume on a changed one.

    Args:
        paths: a local file, a glob, or a list of them: raw token files (the tokens end to end)
            or ``.npy`` files of a 1-D integer array (recognised by their header).
        length: tokens per window (> 0).
        dtype: the dtype of raw files (such as ``np.uint16``); ``None`` for ``.npy`` files, whose
            header says it (given, it must agree).
        stride: tokens between the starts of consecutive windows (> 0; default ``length``: windows
            that do not overlap).

    Returns:
        A :class:`seqloader.sources.Source` of 1-D token arrays of ``length`` entries.

    Raises:
        TypeError: ``length`` or ``stride`` is not an int; ``dtype`` is not a dtype.
        ValueError: ``length`` or ``stride`` is not positive; a path is a URL; a raw file and no
            ``dtype``; a file size that is not a multiple of the dtype's size; a ``.npy`` file
            that does not hold a 1-D integer array or whose dtype differs from ``dtype``; files
            of different dtypes.
        FileNotFoundError: a path does not exist.
        RuntimeError: at read time, a file changed since the source was built (naming it).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "tokens.bin")
        >>> np.arange(10, dtype=np.uint16).tofile(path)
        >>> w = token_windows(path, 4, dtype=np.uint16, stride=3)
        >>> len(w), w[0].tolist(), w[-1].tolist()
        (3, [0, 1, 2, 3], [6, 7, 8, 9])
        >>> token_windows(path, 4, dtype=np.uint16)   # an edge case: the 2-token tail is dropped
        token_windows(files=1, length=4, stride=4, dtype=uint16, len=2, dropped=2 tail tokens)
        >>> token_windows(path, 0, dtype=np.uint16)
        Traceback (most recent call last):
        ValueError: token_windows: length must be a positive int (got 0)
    """
    return _TokenWindows(paths, length, dtype, stride)
