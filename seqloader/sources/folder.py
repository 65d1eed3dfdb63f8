"""A folder of files, one class per sub-folder, as a position-addressable sequence: :func:`image_folder`.

The layout of torchvision's ``ImageFolder``: ``root/<class>/<file>``. The folder is listed once
(sorted, so the order and the class numbers are the same in every process and on every rank);
item ``p`` is ``(data, label)`` with ``data`` the bytes of file ``p`` (or ``transform(bytes)``)
and ``label`` the index of its class folder in sorted order. Each file is a block.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from seqloader.errors import annotate
from seqloader.sequences._util import check_callable, fname
from seqloader.sources._process import Threads
from seqloader.sources._storage import Files, resolve
from seqloader.sources.base import BlockIndex, Positions, Source

__all__ = ["image_folder", "IMAGE_EXTENSIONS"]

_OP = "image_folder"
#: torchvision's ``IMG_EXTENSIONS``.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class _ImageFolder(Source[Any]):
    def __init__(self, root: Any, extensions: Sequence[str] | None, transform: Callable | None,
                 num_threads: int, storage_options: dict | None):
        check_callable(_OP, "transform", transform, allow_none=True)
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"{_OP}: root must be a folder path or URL (got {type(root).__name__})")
        self._transform = transform
        self._threads = Threads(_OP, num_threads)
        exts = None if extensions is None else tuple(e.lower() if e.startswith(".") else "." + e.lower()
                                                      for e in extensions)
        root = os.fspath(root).rstrip("/")
        infos, protocol = resolve(_OP, root + "/", exts, storage_options)
        if protocol is None:
            root = os.path.abspath(os.path.expanduser(root))
        rel = [f.path[len(root) + 1:] for f in infos]
        flat = [r for r in rel if "/" not in r]
        if flat:
            raise ValueError(f"{_OP}: {root}/{flat[0]} is not inside a class folder; the layout is root/<class>/<file>")
        class_of = [r.split("/", 1)[0] for r in rel]
        self.classes = sorted(set(class_of))
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._labels = np.array([self.class_to_idx[c] for c in class_of], dtype=np.int64)
        self._files = Files(_OP, infos, protocol, storage_options)
        self._index = BlockIndex(np.ones(len(infos), dtype=np.int64))

    @property
    def targets(self) -> list[int]:
        """The label of every item (torchvision's ``ImageFolder.targets``)."""
        return self._labels.tolist()

    def _read(self, i: int) -> bytes:
        return self._files.read(i, 0, self._files.infos[i].size)

    def _finish(self, i: int, data: bytes) -> Any:
        if self._transform is not None:
            with annotate(self, i):
                data = self._transform(data)
        return data, int(self._labels[i])

    def _item(self, i: int) -> Any:
        return self._finish(i, self._read(i))

    def _items(self, positions: Positions) -> list[Any]:
        ps = positions.tolist()
        blobs = self._threads.map(self._read, ps) if self._files.remote else [self._read(i) for i in ps]
        return [self._finish(i, b) for i, b in zip(ps, blobs)]

    def __repr__(self) -> str:
        t = "" if self._transform is None else f", transform={fname(self._transform)}"
        return f"image_folder(classes={len(self.classes)}{t}, len={len(self)})"


def image_folder(root: Any, *, extensions: Sequence[str] | None = IMAGE_EXTENSIONS, transform: Callable | None = None,
                 num_threads: int = 16, storage_options: dict | None = None) -> Source[Any]:
    """The files of ``root/<class>/...`` as a lazy sequence of ``(data, label)``, as torchvision's ``ImageFolder``.

    The folder is listed once, recursively, and sorted; ``classes`` are the sorted names of
    ``root``'s sub-folders and ``label`` is an index into them (``class_to_idx``). ``data`` is the
    file's bytes, or ``transform(bytes)`` (e.g. decode with PIL: ``lambda b:
    PIL.Image.open(io.BytesIO(b)).convert("RGB")``).

    Args:
        root: the folder, a local path or an fsspec URL.
        extensions: the file endings kept (case-insensitive); ``None`` keeps every file.
        transform: called on each file's bytes when it is read; picklable for ``spawn``.
        num_threads: files read at once in a batch (remote folders).
        storage_options: keyword arguments for the fsspec filesystem.

    Returns:
        A :class:`seqloader.sources.Source` with ``classes``, ``class_to_idx`` and ``targets``.

    Raises:
        FileNotFoundError: ``root`` does not exist or holds no file with those endings.
        ValueError: a file lies directly in ``root`` (not in a class folder).

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> for cls, name in [("dog", "b.png"), ("cat", "z.png"), ("dog", "a.png")]:
        ...     os.makedirs(os.path.join(root, cls), exist_ok=True)
        ...     with open(os.path.join(root, cls, name), "wb") as f:
        ...         _ = f.write(name.encode())
        >>> images = image_folder(root)
        >>> images.classes, list(images)
        (['cat', 'dog'], [(b'z.png', 0), (b'a.png', 1), (b'b.png', 1)])
        >>> image_folder(os.path.join(root, "bird"))
        Traceback (most recent call last):
        FileNotFoundError: [Errno 2] image_folder: no such file or directory: '.../bird'
    """
    return _ImageFolder(root, extensions, transform, num_threads, storage_options)
