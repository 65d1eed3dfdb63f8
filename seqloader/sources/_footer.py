"""The footers of Parquet and Arrow IPC files: read in one request, checked, and digested.

Both formats end with a footer that holds their index (Parquet: the row groups and the byte
ranges of their column chunks; Arrow IPC: the schema and the byte ranges of the record
batches), its length and a magic string. :func:`parquet_footer` and :func:`arrow_footer` read the
last :data:`TAIL_BYTES` of a file (one ``pread``, or one range request; a second one only for a
larger footer), refuse with a ``ValueError`` naming the file what cannot be a whole file of the
format (too short, no magic at its end: typically a truncated copy; a footer longer than the
file), and return the bytes. The SHA-256 of the footer is the file's content in a fingerprint
(``footer:<hex>``), and each process that opens the file again compares it with the index's
before reading, once per file.
"""

from __future__ import annotations

import hashlib
import struct

from seqloader.sources._storage import Files

__all__ = ["TAIL_BYTES", "Footer", "parquet_footer", "arrow_footer", "arrow_blocks", "digest"]

#: Bytes read from the end of a file to find its footer in one request.
TAIL_BYTES = 64 * 1024


def digest(data: bytes) -> str:
    """16 hex digits of SHA-256."""
    return hashlib.sha256(data).hexdigest()[:16]


class Footer:
    """The last bytes of a file: ``tail`` starts at byte ``start`` and ends with the footer
    (``footer``: the footer, its length and the magic)."""

    __slots__ = ("tail", "start", "footer")

    def __init__(self, tail: bytes, start: int, length: int):
        self.tail, self.start, self.footer = tail, start, tail[len(tail) - length:]

    @property
    def digest(self) -> str:
        return digest(self.footer)


def _tail(op: str, files: Files, k: int, smallest: int, magic: bytes, what: str, check: bool) -> tuple[bytes, int]:
    path, size = files.infos[k].path, files.infos[k].size
    if size < smallest:
        raise ValueError(f"{op}: {path} is not {what} ({size} bytes; the smallest is {smallest}): an empty or "
                         "truncated file?")
    start = max(0, size - TAIL_BYTES)
    tail = files.read(k, start, size, check=check)
    if not tail.endswith(magic):
        raise ValueError(f"{op}: {path} is not {what} or is truncated (no {magic.decode()} magic at its end); "
                         "copy or write it again")
    return tail, start


def _whole(op: str, files: Files, k: int, tail: bytes, start: int, need: int, head: int, what: str,
           check: bool) -> Footer:
    """The footer of ``need`` bytes at the end of the file (after a leading magic of ``head`` bytes)."""
    path, size = files.infos[k].path, files.infos[k].size
    if need > size - head:
        raise ValueError(f"{op}: {path} is not {what} or is corrupt (its footer length, {need} bytes, does not fit "
                         f"in its {size} bytes)")
    if need > len(tail):
        start = size - need
        tail = files.read(k, start, size, check=check)
    return Footer(tail, start, need)


def parquet_footer(op: str, files: Files, k: int, check: bool = False) -> Footer:
    """The footer of Parquet file ``k`` (``FileMetaData``, its length, ``PAR1``).

    Raises:
        ValueError: the file is shorter than 12 bytes, has no ``PAR1`` at its end, or a footer
            longer than itself (naming the file).
    """
    tail, start = _tail(op, files, k, 12, b"PAR1", "a Parquet file", check)
    need = struct.unpack("<I", tail[-8:-4])[0] + 8
    return _whole(op, files, k, tail, start, need, 4, "a Parquet file", check)


def arrow_footer(op: str, files: Files, k: int, check: bool = False) -> Footer:
    """The footer of Arrow IPC file ``k`` (the flatbuffer, its length, ``ARROW1``).

    Raises:
        ValueError: the file is too short, has no ``ARROW1`` at its end, or a footer longer than
            itself (naming the file).
    """
    tail, start = _tail(op, files, k, 18, b"ARROW1", "an Arrow IPC file", check)
    need = struct.unpack("<I", tail[-10:-6])[0] + 10
    return _whole(op, files, k, tail, start, need, 8, "an Arrow IPC file", check)


def _at(fmt: str, buf: bytes, pos: int) -> int:
    if not 0 <= pos <= len(buf) - struct.calcsize(fmt):
        raise struct.error(f"offset {pos} outside the footer")
    value: int = struct.unpack_from(fmt, buf, pos)[0]
    return value


def arrow_blocks(flatbuffer: bytes) -> list[tuple[int, int, int]]:
    """``[(offset, metadata length, body length), ...]`` of the dictionary and record batch blocks
    of an Arrow IPC footer (its flatbuffer ``Footer`` table: fields 2 and 3 are vectors of 24-byte
    ``Block`` structs); ``struct.error`` when the flatbuffer is malformed.

    Example:
        >>> import io, pyarrow as pa, pyarrow.feather as feather
        >>> out = io.BytesIO(); feather.write_feather(pa.table({"x": [1, 2, 3]}), out, chunksize=2, compression="uncompressed")
        >>> data = out.getvalue(); n = struct.unpack("<I", data[-10:-6])[0]
        >>> [(length > 0, body) for _, length, body in arrow_blocks(data[-10 - n:-10])]
        [(True, 24), (True, 8)]
    """
    root = _at("<I", flatbuffer, 0)
    vtable = root - _at("<i", flatbuffer, root)
    vtable_size = _at("<H", flatbuffer, vtable)
    blocks = []
    for field in (2, 3):  # Footer.dictionaries, Footer.recordBatches
        if 4 + 2 * field + 2 > vtable_size:
            continue
        offset = _at("<H", flatbuffer, vtable + 4 + 2 * field)
        if not offset:
            continue
        vector = root + offset + _at("<I", flatbuffer, root + offset)
        n = _at("<I", flatbuffer, vector)
        if n > len(flatbuffer) // 24:
            raise struct.error(f"{n} blocks in a footer of {len(flatbuffer)} bytes")
        blocks += [struct.unpack_from("<qi4xq", flatbuffer, vector + 4 + 24 * i) for i in range(n)]
    return sorted(blocks)
