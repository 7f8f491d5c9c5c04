"""``write_subset`` of the v3.0 format: one episode at a time into the shards (see ``eva.formats.lerobot_v3``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import layout
from eva.dataset.columns import distinct_scalars
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.stats import (
    DEFAULT_QUANTILES,
    quantiles_from_histogram,
)
from eva.dataset.subset import (
    SubsetMeta,
    rewrite_index_columns,
    write_common_meta,
    write_staged_json,
)
from eva.formats.base import ExportOptions
from eva.formats.lerobot_v3.mux import VideoShardWriter
from eva.formats.lerobot_v3.shards import (
    CameraShards,
    DataShards,
    KeyframeHistograms,
    PlacedEpisode,
    QuantileCollector,
    column_matrix,
    episode_quantiles,
    numeric_vector_columns,
)
from eva.formats.lerobot_v3.tables import (
    EPISODES_PATH,
    MB,
    TASKS_PARQUET,
    episodes_table,
    tasks_table,
    v3_info,
    write_empty_data,
    write_parquet,
)
from eva.formats.lerobot_v3.video import EpisodeVideo, ParamsCache, VideoConcatError
from eva.formats.options import LeRobotV3Options
from eva.progress import ProgressSink

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

    data = DataShards(root, settings, progress)
    cameras = {key: CameraShards(key, root, settings, progress) for key in video_keys}
    quantiles = QuantileCollector()
    episode_rows: list[dict[str, Any]] = []
    keyframe_pool = KeyframeHistograms()
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
            for name in numeric_vector_columns(table, features):
                values = column_matrix(table, name, where)
                quantiles.add_vectors(name, values)
                if name in ep_stats:
                    episode_vectors[name] = values
            for name, q in episode_quantiles(episode_vectors).items():
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
        write_empty_data(root, features)

    episodes_path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(episodes_table(episode_rows, video_keys), episodes_path)
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


def _episode_row(meta: SubsetMeta, ep: int, table: pa.Table, data: DataShards) -> dict[str, Any]:
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
    cam: CameraShards,
    data_rolled: bool,
    settings: LeRobotV3Options,
    keyframe_pool: KeyframeHistograms,
    params_cache: ParamsCache | None = None,
    sample_keyframes: bool = True,
) -> PlacedEpisode:
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
            or writer.payload_bytes + info.size_bytes > settings.video_files_size_in_mb * MB
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
    placed = PlacedEpisode(ep, appended.from_timestamp, appended.to_timestamp, rows)
    cam.placed.append(placed)
    if keyframes:  # already the spread sample (append's keyframe_limit)
        cam.pending[ep] = keyframe_pool.submit(info.params, keyframes)
    return placed
