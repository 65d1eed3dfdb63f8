"""A folder of files, one class per sub-folder, as a position-addressable sequence: :func:`image_folder`.

The layout and the listing rules of torchvision's ``ImageFolder``: ``root/<class>/<file>``. The
classes are the sorted names of ``root``'s sub-folders (symbolic links to folders included, and
names starting with ``.`` or ``_`` too, as ``os.scandir(...).is_dir()`` sees them); the files
of a class are those below its folder whose name ends with one of the extensions (hidden files
and ``_`` files included), found by a walk that follows symbolic links, folder after folder
in sorted order of the folder paths, then by name within a folder: ``torchvision``'s
``sorted(os.walk(class_dir, followlinks=True))``. Where torchvision would loop forever (a link
to a folder above it), the walk skips the folder already on its path. A class folder without a
file raises torchvision's ``FileNotFoundError("Found no valid file for the classes ...")``, since
dropping it would shift every later label. A file directly in ``root`` is refused (torchvision
ignores it). The folder is listed once, so the order and the labels are the same in every
process and on every rank; item ``p`` is ``(data, label)`` with ``data`` the bytes of file ``p``
(or ``transform(bytes)``). Each file is a block; its content in a fingerprint is its class.
"""

from __future__ import annotations

import errno
import os
from typing import Any, Callable, Sequence, cast

import numpy as np

from seqloader.errors import add_note, annotate
from seqloader.sequences._util import check_callable, fname
from seqloader.sources._listing import FileInfo, Listing, _missing, local_info, remote_version, warn_weak
from seqloader.sources._process import Threads, optional_import
from seqloader.sources._storage import Files
from seqloader.sources.base import BlockIndex, Positions, Source

__all__ = ["image_folder", "IMAGE_EXTENSIONS"]

_OP = "image_folder"
#: torchvision's ``IMG_EXTENSIONS``.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _walk(top: str) -> list[tuple[str, list[str]]]:
    """``[(folder, file names), ...]`` below ``top``, following links, skipping a folder that is
    already on its own path (a loop), in torchvision's order."""
    out = []
    chains = {top: {os.path.realpath(top)}}
    for folder, dirs, names in os.walk(top, followlinks=True):
        chain = chains.pop(folder)
        keep = []
        for d in dirs:
            real = os.path.realpath(os.path.join(folder, d))
            if real not in chain:
                keep.append(d)
                chains[os.path.join(folder, d)] = chain | {real}
        dirs[:] = keep
        out.append((folder, sorted(names)))
    return sorted(out)


def _empty_classes(root: str, empty: list[str], exts: Sequence[str] | None) -> FileNotFoundError:
    msg = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
    if exts is not None:
        msg += f"Supported extensions are: {', '.join(exts)}"
    return FileNotFoundError(f"{_OP}: {msg} (in {root})")


def _check_root_files(root: str, names: list[str], exts: Sequence[str] | None) -> None:
    stray = [n for n in names if exts is None or n.lower().endswith(tuple(exts))]
    if stray:
        raise ValueError(f"{_OP}: {root}/{sorted(stray)[0]} is not inside a class folder; the layout is "
                         "root/<class>/<file>")


def _list_local(root: str, exts: Sequence[str] | None) -> tuple[list[str], list[FileInfo], list[int]]:
    if os.path.exists(root) and not os.path.isdir(root):   # torchvision's scandir says so too
        raise NotADirectoryError(errno.ENOTDIR, f"{_OP}: not a directory (root is the folder of the class "
                                 "folders: root/<class>/<file>)", root)
    if not os.path.isdir(root):
        raise _missing(_OP, root)
    entries = list(os.scandir(root))
    classes = sorted(e.name for e in entries if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{_OP}: Couldn't find any class folder in {root}.")
    _check_root_files(root, [e.name for e in entries if not e.is_dir()], exts)
    infos, labels, empty = [], [], []
    for c, name in enumerate(classes):
        found = [os.path.join(folder, n) for folder, names in _walk(os.path.join(root, name)) for n in names
                 if exts is None or n.lower().endswith(tuple(exts))]
        if not found:
            empty.append(name)
        infos += [local_info(p) for p in found]
        labels += [c] * len(found)
    if empty:
        raise _empty_classes(root, empty, exts)
    return classes, infos, labels


def _list_remote(url: str, exts: Sequence[str] | None,
                 storage_options: dict[str, Any] | None) -> tuple[list[str], list[FileInfo], list[int], str]:
    fsspec = optional_import("fsspec", "remote", _OP)
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    path = path.rstrip("/")
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        raise _missing(_OP, url) from None
    classes = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    if not classes:
        raise FileNotFoundError(f"{_OP}: Couldn't find any class folder in {url}.")
    _check_root_files(url, [e["name"].rsplit("/", 1)[-1] for e in entries if e.get("type") != "directory"], exts)
    index = {c: i for i, c in enumerate(classes)}
    found = []
    for info in fs.find(path, detail=True).values():
        rel = info["name"][len(path) + 1:]
        folder, _, name = rel.rpartition("/")
        if folder and (exts is None or name.lower().endswith(tuple(exts))):
            found.append((index[folder.split("/", 1)[0]], f"{path}/{folder}", name, info))
    found.sort(key=lambda t: t[:3])
    empty = sorted(set(classes) - {classes[c] for c, _, _, _ in found})
    if empty:
        raise _empty_classes(url, empty, exts)
    infos = []
    for _, _, _, info in found:
        version, strong = remote_version(info)
        if not strong:
            warn_weak(_OP, url.split("://", 1)[0], fs.unstrip_protocol(info["name"]))
        infos.append(FileInfo(fs.unstrip_protocol(info["name"]), int(info["size"]), version))
    return classes, infos, [c for c, _, _, _ in found], fs.unstrip_protocol(path)


class _ImageFolder(Source[Any]):
    def __init__(self, root: Any, extensions: Sequence[str] | None, transform: Callable[..., Any] | None,
                 num_threads: int, storage_options: dict[str, Any] | None):
        check_callable(_OP, "transform", transform, allow_none=True)
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"{_OP}: root must be a folder path or URL (got {type(root).__name__})")
        self._transform = transform
        self._threads = Threads(_OP, num_threads)
        exts = None if extensions is None else tuple(e.lower() if e.startswith(".") else "." + e.lower()
                                                      for e in extensions)
        root = os.fspath(root)
        if "://" in root and not root.startswith("file://"):
            classes, infos, labels, root = _list_remote(root, exts, storage_options)
            protocol: str | None = root.split("://", 1)[0]
        else:
            root = os.path.abspath(os.path.expanduser(root[len("file://"):] if root.startswith("file://") else root))
            classes, infos, labels = _list_local(root, exts)
            protocol = None
        self.classes = classes
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._labels = np.array(labels, dtype=np.int64)
        self._files = Files(_OP, Listing(tuple(infos), protocol, root), storage_options)
        self._files.contents = [f"class:{classes[c]}" for c in labels]
        self._index = BlockIndex(np.ones(len(infos), dtype=np.int64))

    @property
    def targets(self) -> list[int]:
        """The label of every item (torchvision's ``ImageFolder.targets``)."""
        return cast(list[int], self._labels.tolist())

    def _read(self, i: int) -> bytes:
        return self._files.read(i, 0, self._files.infos[i].size)

    def _finish(self, i: int, data: bytes) -> Any:
        if self._transform is not None:
            try:
                with annotate(self, i):
                    data = self._transform(data)
            except Exception as exc:
                add_note(exc, f"{_OP}: while transforming {self._files.infos[i].path} "
                              f"(class {self.classes[self._labels[i]]!r})")
                raise
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


def image_folder(root: Any, *, extensions: Sequence[str] | None = IMAGE_EXTENSIONS, transform: Callable[..., Any] | None = None,
                 num_threads: int = 16, storage_options: dict[str, Any] | None = None) -> Source[Any]:
    """The files of ``root/<class>/...`` as a lazy sequence of ``(data, label)``, as torchvision's ``ImageFolder``.

    The folder is listed once, with torchvision's rules (see the module docstring: class folders
    and links to folders are followed, without looping; hidden and ``_`` files are kept; the same
    order); ``classes`` are the sorted names of ``root``'s sub-folders and ``label`` is an index
    into them (``class_to_idx``). ``data`` is the file's bytes, or ``transform(bytes)`` (e.g.
    decode with PIL: ``lambda b: PIL.Image.open(io.BytesIO(b)).convert("RGB")``); an error in
    ``transform`` keeps its type and gains a note naming the file.

    Args:
        root: the folder, a local path or an fsspec URL.
        extensions: the file endings kept (case-insensitive); ``None`` keeps every file.
        transform: called on each file's bytes when it is read; picklable for ``spawn``.
        num_threads: files read at once in a batch (remote folders).
        storage_options: keyword arguments for the fsspec filesystem.

    Returns:
        A :class:`seqloader.sources.Source` with ``classes``, ``class_to_idx`` and ``targets``.

    Raises:
        FileNotFoundError: ``root`` does not exist or has no sub-folder; a class folder holds no
            file with those endings (torchvision's "Found no valid file for the classes ...").
        NotADirectoryError: ``root`` is a file.
        ValueError: a file lies directly in ``root`` (not in a class folder).

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> for cls, name in [("dog", "b.png"), ("cat", "z.png"), ("dog", "_a.png")]:
        ...     os.makedirs(os.path.join(root, cls), exist_ok=True)
        ...     with open(os.path.join(root, cls, name), "wb") as f:
        ...         _ = f.write(name.encode())
        >>> images = image_folder(root)
        >>> images.classes, list(images)
        (['cat', 'dog'], [(b'z.png', 0), (b'_a.png', 1), (b'b.png', 1)])
        >>> os.makedirs(os.path.join(root, "eel"))
        >>> image_folder(root)
        Traceback (most recent call last):
        FileNotFoundError: image_folder: Found no valid file for the classes eel. Supported extensions are: .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp (in ...)
    """
    return _ImageFolder(root, extensions, transform, num_threads, storage_options)
