"""Hive-style partition folders (``year=2024/lang=en/part-0.parquet``) read as columns.

Writers that partition a table (Spark, Hive, ``pyarrow.dataset.write_dataset(...,
partitioning_flavor="hive")``) move a column out of the files and into the folder names. As
``pyarrow.parquet.read_table(folder)`` and ``pyarrow.dataset.dataset(folder, partitioning="hive")``
do, :func:`partitions` reads those ``key=value`` folders (below the folder the source was given)
back as columns: a value is URL-decoded, ``__HIVE_DEFAULT_PARTITION__`` is null, and a key is
``int32`` when every value is an integer that fits, else ``string`` (pyarrow's inference). A
partition value is a constant per file, so the columns stay position-addressable. Files that
disagree on the keys, or a key that is also a column of the files, are refused.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any, Sequence

__all__ = ["Partitions", "partitions"]

_SEGMENT = re.compile(r"^([^=/]+)=([^/]*)$")
_NULL = "__HIVE_DEFAULT_PARTITION__"
_INT = re.compile(r"^-?\d+$")


class Partitions:
    """``names`` and ``types`` (``"int32"`` or ``"string"``) of the partition keys, and the
    ``values`` of each file (``values[k][i]``, ``None`` for null)."""

    __slots__ = ("names", "types", "values")

    def __init__(self, names: list[str], types: list[str], values: list[list[Any]]):
        self.names, self.types, self.values = names, types, values

    def columns(self, k: int, n: int) -> list[tuple[str, Any]]:
        """The partition columns of ``n`` rows of file ``k``, as ``[(name, pyarrow array), ...]``."""
        import pyarrow as pa

        return [(name, pa.repeat(pa.scalar(v, type=getattr(pa, t)()), n))
                for name, t, v in zip(self.names, self.types, self.values[k])]

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.names, self.types, self.values)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.names, self.types, self.values = state


def _segments(name: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for part in name.split("/")[:-1] if (m := _SEGMENT.match(part))]


def partitions(op: str, names: Sequence[str], paths: Sequence[str]) -> Partitions | None:
    """The hive partitions of files named ``names`` (relative to the source's folder), or ``None``.

    Raises:
        ValueError: two files have different partition keys (naming both).

    Example:
        >>> p = partitions("demo", ["year=2024/lang=en/a.parquet", "year=2025/lang=f%20r/b.parquet"], ["a", "b"])
        >>> p.names, p.types, p.values
        (['year', 'lang'], ['int32', 'string'], [[2024, 'en'], [2025, 'f r']])
        >>> partitions("demo", ["a.parquet"], ["a"]) is None
        True
    """
    segs = [_segments(n) for n in names]
    keys = [[k for k, _ in s] for s in segs]
    if not any(keys):
        return None
    for k in range(1, len(keys)):
        if keys[k] != keys[0]:
            raise ValueError(f"{op}: {paths[0]} and {paths[k]} have different hive partitions "
                             f"({'/'.join(keys[0]) or 'none'} and {'/'.join(keys[k]) or 'none'}); give files of one "
                             "layout, or pass partitioning=None to read the files without their partition columns")
    raw: list[list[str | None]] = [[None if v == _NULL else urllib.parse.unquote(v) for _, v in s] for s in segs]
    types = []
    for i in range(len(keys[0])):
        present = [v for r in raw if (v := r[i]) is not None]
        ints = all(_INT.match(v) and -2**31 <= int(v) < 2**31 for v in present)
        types.append("int32" if ints and present else "string")
    values: list[list[Any]] = [[None if v is None else int(v) if t == "int32" else v for v, t in zip(r, types)]
                               for r in raw]
    return Partitions(list(keys[0]), types, values)
