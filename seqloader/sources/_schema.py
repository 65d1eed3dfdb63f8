"""The columns a table source reads: one check of the files' schemas, for Parquet and Arrow IPC.

Every file of a :func:`~seqloader.parquet` or :func:`~seqloader.arrow_ipc` source must give the
columns read with the same types, or rows from different files would not be the same kind of row
(a batch could not be collated, a resumed run would read values of another type). Without
``columns=`` every file must have the same columns (in any order: columns are read by name, and
rows follow the first file's order); with ``columns=`` each selected column must be in every file.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

__all__ = ["check_schemas"]


def check_schemas(op: str, paths: Sequence[str], schemas: Sequence[Any], columns: Optional[list[str]]) -> list[str]:
    """The names of the columns read, after checking the files' schemas (see the module docstring).

    Args:
        op: the source, for messages (``"parquet"``, ``"arrow_ipc"``).
        paths: the files, in order.
        schemas: their ``pyarrow.Schema``, in the same order.
        columns: the columns asked for, or ``None`` for all (the first file's).

    Returns:
        ``columns``, or the first file's column names.

    Raises:
        ValueError: naming the files and the first column where two files disagree (a column
            one lacks, or its two types), or the file that lacks a selected column.

    Example:
        >>> import pyarrow as pa
        >>> a, b = pa.schema([("x", pa.int64()), ("y", pa.string())]), pa.schema([("y", pa.string()), ("x", pa.int64())])
        >>> check_schemas("demo", ["a.arrow", "b.arrow"], [a, b], None)
        ['x', 'y']
        >>> check_schemas("demo", ["a.arrow", "c.arrow"], [a, pa.schema([("x", pa.int64())])], None)
        Traceback (most recent call last):
        ValueError: demo: a.arrow and c.arrow have different columns (first difference: 'y': column 'y' is in a.arrow but not in c.arrow); pass columns=[...] present in every file, or group files by schema
    """
    first, path0 = schemas[0], paths[0]
    names = list(first.names) if columns is None else list(columns)
    for c in names:
        if first.get_field_index(c) < 0:
            raise ValueError(f"{op}: column {c!r} is not in {path0} (its columns: {', '.join(first.names)})")
    for schema, path in zip(schemas[1:], paths[1:]):
        if columns is None and set(schema.names) != set(names):
            lacking = [c for c in names if c not in schema.names]
            c, has, lacks = (lacking[0], path0, path) if lacking else (
                next(c for c in schema.names if c not in names), path, path0)
            raise ValueError(f"{op}: {path0} and {path} have different columns (first difference: {c!r}: column "
                             f"{c!r} is in {has} but not in {lacks}); pass columns=[...] present in every file, "
                             "or group files by schema")
        for c in names:
            i = schema.get_field_index(c)
            if i < 0:
                raise ValueError(f"{op}: column {c!r} is in {path0} but not in {path}")
            if not schema.field(i).type.equals(first.field(c).type):
                raise ValueError(f"{op}: column {c!r} is {first.field(c).type} in {path0} but "
                                 f"{schema.field(i).type} in {path}")
    return names
