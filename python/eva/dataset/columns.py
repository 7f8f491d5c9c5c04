"""Arrow columns as numpy arrays, for the formats that store columns outside Parquet (HDF5, MCAP).

Both embed every Parquet column of an episode; numeric columns and (nested) fixed-size lists of
numbers become one ndarray built from the Arrow buffers (no Python lists), shaped
``(rows, d1, d2, ...)`` with the Arrow dtype kept. Anything else (strings, nulls, variable lists,
structs) stays exact as plain Python values.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.types as pat


def fixed_size_values(array: pa.Array) -> np.ndarray | None:
    """(n, d1, d2, ...) numpy array of nested fixed-size lists of a primitive type (or of a plain
    numeric / boolean array), else None. Any null, at any level, gives None."""
    shape = [len(array)]
    values: pa.Array = array
    while pat.is_fixed_size_list(values.type):
        if values.null_count:
            return None
        shape.append(values.type.list_size)
        values = list_values(values)
    numeric = (
        pat.is_integer(values.type) or pat.is_floating(values.type) or pat.is_boolean(values.type)
    )
    if values.null_count or not numeric:
        return None
    matrix: np.ndarray = values.to_numpy(zero_copy_only=False).reshape(shape)
    return matrix


def column_values(column: pa.ChunkedArray | pa.Array) -> Any:
    """An ndarray when Arrow can give one (see ``fixed_size_values``), else ``to_pylist()``."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    as_numpy = fixed_size_values(array)
    if as_numpy is not None:
        return as_numpy
    return array.to_pylist()


# ---- list and set operations from the Arrow buffers ----------------------------------------
# ``pyarrow.compute`` would do these in one call each, but importing it builds ~300 Python
# wrappers (50-60 ms per process, a third of a small export's imports); these few are cheap
# in numpy on the offsets buffer.


def _chunks(array: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(array.chunks) if isinstance(array, pa.ChunkedArray) else [array]


def list_values(array: pa.Array) -> pa.Array:
    """The values of a list, large-list or fixed-size-list array's rows, in order (what
    ``array.flatten()`` gives when no row is null, honouring the slice offset, without the
    ``pyarrow.compute`` import ``flatten`` costs)."""
    if array.null_count:
        return array.flatten()  # null rows' spans are skipped: leave that to Arrow
    if pat.is_fixed_size_list(array.type):
        size = array.type.list_size
        return array.values.slice(array.offset * size, len(array) * size)
    offsets = array.offsets
    if len(array) == 0:
        return array.values.slice(0, 0)
    start = offsets[0].as_py()
    return array.values.slice(start, offsets[len(array)].as_py() - start)


def list_lengths(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """int64 length of each row of a list, large-list or fixed-size-list array (a null row
    counts its offsets' span, 0 as Arrow writes it; callers refuse nulls first)."""
    parts: list[np.ndarray] = []
    for chunk in _chunks(array):
        if pat.is_fixed_size_list(chunk.type):
            parts.append(np.full(len(chunk), chunk.type.list_size, np.int64))
        else:
            # ``offsets`` honours the chunk's slice offset: len(chunk) + 1 entries
            offsets = chunk.offsets.to_numpy(zero_copy_only=False)
            parts.append(np.diff(offsets).astype(np.int64, copy=False))
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def list_parent_indices(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """For each value of ``array.flatten()``, the row it belongs to (int64)."""
    lengths = list_lengths(array)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def distinct_values(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-d array (``np.unique`` without its import of
    ``numpy.ma``, 30 ms on first use)."""
    ordered = np.sort(values, kind="stable")
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def distinct_scalars(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The sorted distinct non-null values of a numeric column, as Python scalars."""
    parts = [
        (c.drop_null() if c.null_count else c).to_numpy(zero_copy_only=False)
        for c in _chunks(column)
    ]
    if not parts:
        return []
    values = parts[0] if len(parts) == 1 else np.concatenate(parts)
    distinct: list[Any] = distinct_values(values).tolist()
    return distinct


def uniform_float_rows(arr: pa.Array) -> np.ndarray | None:
    """(n, dim) float64 from a list column whose rows all hold ``dim`` floats (how LeRobot
    stores vectors), equal to ``np.asarray(arr.to_pylist())`` without a Python float per
    element; None for anything else (nulls, ragged or empty rows, non-float values)."""
    if len(arr) == 0 or arr.null_count or not pa.types.is_floating(arr.type.value_type):
        return None
    values = list_values(arr)  # honours the array's offset, unlike .values
    if values.null_count:
        return None
    lengths = list_lengths(arr)
    dim = int(lengths[0])
    if dim == 0 or np.any(lengths != dim):
        return None
    return cast(
        np.ndarray, values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(arr), dim)
    )
