"""Is this the file list a state was saved with? :func:`describe_files` and :func:`check_same_files`.

A loader state that says "position 40960" means "of *these* files". A source's file list
(``Source.files()``) is ``[[name, size, content], ...]``: ``name`` relative to the folder the
source was given, ``content`` a digest of what the source's index depends on and of the data's
first and last 64 KiB (``footer:<hex>+data:<hex>`` for Parquet and Arrow IPC files,
``members:<hex>+data:<hex>`` for tar shards: their member table and a few member headers;
``class:<name>`` for an image folder's files). It holds no absolute path and no modification
time: the same files copied elsewhere (``cp -a``), to another node, or downloaded again describe
the same, and a file replaced by another of the same name and size but another footer, member
table or first or last bytes does not. (What it cannot see, such as a flipped bit in a JPEG's pixels,
is listed in docs/data.md, "What seqloader checks, and what it cannot".) Its *description* is ``{"files": n, "fingerprint": "<16 hex digits>", "chunk": c, "chunks": [...]}``:
the fingerprint of the whole list and of each run of ``c`` consecutive files (at most 32 runs,
6 hex digits each), small enough for a state dict (< 450 bytes whatever the number of files).
:func:`check_same_files` compares two file lists, or a saved description with a source, and
raises ``ValueError`` when they differ, naming the first file that differs: exactly with two
lists, or with a description of up to 32 files; beyond that, the first run of files that differs
(a description holds no names).
"""

from __future__ import annotations

from typing import Any, Sequence

from seqloader.sequences.describe import is_source
from seqloader.sources.base import fingerprint_of

__all__ = ["describe_files", "check_same_files"]


def _file_list(x: Any) -> list[list[Any]] | None:
    if is_source(x):
        return [list(f) for f in x.files()]
    if isinstance(x, (list, tuple)):
        return [list(f) for f in x]
    return None


#: The most runs of files a description fingerprints one by one.
CHUNKS = 32


def describe_files(source: Any) -> dict[str, Any]:
    """``{"files": n, "fingerprint": hex, "chunk": c, "chunks": [hex, ...]}`` for a source or a
    file list: JSON types, < 450 bytes.

    Args:
        source: a seqloader source (anything with ``files()``) or a list of ``[name, size, content]``.

    Returns:
        The description to store in a checkpoint.

    Raises:
        TypeError: ``source`` is neither.

    Example:
        >>> describe_files([["a.parquet", 10, "footer:00112233"]])
        {'files': 1, 'fingerprint': 'd4cf74b54564941b', 'chunk': 1, 'chunks': ['d4cf74']}
        >>> describe_files(3)
        Traceback (most recent call last):
        TypeError: describe_files: expected a source with files() or a list of [name, size, content] (got int)
    """
    files = _file_list(source)
    if files is None:
        raise TypeError("describe_files: expected a source with files() or a list of [name, size, content] "
                        f"(got {type(source).__name__})")
    per = max(1, -(-len(files) // CHUNKS))
    return {"files": len(files), "fingerprint": fingerprint_of(files), "chunk": per,
            "chunks": [fingerprint_of(files[k:k + per])[:6] for k in range(0, len(files), per)]}


def _fmt(f: Sequence[Any]) -> str:
    return f"{f[0]} (size {f[1]}, {f[2]})"


def check_same_files(saved: Any, current: Any) -> None:
    """Raise ``ValueError`` unless ``saved`` and ``current`` describe the same files.

    Args:
        saved: what the checkpoint holds: a description (:func:`describe_files`), a file list, or
            a source.
        current: the same kinds, usually the source being resumed.

    Raises:
        ValueError: the lists differ; the message names the first file that differs (with both
            sizes and contents) when both sides are lists, else the counts and fingerprints.
        TypeError: an argument is none of the kinds above.

    Example:
        >>> a = [["x.tar", 10, "members:01"], ["y.tar", 20, "members:02"]]
        >>> check_same_files(a, a); check_same_files(describe_files(a), a)
        >>> check_same_files(a, [a[0], ["y.tar", 20, "members:03"]])
        Traceback (most recent call last):
        ValueError: check_same_files: file 1 differs: y.tar (size 20, members:02) when saved, y.tar (size 20, members:03) now; resume with the files the state was saved with
    """
    saved_list, current_list = _file_list(saved), _file_list(current)
    if saved_list is not None and current_list is not None:
        for k, (a, b) in enumerate(zip(saved_list, current_list)):
            if list(a) != list(b):
                raise ValueError(f"check_same_files: file {k} differs: {_fmt(a)} when saved, {_fmt(b)} now; "
                                 "resume with the files the state was saved with")
        if len(saved_list) != len(current_list):
            k = min(len(saved_list), len(current_list))
            which, f = ("saved", saved_list[k]) if len(saved_list) > k else ("now", current_list[k])
            raise ValueError(f"check_same_files: {len(saved_list)} files when saved, {len(current_list)} now; "
                             f"file {k} ({f[0]}) is only in the list {'saved' if which == 'saved' else 'of now'}")
        return
    s = saved if isinstance(saved, dict) else describe_files(saved)
    c = current if isinstance(current, dict) else describe_files(current)
    if s.get("fingerprint") != c.get("fingerprint") and current_list is not None and "chunks" in s:
        _name_the_difference(s, current_list)
    if s.get("files") != c.get("files") or s.get("fingerprint") != c.get("fingerprint"):
        extra = ""
        if current_list is not None and isinstance(s.get("files"), int) and s["files"] < len(current_list):
            extra = f"; file {s['files']} ({current_list[s['files']][0]}) was not there when saved"
        raise ValueError(f"check_same_files: the files differ from those the state was saved with "
                         f"({s.get('files')} files, fingerprint {s.get('fingerprint')} when saved; "
                         f"{c.get('files')} files, fingerprint {c.get('fingerprint')} now){extra}; "
                         "resume with the same files (the same names relative to the source's folder, sizes "
                         "and contents)")


def _name_the_difference(saved: dict[str, Any], current: list[Any]) -> None:
    """Raise naming the first file (or run of files) of ``current`` that ``saved`` describes otherwise."""
    per, chunks = saved.get("chunk"), saved.get("chunks")
    if not isinstance(per, int) or per < 1 or not isinstance(chunks, list):
        return
    for k, fp in enumerate(chunks):
        part = current[k * per:(k + 1) * per]
        if part and fingerprint_of(part)[:6] == fp:
            continue
        lo = k * per
        if not part:
            raise ValueError(f"check_same_files: {saved.get('files')} files when saved, {len(current)} now; "
                             f"file {lo} and those after it are missing; resume with the files the state was "
                             "saved with")
        where = (f"file {lo}, {_fmt(part[0])} now," if per == 1 else
                 f"files {lo}..{lo + len(part) - 1} ({part[0][0]} .. {part[-1][0]}, one of them at least)")
        raise ValueError(f"check_same_files: {where} differs from the file list the state was saved with "
                         "(name, size or content); resume with the files the state was saved with")
    if len(current) > (saved.get("files") or 0):
        k = saved.get("files") or 0
        raise ValueError(f"check_same_files: {saved.get('files')} files when saved, {len(current)} now; file {k} "
                         f"({current[k][0]}) was not there when saved; resume with the files the state was saved with")
