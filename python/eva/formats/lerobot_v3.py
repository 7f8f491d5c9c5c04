"""LeRobot v3.0 export: sharded Parquet tables and packet-copied MP4 shards (contracts §6a).

Layout written into the staging directory::

    data/chunk-XXX/file-YYY.parquet              rows of consecutive episodes, in ``index`` order
    videos/<key>/chunk-XXX/file-YYY.mp4          that camera's episodes back to back
    meta/episodes/chunk-000/file-000.parquet     one row per episode: locators + stats/<f>/<s>
    meta/tasks.parquet                           task text as the pandas index, task_index column
    meta/info.json, stats.json                   v3.0 info; stats with q01..q99
    meta/episodes.jsonl, tasks.jsonl, episodes_stats.jsonl   kept from the v2.1 subset

Sharding, one episode at a time:

* Data: before an episode is added, the open data file is closed when the Arrow size of its rows
  plus the episode's would pass ``data_files_size_in_mb`` or when the episode's schema differs from
  the file's. A shard's rows are buffered (bounded by that size) and written with one
  ``write_table`` (one pass, big row groups; see perf-notes).
* Video, per camera: the open MP4 shard is closed when the data file rolls, when the shard plus
  the episode's MP4 would pass ``video_files_size_in_mb``, or when the episode's stream parameters
  (codec, size, pix_fmt, time base, extradata) differ. Differing parameters start a new file, never
  a re-encode: LeRobot addresses the video file per episode, so a new file is free, while a
  re-encode would change the pixels and cost two orders of magnitude more time.
* ``file_index`` counts to ``chunks_size - 1`` and then wraps to 0 in the next chunk folder.

Frame counts: before copying, the MP4's own sample count must equal the episode's rows; while
copying, the packets are counted (one MP4 video sample = one frame, so no decode is needed). With
``verify_decode`` every finished shard is decoded and its frames bucketed per episode by
timestamp. Any mismatch raises ``DatasetError`` naming episode and camera; the pipeline then
discards the staging directory, so nothing is published.

Quantiles (``stats.json`` and the per-episode ``stats/<feature>/q..`` columns): vector features are
exact (numpy ``linear`` quantiles over every row; the numeric columns are collected in their own
dtype for that, about 150 bytes per row for two 14-dim float32 vectors plus the bookkeeping
columns). Image features come from exact 256-bin per-channel histograms, per episode and summed
over the subset:

* Recorded by eva (the default for eva-written sources): when every exported episode has its
  cameras' histograms in the source's ``meta/eva_image_histograms.jsonl`` (the raw writer records
  them in the same pass as the image mean/std), those are used and nothing is decoded. They count
  the frames as given to the writer, before encoding, exactly like the image mean/std (and like
  LeRobot's own stats, computed from the frames passed to ``add_frame``), so every image stat of a
  feature describes the same pixels; the quantiles equal ``np.quantile`` over all those pixels.
  This holds with ``verify_decode`` too (it still decodes every frame, to count them).
* Otherwise (LeRobot-written or partly eva-written sources) they are sampled: an exact histogram
  of the frames that are decoded, by default a bounded sample of keyframes, whose packets the copy
  keeps on the way and worker threads decode (no seek, no second read; decoding, conversion and
  the histogram kernel release the GIL, so it overlaps the copy). The bound: at most
  ``image_quantile_keyframes`` keyframes per episode and camera (default 1: the episode's middle
  keyframe; with k, keyframe ``(2j + 1) * m // 2k`` of its m, j < k; 0 takes every keyframe, i.e.
  every GOP-th frame), so at most k x episodes x cameras frames are decoded whatever the episode
  length. Decoding a keyframe costs more than copying a whole episode's packets (1-2 ms at
  320x240), so the sample is what keeps the export at packet-copy speed. That is a systematic
  sample like LeRobot's own (it samples frames evenly too): the quantiles are exact for the
  sampled frames, and their deviation from the all-frames value is a sampling error, not a
  worst-case bound (on the 50-episode bench dataset: within 0.008 on the 0..1 scale with the
  middle keyframe, 0.012 with every keyframe). With ``verify_decode`` every frame is decoded
  anyway and these quantiles are exact over the decoded pixels (equal to numpy's ``np.quantile``
  on all of them within 1e-12).

Options: ``LeRobotV3Options`` (``eva.formats.options``; CLI ``eva export --format v3``), whose
fields have the names info.json uses: ``data_files_size_in_mb``, ``video_files_size_in_mb``,
``chunks_size``, ``verify_decode``, ``image_quantiles`` ("keyframes", or "none" to skip the
keyframe sample: image features then get no quantiles unless ``verify_decode`` decodes every
frame anyway or histograms were recorded) and ``image_quantile_keyframes`` (0 = every keyframe).

An empty subset is a complete dataset with zero-row, schema-only Parquet files (no row group).
LeRobot 0.4.4 itself cannot open a zero-episode dataset (HF datasets refuses an empty split), so
``make compat`` checks empty subsets with ``eva verify``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import layout
from eva.dataset.columns import distinct_scalars, fixed_size_values, list_lengths, list_values
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.stats import (
    DEFAULT_QUANTILES,
    ImageStats,
    quantile_key,
    quantiles_from_histogram,
    vector_quantile_table,
    vector_quantiles,
)
from eva.dataset.subset import (
    SubsetMeta,
    arrow_array,
    rewrite_index_columns,
    write_common_meta,
    write_staged_json,
)
from eva.formats._v3_video import (
    EpisodeVideo,
    ParamsCache,
    StreamParams,
    VideoConcatError,
    VideoShardWriter,
    decode_frames,
    decode_keyframes,
    probe,
)
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV3Options
from eva.progress import ProgressSink

CODEBASE_VERSION = "v3.0"
DATASET_FORMAT = "lerobot_v3"
OPTIONS = LeRobotV3Options  # this format's options (eva.formats.base.FormatModule)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
TASKS_PARQUET = "meta/tasks.parquet"

_MB = 1024 * 1024


def next_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot's numbering: file_index runs to chunks_size - 1, then wraps in the next chunk."""
    if file_index >= chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


# --------------------------------------------------------------------------------------------------
# Data shards
# --------------------------------------------------------------------------------------------------


class _DataShards:
    """Buffers episode tables into data files; rolls on size and on schema change."""

    def __init__(self, root: Path, settings: LeRobotV3Options, progress: ProgressSink) -> None:
        self.root = root
        self.settings = settings
        self.progress = progress
        self.limit_bytes = settings.data_files_size_in_mb * _MB
        self.chunk_index = 0
        self.file_index = 0
        self.tables: list[pa.Table] = []
        self.buffered_bytes = 0
        self.schema: pa.Schema | None = None

    def add(self, table: pa.Table) -> bool:
        """Queue one episode; returns True when it starts a new file (after the first one)."""
        schema = table.schema.remove_metadata()
        rolled = False
        if self.tables and (
            self.buffered_bytes + table.nbytes > self.limit_bytes or not schema.equals(self.schema)
        ):
            self.flush()
            self.chunk_index, self.file_index = next_file(
                self.chunk_index, self.file_index, self.settings.chunks_size
            )
            rolled = True
        self.schema = schema
        self.tables.append(table.replace_schema_metadata(None))
        self.buffered_bytes += table.nbytes
        return rolled

    def flush(self) -> None:
        if not self.tables:
            return
        path = self.root / DATA_PATH.format(
            chunk_index=self.chunk_index, file_index=self.file_index
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.concat_tables(self.tables)
        # Dictionary pages only for the columns with few distinct values: pyarrow tries one for
        # every column by default, and on noisy float vectors that costs 10x the write (160 ms
        # for 16,000 rows) and gives a larger file.
        dictionary = [n for n in _DICTIONARY_COLUMNS if n in table.column_names]
        pq.write_table(table, path, compression="snappy", use_dictionary=dictionary)
        self.tables = []
        self.buffered_bytes = 0
        self.progress(files=1, bytes=path.stat().st_size)


# --------------------------------------------------------------------------------------------------
# Video shards
# --------------------------------------------------------------------------------------------------


@dataclass
class _Placed:
    episode: int
    from_timestamp: float
    to_timestamp: float
    frames: int


@dataclass
class _CameraShards:
    """One camera's open MP4 shard, its numbering and the per-episode pixel histograms."""

    key: str
    root: Path
    settings: LeRobotV3Options
    progress: ProgressSink
    chunk_index: int = 0
    file_index: int = 0
    writer: VideoShardWriter | None = None
    placed: list[_Placed] = field(default_factory=list)
    # output episode -> (3, 256) histogram of its decoded frames (keyframes, or all frames)
    histograms: dict[int, np.ndarray] = field(default_factory=dict)
    # output episode -> keyframe histogram still being computed by the worker threads
    pending: dict[int, Future[np.ndarray]] = field(default_factory=dict)

    def path(self) -> Path:
        return self.root / VIDEO_PATH.format(
            video_key=self.key, chunk_index=self.chunk_index, file_index=self.file_index
        )

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        path = self.writer.path
        if self.settings.verify_decode:
            self.histograms.update(_decode_shard(path, self.key, self.placed))
        self.progress(files=1, bytes=path.stat().st_size)
        self.writer = None
        self.placed = []

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
            self.writer = None
        for future in self.pending.values():
            future.cancel()

    def collect(self) -> None:
        """Wait for the worker's keyframe histograms."""
        for ep, future in self.pending.items():
            try:
                self.histograms[ep] = future.result()
            except (av.error.FFmpegError, ValueError) as e:
                raise DatasetError(
                    f"subset episode {ep}, camera {self.key}: keyframes do not decode ({e})"
                ) from None
        self.pending = {}

    def roll(self) -> None:
        self.close()
        self.chunk_index, self.file_index = next_file(
            self.chunk_index, self.file_index, self.settings.chunks_size
        )


class _KeyframeHistograms:
    """Worker threads (up to two) turning keyframe packets into pixel histograms while the main thread
    copies packets (decoding, pixel conversion and the histogram kernel all release the GIL).
    At most ``max_pending`` episodes wait, so the copied keyframes in memory stay bounded."""

    def __init__(self, max_pending: int = 16) -> None:
        # Two workers measured 1.35x faster than one on the 2-core VM (the main thread mostly
        # waits on file opens and muxing, which release the GIL too).
        workers = max(1, min(2, os.cpu_count() or 1))
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="eva-v3-keyframes"
        )
        self._pending: list[Future[np.ndarray]] = []
        self._max_pending = max_pending

    def submit(self, params: StreamParams, packets: list[bytes]) -> Future[np.ndarray]:
        self._pending = [f for f in self._pending if not f.done()]
        while len(self._pending) >= self._max_pending:
            self._pending.pop(0).result()
        future = self._executor.submit(_keyframe_histogram, params, packets)
        self._pending.append(future)
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _keyframe_histogram(params: StreamParams, packets: list[bytes]) -> np.ndarray:
    stats = ImageStats()
    decode_keyframes(params, packets, stats.update)
    return stats.histogram()


def _decode_shard(path: Path, key: str, placed: list[_Placed]) -> dict[int, np.ndarray]:
    """Decode every frame of a finished shard: count each episode's frames by timestamp (they
    must equal its rows) and return each episode's exact pixel histogram."""
    stats = {ep.episode: ImageStats() for ep in placed}
    counts = dict.fromkeys(stats, 0)
    # Episode boundaries, shifted half a frame down so float rounding never moves a frame across.
    starts = np.asarray(
        [ep.from_timestamp - (ep.to_timestamp - ep.from_timestamp) / ep.frames / 2 for ep in placed]
    )
    order = [ep.episode for ep in placed]
    stray = 0
    for t, frame in decode_frames(path):
        slot = int(np.searchsorted(starts, t, side="right")) - 1
        if slot < 0:
            stray += 1
            continue
        ep = order[slot]
        counts[ep] += 1
        stats[ep].update(frame)
    for ep in placed:
        if counts[ep.episode] != ep.frames or stray:
            raise DatasetError(
                f"subset episode {ep.episode}, camera {key}: {counts[ep.episode]} frames decode from "
                f"{path.name} in [{ep.from_timestamp:.4f}, {ep.to_timestamp:.4f}) s, the table "
                f"has {ep.frames} rows"
            )
    return {ep: s.histogram() for ep, s in stats.items()}


# --------------------------------------------------------------------------------------------------
# Stats helpers
# --------------------------------------------------------------------------------------------------


def _numeric_vector_columns(table: pa.Table, features: Mapping[str, Any]) -> list[str]:
    """Columns with numeric per-row values (scalars or fixed-size lists) that are features."""
    names = []
    for name in table.column_names:
        if name not in features or features[name].get("dtype") in ("video", "image", "string"):
            continue
        t = table.schema.field(name).type
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
            t = t.value_type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            names.append(name)
    return names


def _column_matrix(table: pa.Table, name: str, where: str) -> np.ndarray:
    """(rows, dim) numpy array of a scalar or fixed-size-list column (dtype kept), or of a
    variable-list column whose rows all have one length (LeRobot writes vectors that way; as
    float64), from the Arrow buffers. ``where`` names the file and episode in errors."""
    column = table.column(name).combine_chunks()
    if pa.types.is_list(column.type):
        lengths = list_lengths(column)
        if column.null_count or (len(lengths) and np.any(lengths != lengths[0])):
            raise DatasetError(f"{where}: field {name!r}: rows are not vectors of one length")
        flat = list_values(column).to_numpy(zero_copy_only=False)
        return np.asarray(flat, np.float64).reshape(len(column), -1)
    values = fixed_size_values(column)
    if values is None:
        raise DatasetError(f"{where}: field {name!r}: null values")
    return values.reshape(len(column), -1)


def _episode_quantiles(columns: Mapping[str, np.ndarray]) -> dict[str, dict[str, list[float]]]:
    """``vector_quantiles`` of every (n, dim) column (``_column_matrix`` output), from ONE
    ``np.quantile`` call over the columns side by side: numpy computes each column on its own,
    so the values are those of one call per column, without the per-call overhead."""
    if not columns:
        return {}
    table = vector_quantile_table(
        np.hstack([np.asarray(values, np.float64) for values in columns.values()]),
        DEFAULT_QUANTILES,
    )
    keys = [quantile_key(q) for q in DEFAULT_QUANTILES]
    out: dict[str, dict[str, list[float]]] = {}
    start = 0
    for name, values in columns.items():
        dim = values.shape[1]
        part = table[:, start : start + dim]
        start += dim
        if np.isnan(part).any():
            continue  # a dimension without a finite value (carried NaN/inf): no quantiles
        out[name] = {key: [float(v) for v in row] for key, row in zip(keys, part, strict=True)}
    return out


class _QuantileCollector:
    """Per-feature data for exact dataset-level quantiles (vectors) and image histograms."""

    def __init__(self) -> None:
        self.vectors: dict[str, list[np.ndarray]] = {}
        self.image_hist: dict[str, np.ndarray] = {}

    def add_vectors(self, name: str, values: np.ndarray) -> None:
        self.vectors.setdefault(name, []).append(values)

    def add_histogram(self, key: str, histogram: np.ndarray) -> None:
        if key in self.image_hist:
            self.image_hist[key] = self.image_hist[key] + histogram
        else:
            self.image_hist[key] = histogram.copy()

    def quantiles(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, parts in self.vectors.items():
            quantiles = vector_quantiles(np.concatenate(parts), DEFAULT_QUANTILES)
            if quantiles:  # empty: a dimension without any finite value
                out[name] = quantiles
        for key, hist in self.image_hist.items():
            if int(hist.sum()) > 0:
                out[key] = quantiles_from_histogram(hist, DEFAULT_QUANTILES)
        return out


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


def _to_plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_to_plain(v) for v in value]
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
                stat_columns[name] = _stat_type(name.rsplit("/", 1)[-1], _to_plain(value))
    fields = [pa.field(n, t) for n, t in fixed] + [pa.field(n, t) for n, t in stat_columns.items()]
    schema = pa.schema(fields)
    columns = []
    for f in schema:
        values = [row.get(f.name) for row in rows]
        column = _dense_nested_array(values, f.type) if f.name in stat_columns else None
        if column is None:
            values = [_to_plain(v) for v in values]
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


def v3_info(meta: SubsetMeta, settings: LeRobotV3Options) -> dict:
    """v3.0 info.json from the subset's v2.1 info (LeRobot's convert_info, plus eva's keys)."""
    info = json.loads(json.dumps(meta.info))  # deep copy of JSON data
    fps = info.get("fps")
    info["codebase_version"] = CODEBASE_VERSION
    info["dataset_format"] = DATASET_FORMAT
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
    return info


def _json_number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


# --------------------------------------------------------------------------------------------------
# write_subset
# --------------------------------------------------------------------------------------------------


def write_subset(
    reader: DatasetReader,
    meta: SubsetMeta,
    staging_dir: Path,
    progress: ProgressSink,
    options: ExportOptions,
) -> None:
    """Write one complete v3.0 subset into ``staging_dir`` (see the module doc)."""
    settings = options.format_options(LeRobotV3Options)
    root = Path(staging_dir)
    root.mkdir(parents=True, exist_ok=True)
    features: dict[str, Any] = meta.info.get("features", {})
    video_keys = list(meta.video_keys)
    for key in video_keys:
        layout.check_video_key(key)

    data = _DataShards(root, settings, progress)
    cameras = {key: _CameraShards(key, root, settings, progress) for key in video_keys}
    quantiles = _QuantileCollector()
    episode_rows: list[dict[str, Any]] = []
    keyframe_pool = _KeyframeHistograms()
    params_cache = ParamsCache()
    # Exact image quantiles from the source's recorded histograms, without decoding anything.
    recorded = bool(video_keys) and meta.has_all_image_histograms()
    sample_keyframes = (
        not recorded and not settings.verify_decode and settings.image_quantiles == "keyframes"
    )
    try:
        for ep in range(meta.total_episodes):
            source = meta.source_index(ep)
            progress(current=f"episode {ep} (source {source})")
            table = _read_episode_table(reader, source)
            where = f"{reader.data_path(source)}: episode {source}"
            n = table.num_rows
            if n == 0:
                raise DatasetError(f"{where}: empty episode (0 rows) cannot be exported")
            if n != meta.lengths[ep]:
                raise DatasetError(
                    f"{where}: table has {n} rows, episodes.jsonl says {meta.lengths[ep]}"
                )
            table = rewrite_index_columns(
                table, ep, meta.index_offsets[ep], meta.task_remap, where=where
            )
            data_rolled = data.add(table)
            row = _episode_row(meta, ep, table, data)
            ep_stats = {k: dict(v) for k, v in meta.episodes_stats.get(ep, {}).items()}
            episode_vectors: dict[str, np.ndarray] = {}
            for name in _numeric_vector_columns(table, features):
                values = _column_matrix(table, name, where)
                quantiles.add_vectors(name, values)
                if name in ep_stats:
                    episode_vectors[name] = values
            for name, q in _episode_quantiles(episode_vectors).items():
                ep_stats[name].update(q)

            for key in video_keys:
                cam = cameras[key]
                placed = _append_video(
                    reader,
                    source,
                    ep,
                    key,
                    n,
                    cam,
                    data_rolled,
                    settings,
                    keyframe_pool,
                    params_cache,
                    sample_keyframes,
                )
                row[f"videos/{key}/chunk_index"] = cam.chunk_index
                row[f"videos/{key}/file_index"] = cam.file_index
                row[f"videos/{key}/from_timestamp"] = placed.from_timestamp
                row[f"videos/{key}/to_timestamp"] = placed.to_timestamp
            row["_stats"] = ep_stats
            episode_rows.append(row)
            progress(episodes=1)
        data.flush()
        for cam in cameras.values():
            cam.close()
            cam.collect()
    except BaseException:
        for cam in cameras.values():
            cam.abort()
        raise
    finally:
        keyframe_pool.shutdown()

    # Image quantiles: per episode from its histogram, dataset-wide from their sum.
    for row in episode_rows:
        ep_stats = row.pop("_stats")
        for key, cam in cameras.items():
            hist = (
                meta.image_histograms[row["episode_index"]][key]
                if recorded
                else cam.histograms.get(row["episode_index"])
            )
            if hist is None or int(hist.sum()) == 0:
                continue
            quantiles.add_histogram(key, hist)
            if key in ep_stats:
                ep_stats[key].update(quantiles_from_histogram(hist, DEFAULT_QUANTILES))
        for feature, stat in ep_stats.items():
            for stat_name, value in stat.items():
                row[f"stats/{feature}/{stat_name}"] = value

    if meta.total_episodes == 0:
        _write_empty_data(root, features)

    episodes_path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True, exist_ok=True)
    _write_parquet(episodes_table(episode_rows, video_keys), episodes_path)
    pq.write_table(tasks_table(meta.tasks), root / TASKS_PARQUET)

    info = v3_info(meta, settings)
    write_common_meta(root, meta, info)
    stats = {k: dict(v) for k, v in meta.stats.items()}
    for feature, q in quantiles.quantiles().items():
        if feature in stats:
            stats[feature].update(q)
    write_staged_json(root / layout.STATS, stats)
    progress(files=4)


def _read_episode_table(reader: DatasetReader, source: int) -> pa.Table:
    """The source episode's whole table (``ParquetFile.read``: ~4x less overhead per file than
    ``pq.read_table``'s dataset machinery, the same table)."""
    path = Path(reader.data_path(source))
    try:
        with pq.ParquetFile(path) as parquet:
            # one small file: Arrow's thread pool costs more than it saves
            return parquet.read(use_threads=False)
    except FileNotFoundError:
        raise DatasetError(f"{path}: episode {source} parquet missing") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{path}: episode {source}: {e}") from None


def _episode_row(meta: SubsetMeta, ep: int, table: pa.Table, data: _DataShards) -> dict[str, Any]:
    source_row = meta.episodes[ep]
    tasks = source_row.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        used = distinct_scalars(table.column("task_index"))
        tasks = [meta.tasks[i] for i in sorted(used)]
    start = meta.index_offsets[ep]
    return {
        "episode_index": ep,
        "tasks": tasks,
        "length": table.num_rows,
        "data/chunk_index": data.chunk_index,
        "data/file_index": data.file_index,
        "dataset_from_index": start,
        "dataset_to_index": start + table.num_rows,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
    }


def _append_video(
    reader: DatasetReader,
    source: int,
    ep: int,
    key: str,
    rows: int,
    cam: _CameraShards,
    data_rolled: bool,
    settings: LeRobotV3Options,
    keyframe_pool: _KeyframeHistograms,
    params_cache: ParamsCache | None = None,
    sample_keyframes: bool = True,
) -> _Placed:
    """Append source episode ``source``'s camera ``key`` to the camera's shard (rolling first)."""
    src_path = Path(reader.video_path(source, key))
    try:
        video = EpisodeVideo(src_path, params_cache)
    except VideoConcatError as e:
        raise DatasetError(f"episode {source}, camera {key}: {e}") from None
    with video:
        info = video.info
        if info.frames and info.frames != rows:
            raise DatasetError(
                f"{src_path}: episode {source}, camera {key}: holds {info.frames} frames, "
                f"the table has {rows} rows"
            )
        writer = cam.writer
        if writer is not None and (
            data_rolled
            or writer.payload_bytes + info.size_bytes > settings.video_files_size_in_mb * _MB
            or writer.params is None
            or not writer.params.compatible_with(info.params)
        ):
            cam.roll()
        if cam.writer is None:
            cam.writer = VideoShardWriter(cam.path())
        # Without recorded histograms or verify_decode, the keyframes copied on the way are the
        # quantile sample (decoded in worker threads); with verify_decode the whole shard is
        # decoded at close instead.
        keyframes: list[bytes] | None = [] if sample_keyframes else None
        try:
            appended = cam.writer.append(video, keyframes, settings.image_quantile_keyframes)
        except VideoConcatError as e:
            raise DatasetError(f"episode {source}, camera {key}: {e}") from None
    if appended.packets != rows:
        raise DatasetError(
            f"{src_path}: episode {source}, camera {key}: holds {appended.packets} frames, "
            f"the table has {rows} rows"
        )
    placed = _Placed(ep, appended.from_timestamp, appended.to_timestamp, rows)
    cam.placed.append(placed)
    if keyframes:  # already the spread sample (append's keyframe_limit)
        cam.pending[ep] = keyframe_pool.submit(info.params, keyframes)
    return placed


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


def _write_empty_data(root: Path, features: Mapping[str, Any]) -> None:
    """An empty subset still gets a (zero-row) data file whose schema follows the features."""
    fields = []
    for name, feature in features.items():
        t = _arrow_type_for_feature(feature)
        if t is not None:
            fields.append(pa.field(name, t))
    path = root / DATA_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_parquet(pa.schema(fields).empty_table(), path)


_DICTIONARY_COLUMNS = ("episode_index", "task_index")


def _write_parquet(table: pa.Table, path: Path) -> None:
    """A zero-row table gets a file with its schema and no row group (an empty row group makes
    HF datasets fail with "BatchSize must be greater than 0")."""
    if table.num_rows == 0:
        pq.ParquetWriter(path, table.schema).close()
    else:
        pq.write_table(table, path)


# --------------------------------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------------------------------

# Slack for comparing timestamps computed in the stream's time base with row timestamps; LeRobot
# looks frames up with tolerance_s = 1e-4.
TIMESTAMP_TOLERANCE_S = 1e-4
STATE = layout.STATE
ACTION = layout.ACTION


def read_episode_locators(root: Path) -> pa.Table:
    """All ``meta/episodes`` files in path order, concatenated (how LeRobot loads them)."""
    paths = sorted((Path(root) / "meta" / "episodes").glob("*/*.parquet"))
    if not paths:
        raise DatasetError(f"{Path(root) / 'meta' / 'episodes'}: no episode metadata files")
    return pa.concat_tables([pq.read_table(p) for p in paths], promote_options="default")


def _first_frame_at(path: Path, t: float) -> tuple[float, np.ndarray] | None:
    """Decode the frame presented at ``t`` seconds (seek to the keyframe before, decode on)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        target = int(round(t / float(stream.time_base)))
        container.seek(target, stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            ft = float(frame.pts * frame.time_base)
            if ft >= t - TIMESTAMP_TOLERANCE_S:
                return ft, frame.to_ndarray(format="rgb24")
    return None


def verify(export_dir: Path) -> list[Any]:
    """Follow the episode locators to the Parquet and MP4 shards and check them (see module doc):
    row ranges, index/frame_index/timestamp columns, per-shard frame counts against the episodes'
    lengths, timestamp ranges; then read one state, one action and one frame per camera per
    episode (pyarrow and PyAV)."""
    from eva.dataset.validate import Problem

    root = Path(export_dir)
    problems: list[Problem] = []

    def problem(code: str, message: str, path: Path, episode: int | None = None) -> None:
        # The message is what the CLI prints: it starts with the file (and episode) it is about.
        where = f"{path}: episode {episode}" if episode is not None else str(path)
        problems.append(
            Problem(code=code, message=f"{where}: {message}", path=str(path), episode=episode)
        )

    info_path = root / layout.INFO
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        locators = read_episode_locators(root).to_pylist()
        tasks = pq.read_table(root / TASKS_PARQUET)
    except (OSError, ValueError, pa.ArrowException, DatasetError) as e:
        problem("unreadable_meta", f"cannot read metadata: {e}", root / layout.META_DIR)
        return problems
    if info.get("codebase_version") != CODEBASE_VERSION:
        problem("wrong_version", f"codebase_version {info.get('codebase_version')!r}", info_path)
    if info.get("dataset_format") != DATASET_FORMAT:
        problem("wrong_format", f"dataset_format {info.get('dataset_format')!r}", info_path)
    fps = float(info.get("fps") or 0)
    features = info.get("features", {})
    video_keys, refused = layout.safe_video_keys(features)
    for e in refused:
        problem("video_key", str(e), info_path)
    data_tpl = info.get("data_path") or DATA_PATH
    video_tpl = info.get("video_path") or VIDEO_PATH
    # The templates are input: only plain {field} / {field:03d} replacements that format, and
    # no literal text leading out of the export (``../``).
    try:
        for tpl, sample in (
            (data_tpl, {"chunk_index": 0, "file_index": 0}),
            (video_tpl, {"video_key": "key", "chunk_index": 0, "file_index": 0}),
        ):
            rel = os.path.normpath(layout.format_path_template(tpl, **sample))
            if os.path.isabs(rel) or rel.split(os.sep, 1)[0] == os.pardir:
                raise layout.UnsafeNameError(f"path template {tpl!r} leads outside {root}")
    except layout.UnsafeNameError as e:
        problem("unsafe_path_template", str(e), info_path)
        return problems
    n_eps = len(locators)
    if [r.get("episode_index") for r in locators] != list(range(n_eps)):
        problem("episode_numbering", "meta/episodes rows are not episodes 0..n-1 in order", root)
    if info.get("total_episodes") != n_eps:
        problem(
            "total_episodes",
            f"info says {info.get('total_episodes')}, meta/episodes has {n_eps}",
            info_path,
        )
    total_len = sum(int(r.get("length") or 0) for r in locators)
    if info.get("total_frames") != total_len:
        problem(
            "total_frames",
            f"info says {info.get('total_frames')}, episode lengths sum to {total_len}",
            info_path,
        )
    if info.get("total_tasks") != tasks.num_rows:
        problem(
            "total_tasks",
            f"info says {info.get('total_tasks')}, tasks.parquet has {tasks.num_rows}",
            info_path,
        )
    if b"pandas" not in (tasks.schema.metadata or {}):
        problem(
            "tasks_index", "tasks.parquet lacks the pandas index metadata", root / TASKS_PARQUET
        )

    # Data: every file the locators name, rows of its episodes in order.
    data_cache: dict[tuple[int, int], pa.Table | None] = {}
    file_start: dict[tuple[int, int], int] = {}
    expected_index = 0
    for ep, row in enumerate(locators):
        key = (int(row["data/chunk_index"]), int(row["data/file_index"]))
        path = root / data_tpl.format(chunk_index=key[0], file_index=key[1])
        if key not in data_cache and not layout.is_within(path, root):
            data_cache[key] = None  # a symlink out of the export: not followed
            problem("unsafe_path", "leads outside the export", path, ep)
            file_start[key] = int(row["dataset_from_index"])
        if key not in data_cache:
            try:
                # Only the columns checked here: a data shard can be ~100 MB of other features.
                wanted = ("episode_index", "index", "frame_index", "timestamp", STATE, ACTION)
                names = set(pq.read_schema(path).names)
                data_cache[key] = pq.read_table(path, columns=[c for c in wanted if c in names])
            except (OSError, pa.ArrowException) as e:
                data_cache[key] = None
                problem("unreadable_parquet", f"cannot read: {e}", path, ep)
            file_start[key] = int(row["dataset_from_index"])
        table = data_cache[key]
        start, stop = int(row["dataset_from_index"]), int(row["dataset_to_index"])
        n = int(row["length"])
        if start != expected_index or stop - start != n or n <= 0:
            problem(
                "row_range",
                f"range [{start}, {stop}) does not follow {expected_index} with length {n}",
                path,
                ep,
            )
        expected_index = stop
        if table is None:
            continue
        offset = start - file_start[key]
        part = table.slice(offset, n)
        if part.num_rows != n:
            problem(
                "row_range", f"file has {table.num_rows} rows, range needs {offset + n}", path, ep
            )
            continue
        cols = {
            c: part.column(c).to_numpy()
            for c in ("episode_index", "index", "frame_index", "timestamp")
            if c in part.column_names
        }
        if len(cols) < 4:
            problem(
                "missing_column",
                "episode_index/index/frame_index/timestamp column missing",
                path,
                ep,
            )
            continue
        if not (cols["episode_index"] == ep).all():
            problem(
                "episode_index_column", f"rows [{start}, {stop}) are not all episode {ep}", path, ep
            )
        if not np.array_equal(cols["index"], np.arange(start, stop)):
            problem("index_column", f"index is not {start}..{stop - 1}", path, ep)
        if not np.array_equal(cols["frame_index"], np.arange(n)):
            problem("frame_index_column", f"frame_index is not 0..{n - 1}", path, ep)
        ts = cols["timestamp"].astype(np.float64)
        if fps and np.abs(ts - np.arange(n) / fps).max() > TIMESTAMP_TOLERANCE_S:
            problem("timestamp_column", "timestamps are not frame_index / fps", path, ep)
        for name in (STATE, ACTION):
            if name in features:
                if name not in part.column_names:
                    problem("missing_column", f"column {name!r} missing", path, ep)
                    continue
                value = np.asarray(part.column(name)[0].as_py(), dtype=np.float64).reshape(-1)
                if list(value.shape) != [int(np.prod(features[name].get("shape", [value.size])))]:
                    problem("bad_value", f"{name} has {value.size} values", path, ep)
    rows_used: dict[tuple[int, int], int] = {}
    for r in locators:
        key = (int(r["data/chunk_index"]), int(r["data/file_index"]))
        rows_used[key] = rows_used.get(key, 0) + int(r["length"])
    for key, table in data_cache.items():
        if table is None:
            continue
        used = rows_used[key]
        if table.num_rows != used:
            path = root / data_tpl.format(chunk_index=key[0], file_index=key[1])
            problem("row_count", f"{table.num_rows} rows, its episodes account for {used}", path)

    # Videos: per camera and shard, episodes abut from 0, the sample count equals their rows,
    # and one frame per episode decodes at from_timestamp.
    for cam in video_keys:
        shards: dict[tuple[int, int], list[int]] = {}
        for ep, row in enumerate(locators):
            try:
                key = (int(row[f"videos/{cam}/chunk_index"]), int(row[f"videos/{cam}/file_index"]))
            except (KeyError, TypeError):
                problem("missing_locator", f"camera {cam!r}: no video locator", root, ep)
                continue
            shards.setdefault(key, []).append(ep)
        shape = tuple(features[cam].get("shape", ()))
        for key, eps in shards.items():
            path = root / video_tpl.format(video_key=cam, chunk_index=key[0], file_index=key[1])
            if not layout.is_within(path, root):
                problem("unsafe_path", "leads outside the export", path, eps[0])
                continue
            try:
                shard = probe(path)
            except VideoConcatError as e:
                problem("unreadable_video", f"camera {cam!r}: {e}", path, eps[0])
                continue
            want = sum(int(locators[ep]["length"]) for ep in eps)
            if shard.frames != want:
                problem(
                    "frame_count",
                    f"camera {cam!r}: {shard.frames} frames, its episodes have {want} rows",
                    path,
                )
            expected_from = 0.0
            for ep in eps:
                row = locators[ep]
                t0, t1 = (
                    float(row[f"videos/{cam}/from_timestamp"]),
                    float(row[f"videos/{cam}/to_timestamp"]),
                )
                n = int(row["length"])
                # Episodes follow each other; a B-frame stream's reorder delay (at most 16
                # frames in H.264) leaves a gap.
                max_gap = 16 / fps if fps else 1.0
                if not expected_from - TIMESTAMP_TOLERANCE_S <= t0 <= expected_from + max_gap:
                    problem(
                        "timestamp_range",
                        f"camera {cam!r}: starts at {t0:.6f} s, previous episode ends at {expected_from:.6f} s",
                        path,
                        ep,
                    )
                if fps and abs((t1 - t0) - n / fps) > TIMESTAMP_TOLERANCE_S:
                    problem(
                        "timestamp_range",
                        f"camera {cam!r}: [{t0:.6f}, {t1:.6f}) s holds {(t1 - t0) * fps:.3f} frames, not {n}",
                        path,
                        ep,
                    )
                expected_from = t1
                try:
                    found = _first_frame_at(path, t0)
                except Exception as e:  # noqa: BLE001 - any decoder failure is a verification problem
                    problem(
                        "unreadable_video",
                        f"camera {cam!r}: cannot decode at {t0:.6f} s: {e}",
                        path,
                        ep,
                    )
                    continue
                if found is None or abs(found[0] - t0) > TIMESTAMP_TOLERANCE_S:
                    problem("frame_lookup", f"camera {cam!r}: no frame at {t0:.6f} s", path, ep)
                elif len(shape) == 3 and found[1].shape != shape:
                    problem(
                        "frame_shape",
                        f"camera {cam!r}: frame shape {found[1].shape} != {shape}",
                        path,
                        ep,
                    )
    return problems
