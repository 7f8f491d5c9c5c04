"""A v3 subset cut into shard tasks: which episodes go into which data and video file, planned
in the driver from the source files before anything is written.

The plan reads only what the source files say of themselves: each episode's parquet size and
Arrow schema (its footer) and each MP4's size and stream parameters (its sample entry; FFmpeg
only once per distinct configuration, ``ParamsCache``). So the shards are the same whichever
executor writes them, and whatever order the tasks finish in:

* data: a file takes consecutive episodes while their source parquet files together stay within
  ``data_files_size_in_mb``, and only episodes of one schema; the next episode starts a new file;
* video, per camera: a file takes consecutive episodes of one data file while their source MP4s
  together stay within ``video_files_size_in_mb``, and only episodes whose stream parameters
  are compatible (one sample description per packet-copied MP4);
* ``file_index`` counts to ``chunks_size - 1`` and then wraps to 0 in the next chunk folder.

Every file is one task (``ShardTask``): a data file's task reads, renumbers and writes its
episodes' rows and computes their vector quantiles; a video file's task packet-copies its
episodes' MP4s and computes their pixel histograms. A task is a pure function of its fields and
the source's files; the driver merges the results (``eva.formats.lerobot_v3.writer``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.fsafe import FileBeneath
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta
from eva.formats.base import ExportOptions
from eva.formats.lerobot_v3.tables import DATA_PATH, MB, VIDEO_PATH, next_file
from eva.formats.lerobot_v3.video import EpisodeVideo, ParamsCache, StreamParams, VideoConcatError
from eva.formats.options import LeRobotV3Options
from eva.formats.tasks import EpisodeTask, subset_episode_tasks


@dataclass(frozen=True)
class ShardTask:
    """One output file of a v3 subset: a data file (``camera`` None) or one camera's video
    file, with the episodes it holds, in output order (``eva.formats.tasks.ExportTask``)."""

    source: Path
    subset: str
    label: str
    subset_dir: Path
    path: str  # the file, relative to ``subset_dir``
    chunk_index: int
    file_index: int
    camera: str | None  # None: the data file
    episodes: tuple[EpisodeTask, ...]
    # per episode, its stats from the subset (data files: the quantiles are added to them)
    stats: tuple[Mapping[str, Any], ...]
    tasks: Mapping[int, str]  # the subset's task table (rows that do not list their tasks)
    features: Mapping[str, Any]
    sample_keyframes: bool  # decode a keyframe sample for the image histograms
    options: ExportOptions
    other_files: tuple[str, ...] = ()
    # what the incremental fingerprint adds to the episodes' own: everything above that the
    # file depends on and an episode's fingerprint does not cover
    layout: Mapping[str, object] = field(default_factory=dict)


@dataclass
class OpenFile:
    """A file being planned: its number and the episodes given to it so far."""

    chunk_index: int = 0
    file_index: int = 0
    episodes: list[int] = field(default_factory=list)
    size: int = 0
    key: object = None  # data: the Arrow schema; video: the stream parameters

    def roll(self, chunks_size: int) -> None:
        self.chunk_index, self.file_index = next_file(
            self.chunk_index, self.file_index, chunks_size
        )
        self.episodes, self.size = [], 0


def source_video(
    file: FileBeneath, source: int, key: str, cache: ParamsCache
) -> tuple[int, StreamParams]:
    """The episode MP4's size and stream parameters (no decoding), read from the file opened
    beneath the dataset root."""
    try:
        with EpisodeVideo(file, cache) as video:
            return video.info.size_bytes, video.info.params
    except VideoConcatError as e:
        raise DatasetError(f"episode {source}, camera {key}: {e}") from None


def plan_subset(
    reader: DatasetReader, meta: SubsetMeta, subset_dir: Path, options: ExportOptions
) -> list[ShardTask]:
    """The subset's files as tasks: each data file, then the video files of its episodes per
    camera, in output order."""
    settings = options.format_options(LeRobotV3Options)
    video_keys = [layout.check_video_key(key) for key in meta.video_keys]
    episodes = subset_episode_tasks(
        reader,
        meta,
        subset_dir,
        options,
        lambda new, _chunks: DATA_PATH,
        "{subset} episode {index} (source episode {source_index})",
    )
    data_files = plan_data(reader, episodes, settings)
    cameras = {key: plan_videos(reader, episodes, data_files, key, settings) for key in video_keys}
    recorded = bool(video_keys) and meta.has_all_image_histograms()
    sample = not recorded and not settings.verify_decode and settings.image_quantiles == "keyframes"
    tasks, features = dict(meta.tasks), dict(meta.info.get("features", {}))
    planned: list[tuple[int, int, ShardTask]] = []
    for order, (camera, files) in enumerate([(None, data_files), *cameras.items()]):
        for chunk_index, file_index, members in files:
            template = DATA_PATH if camera is None else VIDEO_PATH
            path = template.format(video_key=camera, chunk_index=chunk_index, file_index=file_index)
            # a data file holds its episodes' stats (its rows carry them); a video file depends
            # on whether it samples keyframes
            stats = tuple(meta.episodes_stats.get(i, {}) for i in members) if not camera else ()
            depends: dict[str, object] = {"file": path, "episodes": members}
            depends |= {"stats": _digest(stats)} if not camera else {"sample_keyframes": sample}
            task = ShardTask(
                source=Path(reader.root),
                subset=meta.subset,
                label=f"{meta.subset} episodes {members[0]}-{members[-1]} ({path})",
                subset_dir=Path(subset_dir),
                path=path,
                chunk_index=chunk_index,
                file_index=file_index,
                camera=camera,
                episodes=tuple(episodes[i] for i in members),
                stats=stats,
                tasks=tasks,
                features=features,
                sample_keyframes=sample,
                options=options,
                layout=depends,
            )
            planned.append((members[0], order, task))
    return [task for _, _, task in sorted(planned, key=lambda p: (p[0], p[1]))]


def plan_data(
    reader: DatasetReader, episodes: list[EpisodeTask], settings: LeRobotV3Options
) -> list[tuple[int, int, list[int]]]:
    """Each data file: (chunk, file, its output episodes)."""
    limit = settings.data_files_size_in_mb * MB
    files: list[tuple[int, int, list[int]]] = []
    current = OpenFile()
    for task in episodes:
        size, schema = reader.read_schema(task.source_index)  # opened beneath the root
        if current.episodes and (current.size + size > limit or not schema.equals(current.key)):
            files.append((current.chunk_index, current.file_index, current.episodes))
            current.roll(settings.chunks_size)
        current.episodes.append(task.index)
        current.size += size
        current.key = schema
    if current.episodes:
        files.append((current.chunk_index, current.file_index, current.episodes))
    return files


def plan_videos(
    reader: DatasetReader,
    episodes: list[EpisodeTask],
    data_files: list[tuple[int, int, list[int]]],
    key: str,
    settings: LeRobotV3Options,
) -> list[tuple[int, int, list[int]]]:
    """Camera ``key``'s video files: (chunk, file, its output episodes)."""
    limit = settings.video_files_size_in_mb * MB
    starts_data = {members[0] for _, _, members in data_files}
    cache = ParamsCache()
    files: list[tuple[int, int, list[int]]] = []
    current = OpenFile()
    for task in episodes:
        src = task.source_index
        size, params = source_video(reader.video_file(src, key), src, key, cache)
        if current.episodes and (
            task.index in starts_data
            or current.size + size > limit
            or not isinstance(current.key, StreamParams)
            or not params.compatible_with(current.key)
        ):
            files.append((current.chunk_index, current.file_index, current.episodes))
            current.roll(settings.chunks_size)
        if not current.episodes:
            current.key = params  # the file's stream: its first episode's
        current.episodes.append(task.index)
        current.size += size
    if current.episodes:
        files.append((current.chunk_index, current.file_index, current.episodes))
    return files


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
