"""A digest of a file's first and last bytes: what tells apart files whose index is the same.

A source's file list describes each file by what its index depends on (a Parquet or Arrow IPC
footer, a tar member table). Two files can share it and hold other data: Parquet files of the
same row count written without statistics (plain encoding, no compression) have byte-identical
footers, and two tar shards whose members have the same names and sizes have the same member
table. :func:`sample_digest` adds the first :data:`HEAD_BYTES` and the last :data:`TAIL_BYTES`
of the file (the tail is the one a footer was read from, when it was): the first column chunks
or record batches, or the first members' payloads, and the data just before the footer or the
end of the archive. Cheap: one more read per file (two for a tar shard), at indexing only. What
it cannot see: data that differs only between those ranges of a file larger than 128 KiB (listed
in docs/data.md, "What seqloader checks, and what it cannot").
"""

from __future__ import annotations

import hashlib

from seqloader.sources._storage import Files

__all__ = ["HEAD_BYTES", "TAIL_BYTES", "sample_digest"]

#: Bytes read at the start of a file for its sample.
HEAD_BYTES = 64 * 1024
#: Bytes at the end of a file in its sample (the footer's read, ``_footer.TAIL_BYTES``).
TAIL_BYTES = 64 * 1024


def sample_digest(files: Files, k: int, tail: bytes | None = None) -> str:
    """16 hex digits of SHA-256 over the first and last bytes of file ``k``.

    Args:
        files: the source's files.
        k: the file.
        tail: the last bytes of the file already read (a footer's tail), else read here.

    Returns:
        The digest (the same for the same bytes wherever the file is).

    Example:
        >>> import os, tempfile
        >>> from seqloader.sources._listing import resolve
        >>> d = tempfile.mkdtemp()
        >>> for name, data in (("a.bin", b"x" * 10), ("b.bin", b"y" * 10)):
        ...     _ = open(os.path.join(d, name), "wb").write(data)
        >>> files = Files("demo", resolve("demo", d, (".bin",), None))
        >>> sample_digest(files, 0) == sample_digest(files, 1), len(sample_digest(files, 0))
        (False, 16)
    """
    size = files.infos[k].size
    head = files.read(k, 0, min(size, HEAD_BYTES), check=False)
    if tail is None:
        tail = files.read(k, max(0, size - TAIL_BYTES), size, check=False) if size > HEAD_BYTES else b""
    h = hashlib.sha256(size.to_bytes(8, "little"))
    h.update(head)
    h.update(tail[-TAIL_BYTES:])
    return h.hexdigest()[:16]
