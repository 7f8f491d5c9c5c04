"""Writing one planned v3 file (``eva.formats.lerobot_v3.plan.ShardTask``) in a worker: a data
file from its episodes' tables, or one camera's video file from its episodes' MP4s. What the
driver needs to finish the subset travels back in the ``ShardResult``."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset.columns import distinct_scalars
from eva.dataset.errors import DatasetError, naming_write_errors
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import rewrite_index_columns
from eva.dataset.subset_edits import trim_table
from eva.formats._training_video import TrainingEncoder, TrainingEncoding, training_encoding
from eva.formats.base import ExportOptions
from eva.formats.lerobot_v3.mux import VideoShardWriter
from eva.formats.lerobot_v3.plan import ShardTask
from eva.formats.lerobot_v3.shards import (
    KeyframeHistograms,
    PlacedEpisode,
    column_matrix,
    decode_shard,
    episode_quantiles,
    numeric_vector_columns,
)
from eva.formats.lerobot_v3.tables import DICTIONARY_COLUMNS, to_plain
from eva.formats.lerobot_v3.video import EpisodeVideo, ParamsCache, VideoConcatError
from eva.formats.options import LeRobotV3Options
from eva.formats.tasks import EpisodeResult, EpisodeTask, ExportTask


@dataclass(frozen=True)
class ShardResult(EpisodeResult):
    """A written v3 file: a data file's episode rows (locators, tasks and stats with their
    vector quantiles, under ``"stats"``), or a video file's episodes as (episode, from, to)
    seconds with their pixel histograms (sampled or decoded; none when the source's recorded
    ones are used)."""

    rows: tuple[Mapping[str, Any], ...] = ()
    placed: tuple[tuple[int, float, float], ...] = ()
    histograms: Mapping[int, np.ndarray] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        # one compact string: the record is indented JSON, and these are long number lists
        shard = {
            "rows": [to_plain(dict(row)) for row in self.rows],
            "placed": [list(p) for p in self.placed],
            "histograms": {str(ep): h.tolist() for ep, h in self.histograms.items()},
        }
        return {**super().record(), "shard": json.dumps(shard, separators=(",", ":"))}

    @classmethod
    def from_record(cls, task: ExportTask, entry: Mapping[str, Any]) -> ShardResult:
        base = EpisodeResult.from_record(task, entry)
        shard = json.loads(str(entry["shard"]))
        return cls(
            base.subset,
            base.index,
            base.path,
            base.bytes,
            base.current,
            base.warnings,
            base.counted,
            base.episodes,
            base.files,
            rows=tuple(shard["rows"]),
            placed=tuple((int(e), float(a), float(b)) for e, a, b in shard["placed"]),
            histograms={
                int(ep): np.asarray(h, dtype=np.uint64) for ep, h in shard["histograms"].items()
            },
        )


class ShardSession:
    """A worker's session (``eva.formats.base.EpisodeWriterSession``): one source reader, one
    cache of stream parameters and the keyframe decoding threads, for every file it writes."""

    def __init__(self, reader: DatasetReader, options: ExportOptions) -> None:
        self.reader = reader
        self.settings = options.format_options(LeRobotV3Options)
        self.params_cache = ParamsCache()
        self.keyframes: KeyframeHistograms | None = None
        self._lock = threading.Lock()  # the serial executor writes SERIAL_THREADS files at once

    def write(self, task: ShardTask) -> ShardResult:
        if task.camera is None:
            return write_data_file(self.reader, task)
        with self._lock:
            if self.keyframes is None:
                self.keyframes = KeyframeHistograms()
            keyframes = self.keyframes
        encoding = training_encoding(self.settings)
        if encoding is not None:
            return write_training_video_file(self.reader, task, self.settings, encoding)
        return write_video_file(self.reader, task, self.settings, self.params_cache, keyframes)

    def close(self) -> None:
        with self._lock:
            keyframes, self.keyframes = self.keyframes, None
        if keyframes is not None:
            keyframes.shutdown()


def open_shard_writer(reader: DatasetReader, options: ExportOptions) -> ShardSession:
    return ShardSession(reader, options)


def written(task: ShardTask, **fields: Any) -> ShardResult:
    """The result of ``task``'s file, now written."""
    size = (task.subset_dir / task.path).stat().st_size
    current = f"{task.subset}/{task.path}"
    return ShardResult(task.subset, task.episodes[0].index, task.path, size, current, **fields)


# ---- data files ---------------------------------------------------------------------------------


def write_data_file(reader: DatasetReader, task: ShardTask) -> ShardResult:
    """The data file's rows (renumbered), written with one ``write_table``; each episode's row
    of ``meta/episodes`` with its vector quantiles."""
    tables: list[pa.Table] = []
    rows: list[dict[str, Any]] = []
    for episode, stats in zip(task.episodes, task.stats, strict=True):
        table = episode_table(reader, episode)
        where = f"{reader.data_path(episode.source_index)}: episode {episode.source_index}"
        rows.append(episode_row(task, episode, table, stats, where))
        tables.append(table.replace_schema_metadata(None))
    path = task.subset_dir / task.path
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.concat_tables(tables)
    # Dictionary pages only for the columns with few distinct values: pyarrow tries one for
    # every column by default, and on noisy float vectors that costs 10x the write (160 ms for
    # 16,000 rows) and gives a larger file.
    dictionary = [n for n in DICTIONARY_COLUMNS if n in table.column_names]
    with naming_write_errors(path):  # pyarrow's OSError names no file
        pq.write_table(table, path, compression="snappy", use_dictionary=dictionary)
    return written(task, episodes=len(task.episodes), rows=tuple(rows))


def episode_table(reader: DatasetReader, episode: EpisodeTask) -> pa.Table:
    source = episode.source_index
    table = reader.read_table(source)  # the one validation read, while the file is unchanged
    where = f"{reader.data_path(source)}: episode {source}"
    table = trim_table(table, episode.trim, episode.fps, where)
    n = table.num_rows
    if n == 0:
        raise DatasetError(f"{where}: empty episode (0 rows) cannot be exported")
    if n != episode.length:
        raise DatasetError(f"{where}: table has {n} rows, episodes.jsonl says {episode.length}")
    return rewrite_index_columns(
        table, episode.index, episode.index_offset, episode.task_remap, where=where
    )


def episode_row(
    task: ShardTask,
    episode: EpisodeTask,
    table: pa.Table,
    stats: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """The episode's ``meta/episodes`` row, without its video locators: its stats under
    ``"stats"``, its vectors' quantiles added."""
    tasks = episode.row.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        used = distinct_scalars(table.column("task_index"))
        tasks = [task.tasks[i] for i in sorted(used)]
    start = episode.index_offset
    ep_stats = {k: dict(v) for k, v in stats.items()}
    vectors = {
        name: column_matrix(table, name, where)
        for name in numeric_vector_columns(table, task.features)
        if name in ep_stats
    }
    for name, q in episode_quantiles(vectors).items():
        ep_stats[name].update(q)
    return {
        "episode_index": episode.index,
        "tasks": tasks,
        "length": table.num_rows,
        "data/chunk_index": task.chunk_index,
        "data/file_index": task.file_index,
        "dataset_from_index": start,
        "dataset_to_index": start + table.num_rows,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
        "stats": ep_stats,
    }


# ---- video files --------------------------------------------------------------------------------


def write_video_file(
    reader: DatasetReader,
    task: ShardTask,
    settings: LeRobotV3Options,
    params_cache: ParamsCache,
    keyframes: KeyframeHistograms,
) -> ShardResult:
    """The camera's episodes packet-copied into one MP4, their frames counted; their pixel
    histograms from the keyframe sample (decoded in threads meanwhile) or, with
    ``verify_decode``, from every frame of the finished file."""
    key = task.camera
    assert key is not None
    path = task.subset_dir / task.path
    writer = VideoShardWriter(path)
    placed: list[PlacedEpisode] = []
    keyframe_limit = settings.image_quantile_keyframes if task.sample_keyframes else None
    pending: dict[int, Future[np.ndarray]] = {}
    try:
        for episode in task.episodes:
            placed.append(append_video(reader, episode, key, writer, keyframe_limit, params_cache))
            sample = placed[-1].keyframes
            if sample is not None and sample[1]:  # already the spread sample
                pending[episode.index] = keyframes.submit(*sample)
        writer.close()
        histograms = decode_shard(path, key, placed) if settings.verify_decode else {}
        for ep, future in pending.items():
            try:
                histograms[ep] = future.result()
            except (av.error.FFmpegError, ValueError) as e:
                raise DatasetError(
                    f"subset episode {ep}, camera {key}: keyframes do not decode ({e})"
                ) from None
    except BaseException:
        writer.abort()
        for future in pending.values():
            future.cancel()
        raise
    return written(
        task,
        episodes=0,  # the data file counts them
        placed=tuple((p.episode, p.from_timestamp, p.to_timestamp) for p in placed),
        histograms=histograms,
    )


def append_video(
    reader: DatasetReader,
    episode: EpisodeTask,
    key: str,
    writer: VideoShardWriter,
    keyframe_limit: int | None,
    params_cache: ParamsCache,
) -> PlacedEpisode:
    """Source episode's camera ``key`` appended to the file; the keyframes it kept on the way
    (the quantile sample: at most ``keyframe_limit``, 0 = all; None = no sample) come back
    with it."""
    source, rows = episode.source_index, episode.length
    src_file = reader.video_file(source, key)
    src_path = src_file.path
    try:
        video = EpisodeVideo(src_file, params_cache)
    except VideoConcatError as e:
        raise DatasetError(f"episode {source}, camera {key}: {e}") from None
    # a trimmed episode's shard holds every recorded frame: its from/to timestamps select the
    # kept ones (no re-encoding)
    trim = episode.trim
    raw_rows = episode.source_length if trim is not None and episode.source_length else rows
    rows = raw_rows
    with video:
        info = video.info
        if info.frames and info.frames != rows:
            raise DatasetError(
                f"{src_path}: episode {source}, camera {key}: holds {info.frames} frames, "
                f"the table has {rows} rows"
            )
        kept: list[bytes] | None = [] if keyframe_limit is not None else None
        try:
            appended = writer.append(video, kept, keyframe_limit or 0)
        except VideoConcatError as e:
            raise DatasetError(f"episode {source}, camera {key}: {e}") from None
    if appended.packets != rows:
        raise DatasetError(
            f"{src_path}: episode {source}, camera {key}: holds {appended.packets} frames, "
            f"the table has {rows} rows"
        )
    sample = (info.params, kept) if kept is not None else None
    start, end = appended.from_timestamp, appended.to_timestamp
    if trim is not None:
        # frame k of the episode is shown at start + k * (end - start) / frames: the kept
        # frames' span (LeRobot decodes frame i at from_timestamp + i / fps)
        frame = (end - start) / raw_rows
        start, end = start + trim[0] * frame, start + trim[1] * frame
    return PlacedEpisode(
        episode.index, start, end, episode.length, sample, cut=raw_rows - episode.length
    )


def write_training_video_file(
    reader: DatasetReader, task: ShardTask, settings: LeRobotV3Options, encoding: TrainingEncoding
) -> ShardResult:
    """The training profile's video file: the camera's episodes re-encoded into one stream
    (``eva.formats._training_video``), a trimmed one's kept frames only; frame ``k`` of the file
    at ``k / fps``. Pixel histograms, when wanted, from every frame of the finished file."""
    key = task.camera
    assert key is not None
    path = task.subset_dir / task.path
    path.parent.mkdir(parents=True, exist_ok=True)
    fps = task.episodes[0].fps or reader.fps
    encoder = TrainingEncoder(path, encoding, fps)
    placed: list[PlacedEpisode] = []
    try:
        for episode in task.episodes:
            source = episode.source_index
            recorded = episode.source_length if episode.trim is not None else None
            start = encoder.frames
            try:
                frames = encoder.add_episode(
                    reader.video_file(source, key), episode.trim, recorded or episode.length
                )
            except DatasetError as e:
                raise DatasetError(f"episode {source}, camera {key}: {e}") from None
            placed.append(PlacedEpisode(episode.index, start / fps, encoder.frames / fps, frames))
        encoder.close()
    except BaseException:
        encoder.abort()
        raise
    wanted = settings.verify_decode or task.sample_keyframes
    histograms = decode_shard(path, key, placed) if wanted else {}
    return written(
        task,
        episodes=0,  # the data file counts them
        placed=tuple((p.episode, p.from_timestamp, p.to_timestamp) for p in placed),
        histograms=histograms,
    )
