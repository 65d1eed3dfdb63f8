"""Tar shards in the webdataset layout as a position-addressable sequence: :func:`tar_shards`.

The index is built once per shard (one pass, :mod:`seqloader.sources._tar_index`) and cached
(:mod:`seqloader.sources._tar_cache`); afterwards item ``p`` is found by bisection over the
shards' cumulative sample counts and read by offset: one read (a range request on object
storage) spanning its members. A batch groups its samples by shard, merges reads that are close
together (remote shards: :data:`MERGE_GAP`; local ones: reads that touch) and, for remote
shards, issues them ``num_threads`` at a time. A
shard's content in a fingerprint is the digest of its member table and of its first and last
64 KiB (``members:<hex>+data:<hex>``, ``_sample``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from seqloader.sequences._util import check_bool, check_callable, fname
from seqloader.sources._listing import resolve
from seqloader.sources._process import Threads
from seqloader.sources._progress import Progress
from seqloader.sources._sample import sample_digest
from seqloader.sources._storage import Files
from seqloader.sources._tar_cache import load_or_scan
from seqloader.sources._tar_index import COMPRESSED_SUFFIXES, ShardIndex, compression_of
from seqloader.sources.base import BlockIndex, Positions, Source, group_by_block, transform_items

__all__ = ["tar_shards"]

_OP = "tar_shards"
_SUFFIXES = (".tar",)
#: Reads of one remote shard less than this many bytes apart are merged into one (a range request
#: costs more than reading the gap). Local reads are merged only where they touch: a ``pread`` costs
#: less than copying a gap, and a batch's bytes then stay as small as its samples.
MERGE_GAP = 64 * 1024
#: A merged read is not extended past this many bytes.
MERGE_MAX = 16 << 20


class _TarShards(Source[Any]):
    def __init__(self, paths: Any, extensions: Sequence[str] | None, transform: Callable[..., Any] | None,
                 num_threads: int, cache_dir: str | None, use_cache: bool, storage_options: dict[str, Any] | None):
        check_callable(_OP, "transform", transform, allow_none=True)
        check_bool(_OP, "use_cache", use_cache)
        if extensions is not None and (isinstance(extensions, str) or not all(isinstance(e, str) for e in extensions)):
            raise TypeError(f"{_OP}: extensions must be a list of field names such as ['jpg', 'cls'] "
                            f"(got {extensions!r})")
        self._transform = transform
        self._threads = Threads(_OP, num_threads)
        listing = resolve(_OP, paths, _SUFFIXES, storage_options, explain=_compressed_only)
        infos = listing.infos
        self._files = Files(_OP, listing, storage_options)
        progress = Progress(_OP, len(infos), "shards")

        def build(k: int) -> tuple[ShardIndex, str]:
            index, how = load_or_scan(_OP, self._files, k, cache_dir, use_cache)
            progress.update(how)
            return index, sample_digest(self._files, k)

        try:
            built = self._threads.map(build, range(len(infos)))
        finally:
            progress.close()
            self._threads.release()   # (local shards use no thread from here on; remote reads start their own)
        self._shards: list[ShardIndex] = [index for index, _ in built]
        self.index_stats = {"cached": progress.counts.get("cached", 0), "scanned": progress.counts.get("scanned", 0)}
        self._files.contents = [f"members:{index.digest()}+data:{sample}" for index, sample in built]
        self._extensions = None if extensions is None else [e.lower().lstrip(".") for e in extensions]
        if self._extensions is not None:
            for k, shard in enumerate(self._shards):
                missing = [e for e in self._extensions if e not in shard.exts]
                if missing and len(shard):
                    raise ValueError(f"{_OP}: {infos[k].path} has no {missing[0]!r} members "
                                     f"(its fields: {', '.join(shard.exts)})")
        self._index = BlockIndex([len(s) for s in self._shards])

    def _fields(self, shard: ShardIndex) -> list[int]:
        if self._extensions is None:
            return list(range(len(shard.exts)))
        return [shard.exts.index(e) for e in self._extensions]

    def _members(self, s: int, samples: Positions) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The fields read from shard ``s``, and their offsets and sizes for ``samples``
        (``[field, sample]``, offset ``-1`` where a sample lacks the field)."""
        shard = self._shards[s]
        if self._extensions is None:   # (every field: no copy of the shard's whole table)
            return shard.exts, shard.offsets[:, samples], shard.sizes[:, samples]
        rows = self._fields(shard)
        return [shard.exts[e] for e in rows], shard.offsets[:, samples][rows], shard.sizes[:, samples][rows]

    def _plan(self, s: int, where: Positions, js: Positions) -> list[tuple[Any, ...]]:
        """The reads of shard ``s`` for its samples ``js`` (at ``where`` in the batch), in file
        order; samples whose members are less than :data:`MERGE_GAP` apart (remote; local: that
        touch) share one read (at most :data:`MERGE_MAX` bytes). Each read:
        ``(s, start, end, where, keys, fields, offsets, sizes)``, the last four per sample
        (offset ``-1``: a field the sample lacks)."""
        names, off, size = self._members(s, js)
        present = off >= 0
        if present.all():   # (the usual case: every sample has every field read)
            starts, ends = off.min(axis=0), (off + size).max(axis=0)
        else:
            starts = np.where(present, off, np.iinfo(np.int64).max).min(axis=0)
            ends = np.where(present, off + size, -1).max(axis=0)
            none = ~present.any(axis=0)   # a sample without any of the fields read: nothing to read
            starts[none], ends[none] = 0, 0
        order = np.argsort(starts, kind="stable")
        st, en = starts[order].tolist(), ends[order].tolist()
        keys = self._shards[s].keys[js[order]].tolist()
        wh, offs, sizes = where[order].tolist(), off.T[order].tolist(), size.T[order].tolist()
        gap = MERGE_GAP if self._files.remote else 0
        reads, first, a, b = [], 0, st[0], en[0]
        for i in range(1, len(st)):
            x, y = st[i], en[i]
            if x - b <= gap and max(y, b) - a <= MERGE_MAX:
                b = max(b, y)
                continue
            reads.append((s, a, b, wh[first:i], keys[first:i], names, offs[first:i], sizes[first:i]))
            first, a, b = i, x, y
        reads.append((s, a, b, wh[first:], keys[first:], names, offs[first:], sizes[first:]))
        return reads

    def _item(self, i: int) -> Any:
        return self._items(np.array([i], dtype=np.int64))[0]

    def _items(self, positions: Positions) -> list[Any]:
        shards, samples = self._index.locate(positions)
        reads = []   # (shard, start, end, where, keys, names, offsets, sizes): one read, its samples
        for s, where in group_by_block(shards):
            reads += self._plan(s, where, samples[where])
        for s in {r[0] for r in reads}:
            self._files.check(s)   # once per shard and batch, not per read
        def fetch(r: tuple[Any, ...]) -> bytes:
            return self._files.read(r[0], r[1], r[2], check=False)

        blobs = self._threads.map(fetch, reads) if self._files.remote else [fetch(r) for r in reads]
        out: list[Any] = [None] * positions.size
        for (_, start, _, where, keys, names, offs, sizes), blob in zip(reads, blobs):
            for w, key, o, n in zip(where, keys, offs, sizes):
                item = {"__key__": key}
                for f, x, k in zip(names, o, n):
                    if x >= 0:   # (slicing the bytes: a memoryview's slice then bytes() costs 3x more)
                        item[f] = blob[x - start:x - start + k]
                out[w] = item
        if self._transform is not None:
            transform_items(self, self._transform, out, positions, lambda w: (
                f"{_OP}: sample {str(self._shards[int(shards[w])].keys[samples[w]])!r} of "
                f"{self._files.infos[int(shards[w])].path}"))
        return out

    def __repr__(self) -> str:
        t = "" if self._transform is None else f", transform={fname(self._transform)}"
        return f"tar_shards(shards={len(self._files)}{t}, len={len(self)})"


_COMPRESSED_TARS = (".tgz", *(".tar" + suffix for suffix in COMPRESSED_SUFFIXES))


def _compressed_only(folder: str, names: list[str]) -> Exception | None:
    """The error for a folder that holds compressed tars and no ``.tar``, else ``None``."""
    found = [n for n in names if n.lower().endswith(_COMPRESSED_TARS)]
    if not found:
        return None
    return ValueError(f"{_OP}: {folder} holds no .tar file, only {len(found)} compressed tar(s) ({found[0]}: "
                      f"{compression_of(found[0], b'')}), which cannot be read at random positions (a compressed "
                      "stream has no offsets); decompress them (e.g. `gunzip`) or write them uncompressed, "
                      "compressing each member instead (.jpg, .npy.gz)")


def tar_shards(paths: Any, *, extensions: Sequence[str] | None = None, transform: Callable[..., Any] | None = None,
               num_threads: int = 16, cache_dir: str | None = None, use_cache: bool = True,
               storage_options: dict[str, Any] | None = None) -> Source[Any]:
    """The samples of tar shards in the webdataset layout, as a lazy, position-addressable sequence.

    Members sharing a key form a sample: ``000123.jpg`` and ``000123.cls`` give item
    ``{"__key__": "000123", "jpg": b"...", "cls": b"..."}`` (bytes, as stored). Each shard is
    indexed once (one pass over its headers; ``num_threads`` shards at a time) and the index is
    cached, beside the shard when its folder is writable, else in ``cache_dir`` (a warning says
    when it can be written nowhere). A cached index is used only while the shard has the same
    size and validator (inode and ctime locally, ETag or version id remotely) and a few of its
    member headers read again match; a damaged cache file is ignored with a warning naming it.
    The members of a sample must be consecutive, and every shard must end with tar's
    end-of-archive marker (a shard without it was cut short). ``blocks()`` are the shards.
    Builds of many shards report progress (a bar at a terminal when ``tqdm`` is installed, else
    INFO lines on the ``seqloader`` logger).

    Args:
        paths: a shard, a folder (its ``*.tar`` files, recursively), a glob, or a list of them;
            local paths or fsspec URLs (``s3://bucket/shards/``).
        extensions: the fields to read (default: all); a shard lacking one raises.
        transform: called on each sample dict when it is read (decode, augment); picklable for
            ``spawn``.
        num_threads: shards indexed at once, and reads of one batch issued at once (remote).
        cache_dir: where to cache indexes instead of beside the shards (default: beside them
            when writable, else ``~/.cache/seqloader/tar-index``; ``$SEQLOADER_CACHE`` moves it).
        use_cache: ``False`` always scans the shards and writes no cache.
        storage_options: keyword arguments for the fsspec filesystem (e.g. ``endpoint_url``).

    Returns:
        A :class:`seqloader.sources.Source` of all samples, shard after shard.

    Raises:
        FileNotFoundError: a path does not exist or a folder holds no ``.tar`` file.
        ValueError: a shard is compressed (``.tar.gz``: a compressed tar cannot be read at random
            positions; a folder of only compressed shards says so too), not a tar, corrupt or
            truncated (naming shard and offset), has a key twice with the same field, or a key
            whose members are not consecutive (naming shard and key).
        RuntimeError: at read time, a shard changed since it was indexed (naming it).

    Example:
        >>> import io, os, tarfile, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "shard-000.tar")
        >>> with tarfile.open(path, "w") as tf:
        ...     for name, data in [("a.txt", b"hi"), ("a.cls", b"0"), ("b.txt", b"yo"), ("b.cls", b"1")]:
        ...         info = tarfile.TarInfo(name); info.size = len(data); tf.addfile(info, io.BytesIO(data))
        >>> samples = tar_shards(path)
        >>> len(samples), samples[-1], samples.blocks().tolist()
        (2, {'__key__': 'b', 'txt': b'yo', 'cls': b'1'}, [2])
        >>> os.truncate(path, 2048)   # cut after the first sample: no end-of-archive marker
        >>> tar_shards(path)
        Traceback (most recent call last):
        ValueError: tar_shards: .../shard-000.tar is truncated: the archive stops at offset 2048 without its end-of-archive marker (two zero blocks; 0 of 1024 bytes there): the shard was cut short (an interrupted copy or download?); copy or write it again
    """
    return _TarShards(paths, extensions, transform, num_threads, cache_dir, use_cache, storage_options)
