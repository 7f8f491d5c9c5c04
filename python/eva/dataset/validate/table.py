"""Checks of one episode's parquet table: every feature column against info.json (type and
shape from the footer; nulls, list lengths and NaN/inf from the values) and the row numbering
LeRobot relies on (frame_index, a contiguous global index, timestamps on the fps grid)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset.columns import (
    distinct_scalars,
    list_lengths,
    list_parent_indices,
    list_values,
)
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader, read_columns
from eva.dataset.validate.problems import ProblemCollector

__all__ = ["INT64_COLUMNS", "REQUIRED_COLUMNS", "TIMESTAMP_TOLERANCE_S", "check_table"]

REQUIRED_COLUMNS = ("episode_index", "index")
# Bookkeeping columns LeRobot stores as int64 whatever info.json says.
INT64_COLUMNS = ("index", "episode_index", "frame_index", "task_index")
# info.json dtype -> the arrow type of the column's values.
_ARROW_DTYPES: dict[str, pa.DataType] = {
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "bool": pa.bool_(),
    "string": pa.string(),
}
_NUMBERING_COLUMNS = (*INT64_COLUMNS, "timestamp")
# LeRobot's default tolerance for timestamp vs frame_index / fps.
TIMESTAMP_TOLERANCE_S = 1e-4


def check_table(
    reader: DatasetReader,
    parquet: pq.ParquetFile,
    data_path: Path,
    ep: int,
    rows: int,
    columns: set[str],
    tasks: dict[int, str] | None,
    out: ProblemCollector,
    on_table: Callable[[int, pa.Table], None] | None = None,
) -> int | None:
    """Column checks of one episode table; returns its first global ``index`` (if readable)."""
    for column in REQUIRED_COLUMNS:
        if column not in columns:
            out.add(
                "missing_column",
                f"{data_path}: episode {ep}: column {column} missing",
                data_path,
                ep,
            )
    wanted: list[str] = []
    schema = parquet.schema_arrow  # built anew on every access: ~0.2 ms
    for c in ("episode_index", "task_index", "index", "frame_index", "timestamp"):
        if c not in columns:
            continue
        type_ = schema.field(schema.get_all_field_indices(c)[0]).type  # duplicates: reported
        if pa.types.is_integer(type_) or pa.types.is_floating(type_):
            wanted.append(c)
        elif c not in reader.features:  # a feature's wrong type is reported already
            out.add(
                "wrong_column_type",
                f"{data_path}: episode {ep}: column {c} is {type_}, must be a number",
                data_path,
                ep,
            )
    # One read for the feature value checks and the numbering checks.
    read = _check_feature_columns(
        reader, parquet, schema, data_path, ep, rows, out, wanted if rows else []
    )
    if not wanted or rows == 0 or read is None:
        return None
    table = read.select(wanted)
    if on_table is not None:
        on_table(ep, table)
    first_index = _check_row_numbering(reader, data_path, ep, table, out)
    if "episode_index" in wanted:
        column = table.column("episode_index")
        values = distinct_scalars(column) + ([None] if column.null_count else [])
        if values != [ep]:
            out.add(
                "wrong_episode_index",
                f"{data_path}: episode {ep}: column episode_index holds {sorted(map(str, values))[:5]}",
                data_path,
                ep,
            )
    if "task_index" in wanted and tasks is not None:
        column = table.column("task_index")
        values = distinct_scalars(column)
        unknown = sorted(v for v in values if v not in tasks)
        nulls = column.null_count
        if unknown or nulls:
            detail = f"values {unknown[:5]}" if unknown else f"{nulls} nulls"
            out.add(
                "unknown_task_index",
                f"{data_path}: episode {ep}: task_index {detail} not in tasks.jsonl",
                data_path,
                ep,
            )
    return first_index


def _type_problem(name: str, feature: dict[str, Any], type_: pa.DataType) -> str | None:
    """Why a column of arrow type ``type_`` cannot hold ``feature`` (None: it can).

    ``shape`` [1] is a plain column (LeRobot's ``Value``) or a one-element list; a longer shape
    is (nested) lists, fixed-size ones of exactly that size. A dtype eva does not know (or an
    image, stored as a struct) is not checked beyond its presence.
    """
    if name in INT64_COLUMNS:
        return None if type_ == pa.int64() else f"is {type_}, must be int64"
    if name == "timestamp":
        return None if pa.types.is_floating(type_) else f"is {type_}, must be a float"
    dtype, shape = feature.get("dtype"), feature.get("shape")
    leaf = _ARROW_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if leaf is None or not isinstance(shape, list):
        return None
    want = f"{dtype}{shape}"
    dims = [] if shape == [1] and not _is_list(type_) else list(shape)
    for dim in dims:
        if pa.types.is_fixed_size_list(type_):
            if type_.list_size != dim:
                return f"is {type_}, expected {want} (lists of {dim})"
        elif not _is_list(type_):
            return f"is {type_}, expected {want}"
        type_ = type_.value_type
    if type_ == leaf or (dtype == "string" and pa.types.is_large_string(type_)):
        return None
    return f"holds {type_} values, expected {want}"


def _is_list(type_: pa.DataType) -> bool:
    return cast(
        bool,
        pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
        or pa.types.is_fixed_size_list(type_),
    )


def _check_feature_columns(
    reader: DatasetReader,
    parquet: pq.ParquetFile,
    schema: pa.Schema,
    data_path: Path,
    ep: int,
    rows: int,
    out: ProblemCollector,
    also_read: list[str],
) -> pa.Table | None:
    """Every non-video feature of info.json is a column of the right type and shape, without
    nulls and (floats) without NaN/inf. Types from the footer; values are read only for the
    columns whose footer type cannot vouch for them (variable-length lists, nulls, floats).
    Returns the columns read, ``also_read`` among them (the caller's numbering checks); None
    when the file could not be read (reported)."""
    names = schema.names
    to_read: list[tuple[str, dict[str, Any]]] = []
    for name, feature in reader.features.items():
        if feature.get("dtype") == "video":
            continue
        if name not in names:
            if name not in REQUIRED_COLUMNS:  # reported by the caller already
                out.add(
                    "missing_column",
                    f"{data_path}: episode {ep}: column {name} missing (a feature in info.json)",
                    data_path,
                    ep,
                )
            continue
        if names.count(name) > 1:
            out.add(
                "wrong_column_type",
                f"{data_path}: episode {ep}: column {name} appears more than once",
                data_path,
                ep,
            )
            continue
        type_ = schema.field(name).type
        problem = _type_problem(name, feature, type_)
        if problem is not None:
            out.add(
                "wrong_column_type",
                f"{data_path}: episode {ep}: column {name} {problem}",
                data_path,
                ep,
            )
            continue
        # The index columns are read (and their values checked) by the numbering checks.
        if rows and feature.get("dtype") in _ARROW_DTYPES and name not in _NUMBERING_COLUMNS:
            to_read.append((name, feature))
    names_to_read = [name for name, _ in to_read]
    names_to_read += [name for name in also_read if name not in names_to_read]
    if not names_to_read:
        return pa.table({})
    try:
        if len(names) == len(set(names)) and set(names_to_read) == set(names):
            # every column: the reader's whole-table read, which the export's writers are then
            # served (while the file is unchanged) instead of reading the file again
            table = reader.read_table(ep)
        else:
            table = read_columns(parquet, names_to_read)
    except DatasetError as e:
        out.add("unreadable_parquet", str(e), data_path, ep)
        return None
    except (pa.ArrowInvalid, OSError) as e:
        out.add("unreadable_parquet", f"{data_path}: episode {ep}: {e}", data_path, ep)
        return None
    for name, feature in to_read:
        value_problem = _value_problem(table.column(name).combine_chunks(), feature, name)
        if value_problem is not None:
            code, message = value_problem
            out.add(code, f"{data_path}: episode {ep}: column {name}: {message}", data_path, ep)
    return table


def _value_problem(array: pa.Array, feature: dict[str, Any], name: str) -> tuple[str, str] | None:
    """(code, message) of the first problem in a column's values: a null, a list of the wrong
    length, a NaN/inf (with the first row holding one); None when the values are sound."""
    shape = feature.get("shape")
    parents: np.ndarray | None = None  # row of each value once the lists are flattened
    depth = 0
    while _is_list(array.type):
        if array.null_count:
            first = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            return "null_values", f"row {_row(parents, first)} is null"
        if not pa.types.is_fixed_size_list(array.type) and isinstance(shape, list):
            dim = shape[depth] if depth < len(shape) else None
            lengths = list_lengths(array)
            wrong = np.flatnonzero(lengths != dim) if dim is not None else np.zeros(0, int)
            if len(wrong):
                first = int(wrong[0])
                return (
                    "wrong_column_type",
                    f"row {_row(parents, first)} holds {int(lengths[first])} values, "
                    f"shape is {shape}",
                )
        child = list_parent_indices(array)
        parents = child if parents is None else parents[child]
        array = list_values(array)
        depth += 1
    if array.null_count:
        first = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        return "null_values", f"row {_row(parents, first)} holds a null"
    if pa.types.is_floating(array.type) and name != "timestamp":
        values = array.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            first = int(bad[0])
            return (
                "non_finite_values",
                f"{len(bad)} NaN/inf values, the first in row {_row(parents, first)} "
                f"({values[first]})",
            )
    return None


def _row(parents: np.ndarray | None, position: int) -> int:
    return int(parents[position]) if parents is not None else position


def _numeric(table: pa.Table, name: str) -> np.ndarray | None:
    column = table.column(name)
    if column.null_count or not (
        pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
    ):
        return None
    return cast(np.ndarray, column.to_numpy())


def _check_row_numbering(
    reader: DatasetReader, data_path: Path, ep: int, table: pa.Table, out: ProblemCollector
) -> int | None:
    """frame_index 0..n-1, index contiguous, timestamp on the fps grid (what LeRobot checks)."""
    n = table.num_rows
    grid = np.arange(n)
    first_index = None
    names = table.column_names
    if "frame_index" in names:
        frame_index = _numeric(table, "frame_index")
        if frame_index is None or not np.array_equal(frame_index, grid):
            out.add(
                "bad_frame_index",
                f"{data_path}: episode {ep}: column frame_index is not 0..{n - 1}",
                data_path,
                ep,
            )
    if "index" in names:
        index = _numeric(table, "index")
        if index is None or not np.array_equal(index, index[0] + grid):
            out.add(
                "index_not_contiguous",
                f"{data_path}: episode {ep}: column index does not count up by 1",
                data_path,
                ep,
            )
        else:
            first_index = int(index[0])
    if "timestamp" in names:
        timestamp = _numeric(table, "timestamp")
        expected = grid / reader.fps
        worst = (
            float(np.max(np.abs(timestamp.astype(np.float64) - expected)))
            if timestamp is not None
            else float("inf")
        )
        finite = np.isfinite(timestamp) if timestamp is not None else None
        if timestamp is not None and finite is not None and not finite.all():
            # "off the grid by up to nan s" named no row; NaN/inf are never carried here
            # (--allow-non-finite is for vector values, a timestamp must be on the grid).
            row = int(np.argmin(finite))
            out.add(
                "timestamp_off_grid",
                f"{data_path}: episode {ep}: column timestamp: row {row} is "
                f"{float(timestamp[row])} (must be frame_index/fps)",
                data_path,
                ep,
            )
        elif not worst <= TIMESTAMP_TOLERANCE_S:
            out.add(
                "timestamp_off_grid",
                f"{data_path}: episode {ep}: column timestamp is off frame_index/fps by up to "
                f"{worst:.4g} s (tolerance {TIMESTAMP_TOLERANCE_S} s)",
                data_path,
                ep,
            )
    return first_index
