"""Append episodes to a raw LeRobot v2.1 dataset (its paths: ``eva.dataset.layout``; its
feature layout and table columns: ``eva.dataset.features``).

``DatasetWriter.create_or_open`` creates the directory (or opens an existing one, checking that
its features match) and reads the metadata ONCE; afterwards every append only writes the new
episode's files and rewrites metadata from running state held in memory, so the cost of an append
does not grow with the number of episodes already in the dataset.

An episode is staged in ``<root>/.eva-work/<random>/`` (MP4s encode there frame batch by frame
batch; vector rows are buffered, they are small) and becomes visible at ``commit``.

Encoding runs on one worker thread per camera (``parallel_encode=True``, the default; see
``eva.dataset.encoder_pool``): ``add_frames`` copies each camera's frames into one of a few
reused batch buffers and returns (it waits for a free one). A worker's failure surfaces on the next ``add_frames`` or at ``commit`` as a ``DatasetError`` naming the
camera, and the episode is aborted (work dir removed, nothing published); ``commit`` / ``abort``
join the workers before they return. Publishing order:

1. parquet written under a temporary name, then renamed into ``data/chunk-XXX/``;
2. MP4s renamed into ``videos/chunk-XXX/<key>/``; both lose their write bits before the rename
   (committed raw evidence is read-only, 0444 under a 022 umask, so an export may share it by
   hard link: ``eva.dataset.share.share_file``);
3. ``tasks.jsonl`` (if the task is new), ``eva_image_histograms.jsonl`` (eva's sidecar: each
   camera's exact 3 x 256 pixel histogram of the frames given to ``add_frames``, for exact image
   quantiles at export without decoding; not in episodes_stats.jsonl, whose image stats LeRobot
   requires to be (3, 1, 1)), ``episodes_stats.jsonl``, ``episodes.jsonl`` (the commit point: an
   episode exists once its row is there): one complete line appended in place, O(1)
   (``atomic.append_jsonl_inplace``; readers ignore an unterminated fragment);
4. ``stats.json`` and ``info.json`` replaced atomically (temp file + rename) from memory.

A crash before the episodes row leaves only orphan files under the index that the next commit
reuses (and overwrites) and possibly a torn jsonl fragment; ``create_or_open`` drops such
fragments, de-duplicates per-episode stats and repairs what follows the commit point (totals,
stats) from ``episodes.jsonl`` (``eva.dataset.repair``). A commit that fails in-process takes its
appended rows back. One writer per dataset at a time (an flock on ``.eva-work/writer.lock``);
commits from several threads of that writer are serialised.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from eva.dataset import atomic, fsafe, layout
from eva.dataset.encoder_pool import BufferPool
from eva.dataset.episode_writer import EpisodeWriter, RecordedEpisode
from eva.dataset.errors import DatasetError
from eva.dataset.features import (
    CAPTURE_TIME,
    INDEX_FEATURES,
    CameraSpec,
    VectorSpec,
    build_features,
    check_features,
    default_feature_names,
    episode_columns,
    episode_stats,
    episode_table,
    specs_from_features,
)
from eva.dataset.layout import WRITER_LOCK, saving_marker_name
from eva.dataset.limits import MAX_FPS
from eva.dataset.locks import flocked, meta_lock, release_flock, try_flock
from eva.dataset.publication import Publication
from eva.dataset.recover import Recovery, recover_spools
from eva.dataset.repair import (
    MetadataNotUpdated,
    clean_stale_work,
    read_meta_json,
    read_meta_jsonl,
    remove_stale_temporaries,
    repair_after_crash,
)
from eva.dataset.stats_merge import RunningMerge
from eva.dataset.video import VideoOptions
from eva.textsafe import storable_problem

__all__ = [
    "CameraSpec",
    "DatasetWriter",
    "EpisodeWriter",
    "INDEX_FEATURES",
    "VectorSpec",
    "VideoOptions",
    "default_feature_names",
    "remove_stale_temporaries",
]


class DatasetWriter:
    """Appends episodes to one raw v2.1 dataset. Use ``create_or_open``."""

    # Set by create_or_open (the constructor refuses direct calls).
    parallel_encode: bool
    spool: bool
    buffer_pool: BufferPool
    recovered: list[Recovery]

    def __init__(self) -> None:  # pragma: no cover - guarded: use create_or_open
        raise TypeError("use DatasetWriter.create_or_open(root, ...)")

    @classmethod
    def create_or_open(
        cls,
        root: Path | str,
        *,
        fps: int,
        cameras: Sequence[CameraSpec] = (),
        vectors: Sequence[VectorSpec] = (),
        robot_type: str = "unknown",
        video: VideoOptions | None = None,
        chunks_size: int = layout.DEFAULT_CHUNKS_SIZE,
        durable: bool = True,
        parallel_encode: bool = True,
        spool: bool = True,
        recover: bool = True,
    ) -> DatasetWriter:
        """Create ``root`` as an empty v2.1 dataset, or open it for appending.

        An existing dataset must have the same fps, cameras (key and size) and vectors (name and
        dim); its chunks_size wins over the argument. ``durable=False`` skips fsync (tests,
        benchmarks, throwaway data). ``parallel_encode=False`` encodes every camera in the
        thread calling ``add_frames``, one after the other (the benchmark's baseline).
        ``spool=False`` records without the crash spool (``eva.dataset.spool``; the benchmark's
        baseline). Episodes a crash left spooled are recovered as the dataset opens
        (``recovered`` lists them) unless ``recover=False``.
        """
        self = object.__new__(cls)
        self.parallel_encode = bool(parallel_encode)
        self.spool = bool(spool)
        self.buffer_pool = BufferPool()
        self.recovered = []
        self._init(
            Path(root),
            int(fps),
            list(cameras),
            list(vectors),
            robot_type,
            video or VideoOptions(),
            int(chunks_size),
            durable,
        )
        if recover:
            try:
                self.recovered = recover_spools(self)
            except BaseException:
                self.close()
                raise
        return self

    @classmethod
    def open_existing(cls, root: Path | str, *, durable: bool = True) -> DatasetWriter:
        """Open an existing dataset with the cameras, vectors and codec its info.json declares
        (what ``eva recover`` does, without a rig config); recovers its crash spools."""
        root = Path(root)
        info = read_meta_json(fsafe.contained(root, layout.INFO, "file"))
        features = info.get("features") if isinstance(info, dict) else None
        if not isinstance(info, dict) or not isinstance(features, dict):
            raise DatasetError(f"{root / layout.INFO}: not a dataset's info.json (no features)")
        try:
            cameras, vectors, codec = specs_from_features(features)
            return cls.create_or_open(
                root,
                fps=int(info["fps"]),
                cameras=cameras,
                vectors=vectors,
                robot_type=str(info.get("robot_type") or "unknown"),
                video=VideoOptions(codec=codec),
                durable=durable,
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            if isinstance(e, DatasetError):
                raise
            raise DatasetError(f"{root / layout.INFO}: unusable features ({e})") from None

    def _init(
        self,
        root: Path,
        fps: int,
        cameras: list[CameraSpec],
        vectors: list[VectorSpec],
        robot_type: str,
        video: VideoOptions,
        chunks_size: int,
        durable: bool,
    ) -> None:
        if not 1 <= fps <= MAX_FPS:  # the validator's bound: a dataset it would refuse
            raise DatasetError(f"{root}: fps {fps} must be in 1..{MAX_FPS}")
        if chunks_size < 1:
            raise DatasetError(f"{root}: chunks_size {chunks_size} must be >= 1")
        for cam in cameras:
            if video.pix_fmt == "yuv420p" and (cam.width % 2 or cam.height % 2):
                raise DatasetError(
                    f"camera {cam.key}: {cam.width}x{cam.height} must have even width and height "
                    "for yuv420p video"
                )
        keys = [c.key for c in cameras] + [v.name for v in vectors]
        if len(set(keys)) != len(keys):
            raise DatasetError(f"{root}: duplicate camera/vector names in {keys}")
        self.root = root
        self.fps = fps
        self.cameras = cameras
        self.vectors = vectors
        self.video = video
        self.durable = durable
        self._lock = threading.Lock()
        self._closed = False

        fsafe.real_directory(root, create=True)
        # The shared containment check: a planted link in meta/ or .eva-work/ is refused before
        # the writer creates, truncates or appends anything.
        fsafe.check_dataset_tree(root)
        self.work_root = fsafe.real_directory(root / layout.WORK_DIR, create=True)
        lock_fd = try_flock(self.work_root / WRITER_LOCK)
        if lock_fd is None:
            raise DatasetError(f"{root}: another writer has this dataset open")
        self._lock_fd = lock_fd
        try:
            # Work dirs and temp files left by a crashed writer (we hold the lock: nobody else).
            clean_stale_work(self.root, self.work_root)
            if (root / layout.INFO).exists():
                self._open_existing(robot_type, chunks_size)
            else:
                self._create_new(robot_type, chunks_size)
        except BaseException:
            self.close()
            raise

    # ---- opening -------------------------------------------------------------------------

    def _create_new(self, robot_type: str, chunks_size: int) -> None:
        episodes = self.root / layout.EPISODES
        if (episodes.exists() and episodes.stat().st_size > 0) or (self.root / "data").exists():
            raise DatasetError(
                f"{self.root / layout.INFO}: missing, but the directory already holds episodes; "
                "refusing to start a new dataset over them"
            )
        self.features = build_features(self.fps, self.cameras, self.vectors, self.video)
        self.info: dict[str, Any] = {
            "codebase_version": layout.CODEBASE_VERSION,
            "robot_type": robot_type,
            "total_episodes": 0,
            "total_frames": 0,
            "total_tasks": 0,
            "total_videos": 0,
            "total_chunks": 0,
            "chunks_size": chunks_size,
            "fps": self.fps,
            "splits": {"train": "0:0"},
            "data_path": layout.DATA_PATH,
            "video_path": layout.VIDEO_PATH if self.cameras else None,
            "features": self.features,
        }
        self.chunks_size = chunks_size
        self._tasks: dict[str, int] = {}
        self._episode_indices: set[int] = set()
        self._next_episode = 0
        self._total_frames = 0
        self._max_chunk = -1
        self._stats = RunningMerge()
        meta = self.root / layout.META_DIR
        meta.mkdir(exist_ok=True)
        for name in (layout.EPISODES, layout.EPISODES_STATS, layout.TASKS):
            if not (self.root / name).exists():
                atomic.atomic_write_bytes(self.root / name, b"", durable=self.durable)
        atomic.atomic_write_json(self.root / layout.STATS, {}, durable=self.durable)
        # info.json last: its presence marks the directory as a dataset.
        atomic.atomic_write_json(self.root / layout.INFO, self.info, durable=self.durable)
        self._has_capture_time = True

    def _open_existing(self, robot_type: str, chunks_size: int) -> None:
        path = self.root / layout.INFO
        info = read_meta_json(path)
        if not isinstance(info, dict):
            raise DatasetError(f"{path}: not a JSON object")
        if info.get("codebase_version") != layout.CODEBASE_VERSION:
            raise DatasetError(
                f"{path}: codebase_version {info.get('codebase_version')!r} is not "
                f"{layout.CODEBASE_VERSION!r}"
            )
        fps = info.get("fps")
        if not isinstance(fps, int | float) or fps != self.fps:
            raise DatasetError(f"{path}: fps {fps!r} != requested {self.fps}")
        features = info.get("features")
        if not isinstance(features, dict) or not all(
            isinstance(f, dict) for f in features.values()
        ):
            raise DatasetError(f"{path}: field features is not an object of feature objects")
        check_features(features, self.cameras, self.vectors, self.video.info_codec, path)
        self.info = info
        self.features = features
        self.chunks_size = int(info.get("chunks_size") or chunks_size)
        self._has_capture_time = CAPTURE_TIME in features

        # A writer that died mid-append may have left a torn last line: drop it (O(1), tail only).
        for rel in (layout.TASKS, layout.EPISODES_STATS, layout.IMAGE_HISTOGRAMS):
            atomic.heal_jsonl_tail(self.root / rel, durable=self.durable)
        with meta_lock(self.root):
            atomic.heal_jsonl_tail(self.root / layout.EPISODES, durable=self.durable)
        tasks = read_meta_jsonl(self.root / layout.TASKS)
        self._tasks = {}
        for row in tasks:
            try:
                self._tasks[str(row["task"])] = int(row["task_index"])
            except (KeyError, TypeError, ValueError):
                raise DatasetError(f"{self.root / layout.TASKS}: bad row {row}") from None
        episodes = read_meta_jsonl(self.root / layout.EPISODES)
        try:
            lengths = {int(r["episode_index"]): int(r["length"]) for r in episodes}
        except (KeyError, TypeError, ValueError):
            raise DatasetError(
                f"{self.root / layout.EPISODES}: a row lacks an integer episode_index/length"
            ) from None
        if len(lengths) != len(episodes):
            raise DatasetError(f"{self.root / layout.EPISODES}: duplicate episode_index")
        self._episode_indices = set(lengths)
        self._next_episode = max(lengths, default=-1) + 1
        self._total_frames = sum(lengths.values())
        self._max_chunk = (
            max(layout.episode_chunk(e, self.chunks_size) for e in lengths) if lengths else -1
        )
        self._stats = repair_after_crash(
            self.root,
            self.info,
            self._episode_indices,
            self._total_frames,
            self._info_totals(),
            durable=self.durable,
        )

    def _info_totals(self) -> dict[str, Any]:
        n = len(self._episode_indices)
        return {
            "total_episodes": n,
            "total_frames": self._total_frames,
            "total_tasks": len(self._tasks),
            "total_videos": n * len(self.cameras),
            "total_chunks": self._max_chunk + 1,
            "splits": {"train": f"0:{self._next_episode}"},
        }

    # ---- public --------------------------------------------------------------------------

    @property
    def total_episodes(self) -> int:
        return len(self._episode_indices)

    @property
    def total_frames(self) -> int:
        return self._total_frames

    @property
    def next_episode_index(self) -> int:
        return self._next_episode

    @property
    def tasks(self) -> dict[int, str]:
        return {i: t for t, i in self._tasks.items()}

    def begin_episode(self, task: str, started_at: str | None = None) -> EpisodeWriter:
        """A new episode of ``task``; ``started_at`` (UTC ISO 8601, default now) goes into its
        crash spool, for the row of an episode recovered after a crash."""
        if self._closed:
            raise DatasetError(f"{self.root}: writer is closed")
        if not isinstance(task, str) or not task.strip():
            raise DatasetError(f"{self.root}: task prompt must be a non-empty string")
        if (problem := storable_problem(task)) is not None:  # what the validator refuses
            raise DatasetError(f"{self.root}: task prompt: {problem}")
        return EpisodeWriter(self, task, started_at)

    def close(self) -> None:
        """Release the dataset lock. Episodes still in progress can no longer commit."""
        if self._closed:
            return
        self._closed = True
        self.buffer_pool.clear()
        release_flock(self._lock_fd)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    # ---- commit (called by EpisodeWriter) ------------------------------------------------

    def _path_from_template(self, template_key: str, default: str, **fields: Any) -> Path:
        """``root / info[template_key].format(**fields)``, the template checked first (an opened
        dataset's info.json is input: no attribute access or huge widths, as in the reader)."""
        template = self.info.get(template_key) or default
        try:
            rel = layout.format_path_template(template, **fields)
        except layout.UnsafeNameError as e:
            raise DatasetError(
                f"{self.root / layout.INFO}: field {template_key} {template!r} unusable ({e})"
            ) from None
        path = self.root / rel
        if not layout.is_within(path, self.root):
            raise DatasetError(f"{path}: {template_key} leads outside the dataset {self.root}")
        return path

    def _data_path(self, episode_index: int) -> Path:
        chunk = layout.episode_chunk(episode_index, self.chunks_size)
        return self._path_from_template(
            "data_path", layout.DATA_PATH, episode_chunk=chunk, episode_index=episode_index
        )

    def _video_path(self, episode_index: int, key: str) -> Path:
        chunk = layout.episode_chunk(episode_index, self.chunks_size)
        return self._path_from_template(
            "video_path",
            layout.VIDEO_PATH,
            episode_chunk=chunk,
            episode_index=episode_index,
            video_key=key,
        )

    def commit_episode(self, episode: RecordedEpisode, extra: dict[str, Any]) -> int:
        """Publish a recorded episode (``EpisodeWriter.commit`` calls this); returns its index."""
        with self._lock:
            if self._closed:
                raise DatasetError(f"{self.root}: writer is closed")
            ep = self._next_episode
            task_index, new_task = self._task_index(episode.task)
            columns = episode_columns(
                self.vectors,
                episode.vectors,
                episode.capture_time,
                with_capture_time=self._has_capture_time,
                fps=self.fps,
                episode_index=ep,
                first_index=self._total_frames,
                task_index=task_index,
            )
            table = episode_table(columns, self.features)
            ep_stats = episode_stats(
                columns, self.vectors, episode.vectors, episode.image_stats, self.features
            )
            row: dict[str, Any] = {
                "episode_index": ep,
                "tasks": [episode.task],
                "length": episode.length,
            }
            if self.cameras:
                row["video_keys"] = [c.key for c in self.cameras]
            row.update(extra)
            task_row = {"task_index": task_index, "task": episode.task} if new_task else None
            self._publish(episode, ep, table, ep_stats, row, task_row)
            self._count_committed(ep, episode, task_index, ep_stats)
            return ep

    def _task_index(self, task: str) -> tuple[int, bool]:
        """The index of ``task``, and whether it is new to the dataset."""
        if task not in self._tasks:
            task_index = len(self._tasks)
            if task_index in self._tasks.values():
                task_index = max(self._tasks.values()) + 1
            return task_index, True
        return self._tasks[task], False

    def _publish(
        self,
        episode: RecordedEpisode,
        ep: int,
        table: pa.Table,
        ep_stats: dict[str, Any],
        row: dict[str, Any],
        task_row: dict[str, Any] | None,
    ) -> None:
        """Move the episode's files in and append its rows, up to and including the commit point
        (its episodes row); a failure before the commit point takes every step back."""
        data_path = self._data_path(ep)
        publication = Publication(self.root, durable=self.durable, spool_dir=episode.spool_dir)
        publication.claim(ep, episode.length)
        # `eva qc` refuses a verdict for episode ep while this marker is locked.
        with flocked(self.work_root / saving_marker_name(ep), unlink=True):
            try:
                publication.publish_table(table, data_path)
                for cam in self.cameras:
                    dest = self._video_path(ep, cam.key)
                    publication.publish_video(episode.video_files[cam.key], dest)
                publication.sync_directories()
                if task_row is not None:
                    publication.append_row(layout.TASKS, task_row)
                if episode.histograms:
                    histograms = {"episode_index": ep, "histograms": episode.histograms}
                    publication.append_row(layout.IMAGE_HISTOGRAMS, histograms)
                publication.append_row(
                    layout.EPISODES_STATS, {"episode_index": ep, "stats": ep_stats}
                )
                # Commit point: from here on the episode exists. The meta lock keeps a
                # concurrent `eva qc` rewrite of episodes.jsonl from losing this row.
                with meta_lock(self.root):
                    atomic.append_jsonl_inplace(
                        self.root / layout.EPISODES, [row], durable=self.durable
                    )
            except BaseException:
                publication.undo()
                raise

    def _count_committed(
        self, ep: int, episode: RecordedEpisode, task_index: int, ep_stats: dict[str, Any]
    ) -> None:
        """Add a committed episode to the running state and rewrite stats.json and info.json."""
        self._tasks.setdefault(episode.task, task_index)
        self._episode_indices.add(ep)
        self._next_episode = ep + 1
        self._total_frames += episode.length
        self._max_chunk = max(self._max_chunk, layout.episode_chunk(ep, self.chunks_size))
        self._stats.add(ep_stats)
        try:
            atomic.atomic_write_json(
                self.root / layout.STATS, self._stats.result(), durable=self.durable
            )
            self.info.update(self._info_totals())
            atomic.atomic_write_json(self.root / layout.INFO, self.info, durable=self.durable)
        except Exception as e:
            # Past the commit point the episode exists: only metadata derived from the rows
            # is stale, which `eva cleanup` (or the next open) repairs. Not a failed save.
            raise MetadataNotUpdated(self.root, ep, e) from e
