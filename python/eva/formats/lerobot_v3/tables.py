"""LeRobot v3.0 paths, file numbering and metadata tables (episodes, tasks, info.json), and how Parquet files are written."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset.errors import DatasetError, naming_write_errors
from eva.dataset.subset import (
    SubsetMeta,
    arrow_array,
)
from eva.formats._training_video import training_encoding, training_features
from eva.formats.options import LeRobotV3Options

CODEBASE_VERSION = "v3.0"
DATASET_FORMAT = "lerobot_v3"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
TASKS_PARQUET = "meta/tasks.parquet"

MB = 1024 * 1024


def next_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot's numbering: file_index runs to chunks_size - 1, then wraps in the next chunk."""
    if file_index >= chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


# --------------------------------------------------------------------------------------------------
# Metadata tables
# --------------------------------------------------------------------------------------------------


def _stat_type(stat_name: str, value: Any) -> pa.DataType:
    """Arrow type of one stat value: ``count`` is list<int64>, every other stat float64 lists
    nested like the value ([dim] for vectors, [3][1][1] for images)."""
    depth = 0
    probe_value = value
    while isinstance(probe_value, list):
        depth += 1
        probe_value = probe_value[0] if probe_value else 0.0
    t: pa.DataType = pa.int64() if stat_name == "count" else pa.float64()
    for _ in range(depth):
        t = pa.list_(t)
    return t


def to_plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def episodes_table(rows: list[dict[str, Any]], video_keys: Iterable[str]) -> pa.Table:
    """``meta/episodes`` table from per-episode dicts (locators, tasks, stats/<f>/<s>)."""
    fixed: list[tuple[str, pa.DataType]] = [
        ("episode_index", pa.int64()),
        ("tasks", pa.list_(pa.string())),
        ("length", pa.int64()),
        ("data/chunk_index", pa.int64()),
        ("data/file_index", pa.int64()),
        ("dataset_from_index", pa.int64()),
        ("dataset_to_index", pa.int64()),
    ]
    for key in video_keys:
        fixed += [
            (f"videos/{key}/chunk_index", pa.int64()),
            (f"videos/{key}/file_index", pa.int64()),
            (f"videos/{key}/from_timestamp", pa.float64()),
            (f"videos/{key}/to_timestamp", pa.float64()),
        ]
    fixed += [("meta/episodes/chunk_index", pa.int64()), ("meta/episodes/file_index", pa.int64())]
    stat_columns: dict[str, pa.DataType] = {}
    for row in rows:
        for name, value in row.items():
            if name.startswith("stats/") and name not in stat_columns and value is not None:
                stat_columns[name] = _stat_type(name.rsplit("/", 1)[-1], to_plain(value))
    fields = [pa.field(n, t) for n, t in fixed] + [pa.field(n, t) for n, t in stat_columns.items()]
    schema = pa.schema(fields)
    columns = []
    for f in schema:
        values = [row.get(f.name) for row in rows]
        column = _dense_nested_array(values, f.type) if f.name in stat_columns else None
        if column is None:
            values = [to_plain(v) for v in values]
            if pa.types.is_list(f.type) and pa.types.is_floating(_leaf_type(f.type)):
                values = [_floatify(v) for v in values]
            column = pa.array(values, type=f.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _dense_nested_array(values: list[Any], arrow_type: pa.DataType) -> pa.Array | None:
    """Nested list column from same-shaped values through one numpy array (no per-value Python);
    None when values are missing or ragged (the caller then takes the general path)."""
    if not values or any(v is None for v in values):
        return None
    leaf = _leaf_type(arrow_type)
    try:
        array = np.asarray(values, dtype=leaf.to_pandas_dtype())
    except (ValueError, TypeError):
        return None
    depth = 0
    t = arrow_type
    while pa.types.is_list(t):
        depth += 1
        t = t.value_type
    if array.ndim != depth + 1:
        return None
    nested: pa.Array = arrow_array(array.reshape(-1), leaf)
    for size in reversed(array.shape[1:]):
        offsets = np.arange(0, len(nested) + 1, size, dtype=np.int32)
        nested = pa.ListArray.from_arrays(arrow_array(offsets), nested)
    return nested


def _leaf_type(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t):
        t = t.value_type
    return t


def _floatify(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_floatify(v) for v in value]
    return float(value)


def tasks_table(tasks: Mapping[int, str]) -> pa.Table:
    """LeRobot's tasks.parquet: ``task_index`` column, the task text as the pandas index.

    pandas is not a dependency of eva, so the pandas schema metadata (what ``DataFrame.to_parquet``
    writes for an unnamed string index) is written by hand; ``pd.read_parquet`` then restores the
    task text as the index, which LeRobot reads with ``tasks.iloc[task_index].name``.
    """
    ordered = sorted(tasks.items())
    if [i for i, _ in ordered] != list(range(len(ordered))):
        raise DatasetError(f"{TASKS_PARQUET}: task indices are not 0..{len(ordered) - 1}")
    table = pa.table(
        {
            "task_index": pa.array([i for i, _ in ordered], type=pa.int64()),
            "__index_level_0__": pa.array([t for _, t in ordered], type=pa.string()),
        }
    )
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def v3_info(meta: SubsetMeta, settings: LeRobotV3Options) -> dict[str, Any]:
    """v3.0 info.json from the subset's v2.1 info (LeRobot's convert_info). Only keys LeRobot's
    schema knows: LeRobot 0.6 warns of any other key on every load, so eva's own (the format's
    name) live in quality_split.json."""
    info: dict[str, Any] = json.loads(json.dumps(meta.info))  # deep copy of JSON data
    fps = info.get("fps")
    info["codebase_version"] = CODEBASE_VERSION
    info.pop("dataset_format", None)
    info.pop("total_chunks", None)
    info.pop("total_videos", None)
    info["fps"] = int(fps) if fps is not None and float(fps).is_integer() else fps
    info["chunks_size"] = settings.chunks_size
    info["data_files_size_in_mb"] = _json_number(settings.data_files_size_in_mb)
    info["video_files_size_in_mb"] = _json_number(settings.video_files_size_in_mb)
    info["data_path"] = DATA_PATH
    info["video_path"] = VIDEO_PATH if meta.video_keys else None
    n = meta.total_episodes
    info["total_episodes"] = n
    info["total_frames"] = meta.total_frames
    info["total_tasks"] = len(meta.tasks)
    info["splits"] = {"train": f"0:{n}"} if n else {}
    for feature in info.get("features", {}).values():
        if feature.get("dtype") != "video":  # video features carry video.fps in "info"
            feature["fps"] = info["fps"]
    encoding = training_encoding(settings)
    if encoding is not None:  # the cameras as re-encoded, their settings as LeRobot records them
        training_features(info.get("features", {}), meta.video_keys, encoding)
    return info


def _json_number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _arrow_type_for_feature(feature: Mapping[str, Any]) -> pa.DataType | None:
    dtype = feature.get("dtype")
    if dtype in ("video", "image"):
        return None
    try:
        scalar = pa.from_numpy_dtype(np.dtype("bool" if dtype == "bool" else dtype))
    except (TypeError, ValueError):
        scalar = pa.string() if dtype == "string" else None
    if scalar is None:
        return None
    shape = list(feature.get("shape") or [1])
    if shape == [1]:
        return scalar
    if len(shape) == 1:
        return pa.list_(scalar, shape[0])
    return None


def write_empty_data(root: Path, features: Mapping[str, Any]) -> None:
    """An empty subset still gets a (zero-row) data file whose schema follows the features."""
    fields = []
    for name, feature in features.items():
        t = _arrow_type_for_feature(feature)
        if t is not None:
            fields.append(pa.field(name, t))
    path = root / DATA_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.schema(fields).empty_table(), path)


DICTIONARY_COLUMNS = ("episode_index", "task_index")


def write_parquet(table: pa.Table, path: Path) -> None:
    """A zero-row table gets a file with its schema and no row group (an empty row group makes
    HF datasets fail with "BatchSize must be greater than 0"). A write error names ``path``
    (pyarrow's own names no file)."""
    with naming_write_errors(path):
        if table.num_rows == 0:
            pq.ParquetWriter(path, table.schema).close()
        else:
            pq.write_table(table, path)
