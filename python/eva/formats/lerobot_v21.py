"""Native LeRobot v2.1 exporter: the quality subset as a v2.1 dataset, at close to file-copy cost.

- Parquet: each episode table is read once. When its ``episode_index`` / ``index`` /
  ``task_index`` values are already the output's (an episode that keeps its place, as every
  episode of an all-accepted export does), the file is shared like the MP4s below. Otherwise
  those columns are replaced column-wise (``eva.dataset.subset.rewrite_index_columns``), every other
  column and the schema metadata (LeRobot's ``huggingface`` features) are kept, and it is written
  under the renumbered path, without dictionary encoding: per-frame float data hardly repeats, so
  pyarrow's default dictionary attempt made the files ~25% larger and the write ~40% slower.
- MP4: the frames do not change, so no data is copied where that is safe
  (``eva.dataset.share.share_file``): a reflink (copy-on-write clone) where the filesystem has
  one; else a hard link, but only to a read-only raw file (the writer commits them 0444), so a
  consumer cannot write the raw evidence through the export; else a copy. Each source file is
  opened beneath the dataset root when it is shared (a link at any component refused, even
  one swapped in after validation) and the reflink, link or copy is made of that open file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import fsafe, layout
from eva.dataset.atomic import read_jsonl
from eva.dataset.embedded import read_export_meta
from eva.dataset.errors import DatasetError, naming_write_errors
from eva.dataset.reader import DatasetReader
from eva.dataset.share import share_file
from eva.dataset.subset import SubsetMeta, rewrite_index_columns
from eva.dataset.subset_edits import trim_table
from eva.dataset.validate import Problem
from eva.formats._decode import first_frame
from eva.formats._training_video import encode_episode, training_encoding, training_features
from eva.formats._verify import (
    VECTOR_FEATURES,
    ProblemCollector,
    check_frame,
    check_total,
    check_unreadable_meta,
    check_vectors,
    check_version,
)
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV21Options
from eva.formats.tasks import EpisodeFormat, EpisodeResult, EpisodeTask

FORMAT = "lerobot_v21"


def link_or_copy(src: fsafe.Readable, dest: Path, *, link: bool = True) -> str:
    """``dest`` gets ``src``'s bytes: "reflink", "link" (only of a read-only raw file) or
    "copy" (``eva.dataset.share.share_file``: of the file opened once, never a link)."""
    return share_file(src, dest, link=link)


def _numbering_unchanged(
    table: pa.Table, episode_index: int, index_offset: int, task_remap: Any
) -> bool:
    """Whether ``rewrite_index_columns`` would leave the table's values as they are: int64
    columns already holding the output episode index, the output global index and task indices
    the remap keeps."""
    n = table.num_rows
    for name in ("episode_index", "index"):
        if table.schema.get_field_index(name) < 0 or table.schema.field(name).type != pa.int64():
            return False
    episode = table.column("episode_index").to_numpy()
    index = table.column("index").to_numpy()
    if not (episode == episode_index).all():
        return False
    if not np.array_equal(index, np.arange(index_offset, index_offset + n, dtype=np.int64)):
        return False
    if table.schema.get_field_index("task_index") >= 0:
        if table.schema.field("task_index").type != pa.int64():
            return False
        column = table.column("task_index")
        if column.null_count:
            return False
        tasks = set(column.to_numpy().tolist())  # (np.unique would import numpy.ma: ~35 ms)
        if any(task_remap.get(int(t)) != int(t) for t in tasks):
            return False
    return True


def export_info(meta: SubsetMeta, options: ExportOptions | None = None) -> dict[str, Any]:
    info = dict(meta.info)
    info["codebase_version"] = layout.CODEBASE_VERSION
    info["data_path"] = layout.DATA_PATH
    info["video_path"] = layout.VIDEO_PATH if meta.video_keys else None
    info.pop("dataset_format", None)
    settings = options.format_options(LeRobotV21Options) if options else LeRobotV21Options()
    encoding = training_encoding(settings)
    if encoding is not None:  # the cameras as re-encoded, their settings as LeRobot records them
        info["features"] = json.loads(json.dumps(info.get("features", {})))  # a deep copy
        training_features(info["features"], meta.video_keys, encoding)
    return info


def episode_path(index: int, chunks_size: int) -> str:
    return layout.DATA_PATH.format(
        episode_chunk=layout.episode_chunk(index, chunks_size), episode_index=index
    )


def episode_videos(index: int, chunks_size: int, video_keys: tuple[str, ...]) -> tuple[str, ...]:
    chunk = layout.episode_chunk(index, chunks_size)
    return tuple(
        layout.VIDEO_PATH.format(
            episode_chunk=chunk, video_key=layout.check_video_key(key), episode_index=index
        )
        for key in video_keys
    )


def cut_video(source: fsafe.Readable, dest: Path, task: EpisodeTask, key: str) -> None:
    """A trimmed episode's MP4 of camera ``key``: only its kept frames ``task.trim``, cut by
    ``eva.dataset.video_cut.cut_episode_video`` (copied GOPs where it can, re-encoded at the
    cuts); its frame count is the kept rows'."""
    from eva.dataset.video_cut import cut_episode_video  # PyAV encoders: only when cutting

    assert task.trim is not None
    # in the staging directory: made durable with the pair, at publication
    cut_episode_video(source, dest, task.trim[0], task.trim[1], durable=False)


class EpisodeCopier:
    """A session (``eva.formats.base.EpisodeWriterSession``): stateless, so the serial
    executor's threads share it."""

    def __init__(self, reader: DatasetReader, options: ExportOptions) -> None:
        self.reader = reader
        settings = options.format_options(LeRobotV21Options)
        self.link = not settings.copy_videos
        self.encoding = training_encoding(settings)

    def write(self, task: EpisodeTask) -> EpisodeResult:
        """Output episode ``task.index``: its table, then its videos."""
        reader, src, new = self.reader, task.source_index, task.index
        src_file = reader.data_file(src)
        src_path = src_file.path
        table = reader.read_table(src)  # opened beneath the root; the validation's read reused
        table = trim_table(table, task.trim, task.fps, f"{src_path}: episode {src}")
        if table.num_rows == 0:
            raise DatasetError(f"{src_path}: episode {src}: empty episode (no rows)")
        if table.num_rows != task.length:
            raise DatasetError(
                f"{src_path}: episode {src}: {table.num_rows} rows but episodes.jsonl length "
                f"{task.length}"
            )
        dest = task.subset_dir / task.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if task.trim is None and _numbering_unchanged(
            table, new, task.index_offset, task.task_remap
        ):
            # Renumbering would write the same values (an episode that keeps its place, as in
            # an all-accepted export): the source file is shared like the MP4s, not rewritten.
            with naming_write_errors(dest):
                link_or_copy(src_file, dest, link=self.link)
        else:
            table = rewrite_index_columns(
                table, new, task.index_offset, task.task_remap, where=f"{src_path}: episode {src}"
            )
            with naming_write_errors(dest):  # a full disk names the file, not just ENOSPC
                pq.write_table(table, dest, use_dictionary=False)
        size = dest.stat().st_size
        for key, rel in zip(task.video_keys, task.other_files, strict=True):
            video_src = reader.video_file(src, key)
            if not video_src.path.is_file():
                raise DatasetError(f"{video_src}: episode {src}: camera {key!r}: video missing")
            video_dest = task.subset_dir / rel
            video_dest.parent.mkdir(parents=True, exist_ok=True)
            with naming_write_errors(video_dest):
                if self.encoding is not None:
                    recorded = task.source_length if task.trim is not None else None
                    fps = task.fps or reader.fps
                    frames = recorded or task.length
                    encode_episode(video_src, video_dest, self.encoding, fps, task.trim, frames)
                elif task.trim is None:
                    link_or_copy(video_src, video_dest, link=self.link)
                else:
                    cut_video(video_src, video_dest, task, key)
            size += video_dest.stat().st_size
        files = 1 + len(task.other_files)
        current = f"{task.subset} episode {new}"
        return EpisodeResult(task.subset, new, task.path, size, current, files=files)

    def close(self) -> None:
        pass


# The subset as one task per episode (its table and videos; eva.formats.tasks.EpisodeFormat).
# Episodes are small independent files, so the serial executor overlaps their I/O and parquet
# work on a few threads (pyarrow and the file syscalls release the GIL); a process pool's start
# costs more than it saves, so serial stays the default.
TASKS = EpisodeFormat(
    path=episode_path,
    label="{subset} episode {index} (source episode {source_index})",
    open_episode_writer=EpisodeCopier,
    check_options=lambda options: options.format_options(LeRobotV21Options),
    subset_info=lambda meta, options: export_info(meta, options),
    pool_from_cores=1 << 30,
    serial_threads=max(1, min(4, os.cpu_count() or 1)),
    other_files=episode_videos,
)
write_subset = TASKS.write_subset


def _count_frames(path: Path) -> int:
    from eva.dataset.video import count_frames

    return int(count_frames(path))


def _check_table(
    problem: ProblemCollector,
    root: Path,
    data: Path,
    ep: int,
    row: dict[str, Any],
    tasks: set[int],
    features: dict[str, Any],
    first_index: int,
) -> int | None:
    """Episode ``ep``'s table, whose global index starts at ``first_index``: its row count, or
    None when it cannot be read or has no rows (the videos are then not checked)."""
    if not data.is_file():
        problem("missing_parquet", "episode table missing", data, ep)
        return None
    if not layout.is_within(data, root):
        problem("unsafe_path", "a link leading outside the export (not read)", data, ep)
        return None
    try:
        with pq.ParquetFile(data) as parquet:
            table = parquet.read()
    except (OSError, pa.ArrowException) as e:
        problem("unreadable_parquet", f"cannot read: {e}", data, ep)
        return None
    n = int(table.num_rows)
    if n != row.get("length"):
        problem(
            "length_mismatch", f"{n} rows but episodes.jsonl length {row.get('length')}", data, ep
        )
    if n == 0:
        problem("empty_episode", "no rows", data, ep)
        return None
    col = table.column("episode_index").to_numpy()
    if not (col == ep).all():
        problem("episode_index_column", f"episode_index values differ from {ep}", data, ep)
    index = table.column("index").to_numpy()
    if not np.array_equal(index, np.arange(first_index, first_index + n)):
        problem("index_column", f"index is not contiguous from {first_index}", data, ep)
    unknown = set(np.unique(table.column("task_index").to_numpy()).tolist()) - tasks
    if unknown:
        problem("task_index_column", f"task_index {sorted(unknown)} not in tasks.jsonl", data, ep)
    # Real read: one state and one action value.
    first_values = {
        name: np.asarray(table.column(name)[0].as_py(), dtype=np.float32)
        for name in VECTOR_FEATURES
        if name in table.column_names
    }
    check_vectors(problem, features, first_values, data, ep)
    return n


def _check_video(
    problem: ProblemCollector,
    root: Path,
    video: Path,
    key: str,
    ep: int,
    rows: int,
    features: dict[str, Any],
) -> None:
    """Camera ``key``'s MP4 of episode ``ep``: inside the export, ``rows`` frames, and a first
    frame of the declared shape."""
    if not video.is_file():
        problem("missing_video", f"camera {key!r}: video missing", video, ep)
        return
    if not layout.is_within(video, root):
        problem("unsafe_path", f"camera {key!r}: a link leading outside the export", video, ep)
        return
    try:
        frames = _count_frames(video)
        frame = first_frame(video)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a verification problem
        problem("unreadable_video", f"camera {key!r}: cannot decode: {e}", video, ep)
        return
    if frames != rows:
        problem("frame_count", f"camera {key!r}: {frames} frames but {rows} rows", video, ep)
    check_frame(problem, key, frame, tuple(features[key].get("shape", ())), video, ep)


def verify(export_dir: Path) -> list[Problem]:
    """Totals against physical files, then a real read of one state, action and image frame
    per episode (pyarrow for the tables, PyAV for the MP4s)."""
    root = Path(export_dir)
    problem = ProblemCollector()
    try:
        info, episodes = read_export_meta(root)
        tasks = {int(r["task_index"]) for r in read_jsonl(root / layout.TASKS)}
    except (OSError, ValueError, KeyError, TypeError) as e:
        check_unreadable_meta(problem, root, e)
        return problem.problems
    info_path = root / layout.INFO
    check_version(problem, info, layout.CODEBASE_VERSION, info_path)
    features = info.get("features", {})
    video_keys, refused = layout.safe_video_keys(features)
    for refusal in refused:
        problem("video_key", str(refusal), root / layout.INFO)
    chunks_size = int(info.get("chunks_size", layout.DEFAULT_CHUNKS_SIZE))
    indices = [r.get("episode_index") for r in episodes]
    if indices != list(range(len(episodes))):
        problem(
            "episode_numbering", f"episode indices {indices} are not 0..n-1", root / layout.EPISODES
        )
    check_total(
        problem, info, "total_episodes", len(episodes), f"{len(episodes)} episodes", info_path
    )
    check_total(problem, info, "total_tasks", len(tasks), f"{len(tasks)} tasks", info_path)
    videos = len(episodes) * sum(1 for f in features.values() if f.get("dtype") == "video")
    check_total(problem, info, "total_videos", videos, f"{videos} videos", info_path)
    total_rows = 0
    for ep in range(len(episodes)):
        chunk = layout.episode_chunk(ep, chunks_size)
        data = root / layout.DATA_PATH.format(episode_chunk=chunk, episode_index=ep)
        n = _check_table(problem, root, data, ep, episodes[ep], tasks, features, total_rows)
        if n is None:
            continue
        total_rows += n
        for key in video_keys:
            video = root / layout.VIDEO_PATH.format(
                episode_chunk=chunk, video_key=key, episode_index=ep
            )
            _check_video(problem, root, video, key, ep, n, features)
    check_total(problem, info, "total_frames", total_rows, f"{total_rows} rows", info_path)
    return problem.problems
