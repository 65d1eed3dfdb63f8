"""Decoded Arrow columns as numpy arrays: :func:`to_numpy`, zero-copy where Arrow allows.

What a columnar source (:mod:`seqloader.sources._table`) turns each column of a decoded block
into, once per block: primitive columns without nulls and lists of numbers whose rows all have
one length (a token column) as views of Arrow's buffers (1-D and 2-D), anything else as numpy's
own conversion or an object array of rows.

The fast cases read Arrow's buffers with ``numpy.frombuffer`` (a few calls per column and
block, none per row): ``pyarrow.Array.to_numpy`` goes through pyarrow's pandas shim, whose first
call in a process imports pandas (about half a second, in every worker process) and whose
later calls cost more than the view. A list column's values are its flat values buffer
reshaped to ``(rows, length)``, its offsets checked with one vectorised comparison.
"""

from __future__ import annotations

from typing import Any, Optional, cast

import numpy as np

__all__ = ["to_numpy"]

#: Arrow's names of the fixed-width number types (``str(pa.int32())``) and their numpy dtypes.
_NUMBERS: dict[str, np.dtype[Any]] = {name: np.dtype(name) for name in ("int8", "int16", "int32", "int64", "uint8",
                                                                       "uint16", "uint32", "uint64")}
_NUMBERS.update({"halffloat": np.dtype(np.float16), "float": np.dtype(np.float32), "double": np.dtype(np.float64)})


def to_numpy(column: Any) -> np.ndarray:
    """A pyarrow (chunked) array as numpy: zero-copy for primitive columns without nulls; a 2-D
    array for fixed-size lists and for lists whose rows all have the same length (of integers or
    floats, without nulls: zero-copy of the values); an object array otherwise (str, bytes,
    ragged lists, structs, nulls).

    Example:
        >>> import pyarrow as pa
        >>> to_numpy(pa.array([1, 2])).tolist(), to_numpy(pa.array([1, None])).tolist()
        ([1, 2], [1, None])
        >>> to_numpy(pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0]), 2)).shape
        (2, 2)
        >>> tokens = to_numpy(pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.int32())))
        >>> tokens.dtype, tokens.shape
        (dtype('int32'), (2, 3))
        >>> ragged = to_numpy(pa.array([[1, 2, 3], [4]]))     # rows of different lengths
        >>> ragged.dtype, [r.tolist() for r in ragged]
        (dtype('O'), [[1, 2, 3], [4]])
    """
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks != 1:  # (combine_chunks copies even a single chunk: avoid it)
            parts = [to_numpy(c) for c in column.chunks]
            if parts and all(p.dtype != object and p.shape[1:] == parts[0].shape[1:] and p.dtype == parts[0].dtype
                             for p in parts):
                return np.concatenate(parts)
            return _rows_of(parts, len(column))
        column = column.chunk(0)
    arr = column
    typ = arr.type
    flat = _numbers(arr)
    if flat is not None:
        return flat
    square = _square(arr)
    if square is not None:
        return square
    if arr.null_count == 0 and (t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ)
                                or t.is_temporal(typ)):
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))
    if t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ) or (
            (t.is_list(typ) or t.is_large_list(typ)) and arr.null_count == 0 and arr.flatten().null_count == 0):
        return cast(np.ndarray, arr.to_numpy(zero_copy_only=False))   # (a list with a null value goes by to_pylist: None, not NaN)
    out = np.empty(len(arr), dtype=object)
    out[:] = arr.to_pylist()
    return out


def _numbers(arr: Any) -> Optional[np.ndarray]:
    """A pyarrow array of fixed-width numbers without nulls as a read-only view of its data
    buffer (honouring its offset); else ``None``."""
    dtype = _NUMBERS.get(str(arr.type))
    if dtype is None or arr.null_count:
        return None
    data = arr.buffers()[1]
    if data is None:   # (an empty array may have no buffer)
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _square(arr: Any) -> Optional[np.ndarray]:
    """A list array of numbers without nulls whose rows all have one length, as a 2-D array (a
    view of Arrow's values buffer); else ``None``."""
    import pyarrow.types as t

    typ = arr.type
    fixed = t.is_fixed_size_list(typ)
    if not (fixed or t.is_list(typ) or t.is_large_list(typ)) or arr.null_count or not len(arr):
        return None
    if str(typ.value_type) not in _NUMBERS:
        return None
    n = len(arr)
    if fixed:
        width = typ.list_size
        start = arr.offset * width
    else:
        offsets = np.frombuffer(arr.buffers()[1], np.int64 if t.is_large_list(typ) else np.int32, count=n + 1,
                                offset=arr.offset * (8 if t.is_large_list(typ) else 4))
        start, width = int(offsets[0]), int(offsets[1] - offsets[0])
        if int(offsets[-1]) - start != width * n or (n > 2 and not (np.diff(offsets) == width).all()):
            return None
    values = _numbers(arr.values.slice(start, width * n))
    return None if values is None else values.reshape(n, width)


def _rows_of(parts: list[np.ndarray], n: int) -> np.ndarray:
    """The rows of ``parts`` (1-D or 2-D arrays) as one object array of ``n`` rows (chunks of
    other dtypes or row lengths: one object per row is what the result is)."""
    out = np.empty(n, dtype=object)
    i = 0
    for p in parts:
        # (a 2-D part must give rows, not be broadcast: its row views, one object each, made in C)
        out[i:i + len(p)] = np.fromiter(p, dtype=object, count=len(p)) if p.ndim > 1 else p
        i += len(p)
    return out
