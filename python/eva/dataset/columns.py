"""Arrow columns as numpy arrays, for the formats that store columns outside Parquet (HDF5, MCAP).

Both embed every Parquet column of an episode; numeric columns and (nested) fixed-size lists of
numbers become one ndarray built from the Arrow buffers (no Python lists), shaped
``(rows, d1, d2, ...)`` with the Arrow dtype kept. Anything else (strings, nulls, variable lists,
structs) stays exact as plain Python values.
"""

from __future__ import annotations

from typing import Any

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
        values = values.flatten()  # honours the slice offset
    numeric = (
        pat.is_integer(values.type) or pat.is_floating(values.type) or pat.is_boolean(values.type)
    )
    if values.null_count or not numeric:
        return None
    return values.to_numpy(zero_copy_only=False).reshape(shape)


def column_values(column: pa.ChunkedArray | pa.Array) -> Any:
    """An ndarray when Arrow can give one (see ``fixed_size_values``), else ``to_pylist()``."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    as_numpy = fixed_size_values(array)
    if as_numpy is not None:
        return as_numpy
    return array.to_pylist()
