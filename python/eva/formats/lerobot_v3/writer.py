"""The v3 subset: planned into shard tasks (``plan``), written by them (``shard_tasks``), and
finished here, in the driver, from their results: the ``meta/episodes`` rows with their image
quantiles, the dataset-wide quantiles, the metadata files (see ``eva.formats.lerobot_v3``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from eva.dataset import layout
from eva.dataset.errors import DatasetError, naming_write_errors
from eva.dataset.stats import DEFAULT_QUANTILES, quantiles_from_histogram
from eva.dataset.subset import SubsetMeta, write_common_meta, write_staged_json
from eva.formats.base import ExportOptions
from eva.formats.lerobot_v3.plan import ShardTask, plan_subset
from eva.formats.lerobot_v3.shard_tasks import ShardResult, open_shard_writer
from eva.formats.lerobot_v3.shards import QuantileCollector, column_matrix, numeric_vector_columns
from eva.formats.lerobot_v3.tables import (
    EPISODES_PATH,
    TASKS_PARQUET,
    episodes_table,
    tasks_table,
    v3_info,
    write_empty_data,
    write_parquet,
)
from eva.formats.options import LeRobotV3Options
from eva.formats.tasks import EpisodeResult, TaskFunctions
from eva.progress import ProgressSink


def finish_subset(
    meta: SubsetMeta,
    subset_dir: Path,
    results: Sequence[EpisodeResult],
    progress: ProgressSink,
    options: ExportOptions,
) -> None:
    """After every file of the subset (``results`` in task order): the ``meta/episodes``
    table, ``tasks.parquet``, info.json, stats.json with the quantiles, the common metadata."""
    settings = options.format_options(LeRobotV3Options)
    root = Path(subset_dir)
    root.mkdir(parents=True, exist_ok=True)
    features: dict[str, Any] = meta.info.get("features", {})
    video_keys = list(meta.video_keys)
    shards = [r for r in results if isinstance(r, ShardResult)]
    rows = {int(row["episode_index"]): dict(row) for r in shards for row in r.rows}
    histograms: dict[str, dict[int, np.ndarray]] = {key: {} for key in video_keys}
    for result in shards:
        key = video_key_of(result.path, video_keys)
        for episode, start, end in result.placed:
            chunk_index, file_index = file_numbers(result.path)
            rows[episode].update(
                {
                    f"videos/{key}/chunk_index": chunk_index,
                    f"videos/{key}/file_index": file_index,
                    f"videos/{key}/from_timestamp": start,
                    f"videos/{key}/to_timestamp": end,
                }
            )
        if key is not None:
            histograms[key].update(result.histograms)
    if sorted(rows) != list(range(meta.total_episodes)):
        raise DatasetError(f"{root}: the shard results do not cover the subset's episodes")
    data_files = [r for r in shards if video_key_of(r.path, video_keys) is None]
    quantiles = data_quantiles(root, data_files, features)
    # Image quantiles are exact when recorded by eva (no decode), else from the decoded sample.
    recorded = bool(video_keys) and meta.has_all_image_histograms()
    episode_rows = []
    for episode in range(meta.total_episodes):
        row = rows[episode]
        ep_stats = {k: dict(v) for k, v in row.pop("stats").items()}
        for key in video_keys:
            hist = meta.image_histograms[episode][key] if recorded else histograms[key].get(episode)
            if hist is None or int(hist.sum()) == 0:
                continue
            quantiles.add_histogram(key, hist)
            if key in ep_stats:
                ep_stats[key].update(quantiles_from_histogram(hist, DEFAULT_QUANTILES))
        for feature, stat in ep_stats.items():
            for stat_name, value in stat.items():
                row[f"stats/{feature}/{stat_name}"] = value
        episode_rows.append(row)

    if meta.total_episodes == 0:
        write_empty_data(root, features)
    episodes_path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(episodes_table(episode_rows, video_keys), episodes_path)
    with naming_write_errors(root / TASKS_PARQUET):
        pq.write_table(tasks_table(meta.tasks), root / TASKS_PARQUET)

    write_common_meta(root, meta, v3_info(meta, settings))
    stats = {k: dict(v) for k, v in meta.stats.items()}
    for feature, q in quantiles.quantiles().items():
        if feature in stats:
            stats[feature].update(q)
    write_staged_json(root / layout.STATS, stats)
    progress(files=4)


def data_quantiles(
    root: Path, data_files: Sequence[ShardResult], features: Mapping[str, Any]
) -> QuantileCollector:
    """Every numeric vector column of the data files, in episode order, for the exact
    dataset-wide quantiles: read back from the files (written or reused alike), so that no
    task sends its rows' values to the driver."""
    quantiles = QuantileCollector()
    for result in data_files:
        path = root / result.path
        with pq.ParquetFile(path) as parquet:
            names = numeric_vector_columns(parquet.schema_arrow.empty_table(), features)
            table = parquet.read(columns=names, use_threads=False)
        for name in names:
            quantiles.add_vectors(name, column_matrix(table, name, str(path)))
    return quantiles


def video_key_of(path: str, video_keys: Sequence[str]) -> str | None:
    """The camera of a video file's path (None: a data file)."""
    return next((k for k in video_keys if path.startswith(f"videos/{k}/")), None)


def file_numbers(path: str) -> tuple[int, int]:
    """(chunk_index, file_index) of a planned file's path."""
    chunk, name = path.rsplit("/", 2)[-2:]
    return int(chunk.removeprefix("chunk-")), int(name.removeprefix("file-").split(".")[0])


# The v3 format's tasks (``eva.formats.tasks.TaskFormat``): one per planned data or video file,
# run by any executor; the driver finishes each subset. The default executor stays serial: the
# files are packet copies, and a pool's start costs more than it saves. Two files at a time on
# threads there: a video file's writes wait on the disk (GIL released) while the data file's
# tables are built.
SERIAL_THREADS = 2
TASKS: TaskFunctions[ShardTask] = TaskFunctions(
    plan_subset,
    open_shard_writer,
    finish_subset,
    ShardResult.from_record,
    pool_from_cores=1 << 30,
    serial_threads=SERIAL_THREADS,
)
write_subset = TASKS.write_subset
