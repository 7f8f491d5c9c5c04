"""Append episodes to a raw LeRobot v2.1 dataset (contracts §1).

``DatasetWriter.create_or_open`` creates the directory (or opens an existing one, checking that
its features match) and reads the metadata ONCE; afterwards every append only writes the new
episode's files and rewrites metadata from running state held in memory, so the cost of an append
does not grow with the number of episodes already in the dataset.

An episode is staged in ``<root>/.eva-work/<random>/`` (MP4s encode there frame batch by frame
batch; vector rows are buffered, they are small) and becomes visible at ``commit``.

Encoding runs on one worker thread per camera (``parallel_encode=True``, the default):
``add_frames`` copies each camera's frames into one of a few reused batch buffers and returns;
the worker encodes them and feeds that camera's image stats (PyAV and the native stats release
the GIL, so cameras encode in parallel). Memory is bounded (``ENCODE_BUFFERS`` buffers of
``ENCODE_BATCH_FRAMES`` frames per camera; ``add_frames`` waits for a free one). A worker's
failure surfaces on the next ``add_frames`` or at ``commit`` as a ``DatasetError`` naming the
camera, and the episode is aborted (work dir removed, nothing published); ``commit`` / ``abort``
join the workers before they return. Publishing order:

1. parquet written under a temporary name, then renamed into ``data/chunk-XXX/``;
2. MP4s renamed into ``videos/chunk-XXX/<key>/``; both lose their write bits before the rename
   (committed raw evidence is read-only, 0444 under a 022 umask, so an export may share it by
   hard link: ``eva.dataset.fsafe.share_file``);
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
stats) from ``episodes.jsonl``. A commit that fails in-process takes its appended rows back. One writer per dataset at a time (an flock on
``.eva-work/writer.lock``); commits from several threads of that writer are serialised.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import queue
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eva.dataset import atomic, fsafe, layout
from eva.dataset.errors import DatasetError, error_line
from eva.dataset.layout import WRITER_LOCK, saving_marker_name
from eva.dataset.locks import flocked, meta_lock, try_flock
from eva.dataset.repair import MetadataNotUpdated
from eva.dataset.stats import ImageStats, RunningMerge, VectorStats, merge_stats
from eva.dataset.video import VideoEncoder, VideoOptions

__all__ = [
    "CameraSpec",
    "DatasetWriter",
    "EpisodeWriter",
    "VectorSpec",
    "VideoOptions",
    "default_feature_names",
    "INDEX_FEATURES",
]

# Per-row bookkeeping columns every v2.1 table has (LeRobot's DEFAULT_FEATURES), in table order.
INDEX_FEATURES: dict[str, str] = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}
CAPTURE_TIME = "capture_time"
# Episode-row keys the writer owns; extra_row_fields may not override them.
RESERVED_ROW_KEYS = frozenset({"episode_index", "tasks", "length", "video_keys"})
# The start of an eva_image_histograms.jsonl row (json.dumps of {"episode_index": N, ...}).
_HISTOGRAM_ROW_START = re.compile(rb'\{"episode_index": (\d+),')

# Per camera: batch buffers of ENCODE_BATCH_FRAMES frames cycling between add_frames and the
# encoder thread (one being encoded, one queued, one being filled): 11 MB per 640x480 camera.
# Reused across episodes, so their pages are touched once per writer, not once per batch. In the
# 3x640x480 capture bench, 4x3 ran as fast as 8x3 with 30 MB less peak RSS.
ENCODE_BATCH_FRAMES = 4
ENCODE_BUFFERS = 3


@dataclass(frozen=True)
class CameraSpec:
    """One camera: ``key`` is the video feature name (e.g. ``observation.images.front``)."""

    key: str
    height: int
    width: int

    def __post_init__(self) -> None:
        layout.check_video_key(self.key)
        if self.height < 2 or self.width < 2:
            raise ValueError(f"camera {self.key}: size {self.width}x{self.height} is too small")


@dataclass(frozen=True)
class VectorSpec:
    """One float32 vector column (``observation.state``, ``action``...); ``names`` per dim."""

    name: str
    dim: int
    names: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "\n" in self.name:
            raise ValueError(f"vector name {self.name!r} is not a usable column name")
        if self.name in INDEX_FEATURES or self.name == CAPTURE_TIME:
            raise ValueError(f"vector name {self.name!r} collides with a bookkeeping column")
        if self.dim < 1:
            raise ValueError(f"vector {self.name}: dim {self.dim} must be >= 1")
        if self.names is not None and len(self.names) != self.dim:
            raise ValueError(f"vector {self.name}: {len(self.names)} names for dim {self.dim}")

    def feature_names(self) -> list[str]:
        return list(self.names) if self.names is not None else default_feature_names(self.dim)


def default_feature_names(dim: int) -> list[str]:
    return [f"dim_{i}" for i in range(dim)]


def _video_feature(cam: CameraSpec, fps: int, options: VideoOptions) -> dict[str, Any]:
    return {
        "dtype": "video",
        "shape": [cam.height, cam.width, 3],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": cam.height,
            "video.width": cam.width,
            "video.codec": options.info_codec,
            "video.pix_fmt": options.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": fps,
            "video.channels": 3,
            "has_audio": False,
        },
    }


def build_features(
    fps: int, cameras: Sequence[CameraSpec], vectors: Sequence[VectorSpec], options: VideoOptions
) -> dict[str, dict[str, Any]]:
    """info.json ``features`` in table order: vectors, videos, timestamp, capture_time, indices."""
    features: dict[str, dict[str, Any]] = {}
    for vec in vectors:
        features[vec.name] = {"dtype": "float32", "shape": [vec.dim], "names": vec.feature_names()}
    for cam in cameras:
        features[cam.key] = _video_feature(cam, fps, options)
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    features[CAPTURE_TIME] = {"dtype": "float64", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def huggingface_schema_metadata(features: Mapping[str, Mapping[str, Any]]) -> bytes:
    """The ``huggingface`` parquet schema metadata LeRobot/datasets write (non-video columns).

    LeRobot 0.3.3 itself does not need it (it passes the features from info.json; checked with
    the oracle), but HF ``datasets.load_dataset("parquet")`` uses it to restore Sequence types.
    """
    hf: dict[str, Any] = {}
    for name, feat in features.items():
        if feat["dtype"] in ("video", "image"):
            continue
        value = {"dtype": feat["dtype"], "_type": "Value"}
        if tuple(feat["shape"]) == (1,) and feat.get("names") is None:
            hf[name] = value
        else:
            hf[name] = {"feature": value, "length": int(feat["shape"][0]), "_type": "Sequence"}
    return json.dumps({"info": {"features": hf}}).encode()


def _jsonable(value: Any, where: str) -> Any:
    """numpy scalars/arrays -> Python values; refuse NaN/inf and non-JSON objects early."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist(), where)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise DatasetError(f"episode field {where}: non-finite value {value}")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise DatasetError(f"episode field {where}: {type(value).__name__} is not JSON data")


def _size_mark(path: Path) -> tuple[Path, int]:
    try:
        return path, path.stat().st_size
    except FileNotFoundError:
        return path, 0


def _finite_row_stats(values: np.ndarray) -> dict[str, Any] | None:
    """Stats over the rows whose values are all finite (None if there are none).

    A red episode may carry NaN/inf samples (quality issue ``non_finite_value``); the parquet keeps
    them as evidence, but JSON stats cannot hold them and one NaN would poison the dataset merge.
    """
    finite = np.isfinite(values).all(axis=1)
    rows = values if finite.all() else values[finite]
    if len(rows) == 0:
        return None
    stats = VectorStats(values.shape[1])
    stats.update(rows)
    return stats.result()


def _has_temporaries(directory: Path) -> bool:
    if not directory.is_dir() or directory.is_symlink():
        return False
    return any(p.name.startswith(atomic.TMP_PREFIX) for p in directory.iterdir())


def _remove_temporaries(root: Path) -> list[Path]:
    """Temp files of ``meta/`` and ``data/chunk-*/``; the caller holds the writer lock.

    The writer lock excludes other writers; the meta lock (taken only when there is something
    to remove, so a fresh dataset gets no lock file) excludes a concurrent ``eva qc``, whose
    episodes.jsonl rewrite would lose its temp.
    """
    removed: list[Path] = []
    meta = root / layout.META_DIR
    if _has_temporaries(meta):
        with meta_lock(root):
            removed += atomic.remove_stale_temporaries(meta)
    data = root / "data"
    if data.is_dir() and not data.is_symlink():
        for chunk in data.iterdir():  # a parquet temp file a crash left before its rename
            if chunk.is_dir() and not chunk.is_symlink():
                removed += atomic.remove_stale_temporaries(chunk)
    return removed


def remove_stale_temporaries(root: Path | str) -> list[Path]:
    """What ``eva cleanup`` does to a raw dataset: delete the temp files killed writers or a
    killed ``eva qc`` left (``.eva-tmp-*`` in ``meta/`` and ``data/chunk-*/``), never a live
    writer's. With a writer open (``writer.lock`` held) only the episodes.jsonl copies of a
    killed qc go, under the meta lock; otherwise the writer lock is taken first. Returns the
    removed paths; a filesystem error is a one-line ``DatasetError`` naming the path."""
    root = Path(root)
    fsafe.check_dataset_tree(root)
    if not (root / layout.META_DIR).is_dir():
        return []
    data = root / "data"
    chunks = (
        [c for c in data.iterdir() if c.is_dir() and not c.is_symlink()]
        if data.is_dir() and not data.is_symlink()
        else []
    )
    if not _has_temporaries(root / layout.META_DIR) and not any(map(_has_temporaries, chunks)):
        return []
    try:
        fsafe.real_directory(root / layout.WORK_DIR, create=True)
        lock_fd = try_flock(root / layout.WORK_DIR / WRITER_LOCK)
        if lock_fd is None:  # a writer is open: its own temps stay
            with meta_lock(root):
                return atomic.remove_stale_temporaries(
                    root / layout.META_DIR, target=Path(layout.EPISODES).name
                )
        try:
            return _remove_temporaries(root)
        finally:
            os.close(lock_fd)
    except OSError as e:
        raise fsafe.os_error(e) from None


class DatasetWriter:
    """Appends episodes to one raw v2.1 dataset. Use ``create_or_open``."""

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
    ) -> DatasetWriter:
        """Create ``root`` as an empty v2.1 dataset, or open it for appending.

        An existing dataset must have the same fps, cameras (key and size) and vectors (name and
        dim); its chunks_size wins over the argument. ``durable=False`` skips fsync (tests,
        benchmarks, throwaway data). ``parallel_encode=False`` encodes every camera in the
        thread calling ``add_frames``, one after the other (the benchmark's baseline).
        """
        self = object.__new__(cls)
        self.parallel_encode = bool(parallel_encode)
        self._free_buffers: dict[str, list[np.ndarray]] = {}
        self._init(
            Path(root), int(fps), list(cameras), list(vectors), robot_type,
            video or VideoOptions(), int(chunks_size), durable,
        )  # fmt: skip
        return self

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
        if fps < 1:
            raise DatasetError(f"{root}: fps {fps} must be >= 1")
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
            self._clean_stale_work()
            if (root / layout.INFO).exists():
                self._open_existing(robot_type, chunks_size)
            else:
                self._create_new(robot_type, chunks_size)
        except BaseException:
            self.close()
            raise

    # ---- opening -------------------------------------------------------------------------

    def _clean_stale_work(self) -> None:
        """Work dirs and temp files left by a crashed writer (we hold the lock: nobody else)."""
        for entry in self.work_root.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
        _remove_temporaries(self.root)

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

    def _read_json(self, rel: str) -> Any:
        path = self.root / rel
        try:
            return json.loads(fsafe.read_bytes(path).decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DatasetError(f"{path}: cannot read ({e})") from None

    def _read_jsonl(self, rel: str) -> list[dict[str, Any]]:
        path = self.root / rel
        if not path.exists():
            return []
        try:
            return atomic.read_jsonl(path)
        except (OSError, ValueError) as e:
            raise DatasetError(str(e)) from None

    def _open_existing(self, robot_type: str, chunks_size: int) -> None:
        info = self._read_json(layout.INFO)
        path = self.root / layout.INFO
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
        self._check_features(features, path)
        self.info = info
        self.features = features
        self.chunks_size = int(info.get("chunks_size") or chunks_size)
        self._has_capture_time = CAPTURE_TIME in features

        # A writer that died mid-append may have left a torn last line: drop it (O(1), tail only).
        for rel in (layout.TASKS, layout.EPISODES_STATS, layout.IMAGE_HISTOGRAMS):
            atomic.heal_jsonl_tail(self.root / rel, durable=self.durable)
        with meta_lock(self.root):
            atomic.heal_jsonl_tail(self.root / layout.EPISODES, durable=self.durable)
        tasks = self._read_jsonl(layout.TASKS)
        self._tasks = {}
        for row in tasks:
            try:
                self._tasks[str(row["task"])] = int(row["task_index"])
            except (KeyError, TypeError, ValueError):
                raise DatasetError(f"{self.root / layout.TASKS}: bad row {row}") from None
        episodes = self._read_jsonl(layout.EPISODES)
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
        self._repair_after_crash(episodes)

    def _check_features(self, features: Mapping[str, Any], path: Path) -> None:
        want_cams = {c.key: c for c in self.cameras}
        want_vecs = {v.name: v for v in self.vectors}
        have_cams = {k for k, f in features.items() if f.get("dtype") == "video"}
        if have_cams != set(want_cams):
            raise DatasetError(
                f"{path}: cameras {sorted(have_cams)} != requested {sorted(want_cams)}"
            )
        for key, cam in want_cams.items():
            feat = features[key]
            if list(feat.get("shape", [])) != [cam.height, cam.width, 3]:
                raise DatasetError(
                    f"{path}: feature {key} shape {feat.get('shape')} != "
                    f"[{cam.height}, {cam.width}, 3]"
                )
            codec = (feat.get("info") or {}).get("video.codec")
            if codec not in (None, self.video.info_codec):
                raise DatasetError(
                    f"{path}: feature {key} is {codec} video, writer encodes {self.video.info_codec}"
                )
        skip = set(INDEX_FEATURES) | {CAPTURE_TIME} | have_cams
        have_vecs = {k for k in features if k not in skip}
        if have_vecs != set(want_vecs):
            raise DatasetError(
                f"{path}: vectors {sorted(have_vecs)} != requested {sorted(want_vecs)}"
            )
        for name, vec in want_vecs.items():
            feat = features[name]
            if feat.get("dtype") != "float32" or list(feat.get("shape", [])) != [vec.dim]:
                raise DatasetError(
                    f"{path}: feature {name} is {feat.get('dtype')}{feat.get('shape')}, "
                    f"requested float32[{vec.dim}]"
                )

    def _repair_after_crash(self, episodes: list[dict[str, Any]]) -> None:
        """Bring totals, per-episode stats and stats.json in line with episodes.jsonl.

        Only needed if a previous writer died after the commit point; costs one read of
        episodes_stats.jsonl, once per open.
        """
        stats_rows = self._read_jsonl(layout.EPISODES_STATS)
        kept = [r for r in stats_rows if r.get("episode_index") in self._episode_indices]
        seen: set[int] = set()
        deduped = []
        for row in reversed(kept):  # a re-committed index: the later row is the real one
            if row["episode_index"] not in seen:
                seen.add(row["episode_index"])
                deduped.append(row)
        deduped.reverse()
        if len(deduped) != len(stats_rows):
            atomic.atomic_write_jsonl(
                self.root / layout.EPISODES_STATS, deduped, durable=self.durable
            )
        self._prune_image_histograms()
        stats_path = self.root / layout.STATS
        stats = self._read_json(layout.STATS) if stats_path.exists() else None
        counted = None
        if isinstance(stats, dict) and "frame_index" in stats:
            with contextlib.suppress(KeyError, TypeError, ValueError, IndexError):
                counted = int(stats["frame_index"]["count"][0])
        if counted == self._total_frames and isinstance(stats, dict):
            try:
                # mean, std and count fully describe the pooled moments: no per-episode re-read.
                self._stats = RunningMerge.from_stats(stats)
            except (ValueError, TypeError) as e:
                raise DatasetError(f"{stats_path}: unusable stats ({e})") from None
        else:
            merged = merge_stats([r["stats"] for r in deduped]) if deduped else {}
            self._stats = RunningMerge.from_stats(merged)
            atomic.atomic_write_json(stats_path, merged, durable=self.durable)
        expected = self._info_totals()
        if any(self.info.get(k) != v for k, v in expected.items()):
            self.info.update(expected)
            atomic.atomic_write_json(self.root / layout.INFO, self.info, durable=self.durable)

    def _prune_image_histograms(self) -> None:
        """Drop sidecar rows of episodes that never reached episodes.jsonl and the earlier row of
        a re-committed index. Only each line's leading ``{"episode_index": N`` is looked at (the
        writer puts it first), so the histograms are not parsed on every open."""
        path = self.root / layout.IMAGE_HISTOGRAMS
        try:
            lines = fsafe.read_bytes(path).splitlines(keepends=True)
        except FileNotFoundError:
            return
        except OSError as e:
            raise DatasetError(f"{path}: cannot read ({e})") from None
        last: dict[int, int] = {}
        for i, line in enumerate(lines):
            match = _HISTOGRAM_ROW_START.match(line)
            if match is not None:
                last[int(match.group(1))] = i
        keep = sorted(i for ep, i in last.items() if ep in self._episode_indices)
        if len(keep) != len(lines):
            atomic.atomic_write_bytes(path, b"".join(lines[i] for i in keep), durable=self.durable)

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

    def begin_episode(self, task: str) -> EpisodeWriter:
        if self._closed:
            raise DatasetError(f"{self.root}: writer is closed")
        if not isinstance(task, str) or not task.strip():
            raise DatasetError(f"{self.root}: task prompt must be a non-empty string")
        return EpisodeWriter(self, task)

    def _take_buffers(self, cam: CameraSpec) -> list[np.ndarray]:
        """Batch buffers for one camera's encoder thread: the pooled set, or a new one."""
        with self._lock:
            pooled = self._free_buffers.pop(cam.key, None)
        if pooled is not None:
            return pooled
        buffers = []
        for _ in range(ENCODE_BUFFERS):
            buf = np.empty((ENCODE_BATCH_FRAMES, cam.height, cam.width, 3), np.uint8)
            buf.fill(0)  # touch the pages once, here, not in the middle of an episode
            buffers.append(buf)
        return buffers

    def _give_back_buffers(self, key: str, buffers: list[np.ndarray]) -> None:
        """Keep one set per camera for the next episode (more exist only with parallel episodes)."""
        with self._lock:
            self._free_buffers.setdefault(key, buffers)

    def close(self) -> None:
        """Release the dataset lock. Episodes still in progress can no longer commit."""
        if self._closed:
            return
        self._closed = True
        self._free_buffers = {}
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

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

    def _real_parent(self, path: Path) -> None:
        """Make ``path``'s parent directories, each a real directory inside the dataset."""
        rel = path.parent.relative_to(self.root)
        fsafe.contained(self.root, rel, "dir")
        path.parent.mkdir(parents=True, exist_ok=True)
        fsafe.contained(self.root, rel, "dir")

    def _data_path(self, episode_index: int) -> Path:
        chunk = layout.episode_chunk(episode_index, self.chunks_size)
        return self._path_from_template(
            "data_path", layout.DATA_PATH, episode_chunk=chunk, episode_index=episode_index
        )

    def _video_path(self, episode_index: int, key: str) -> Path:
        chunk = layout.episode_chunk(episode_index, self.chunks_size)
        return self._path_from_template(
            "video_path", layout.VIDEO_PATH,
            episode_chunk=chunk, episode_index=episode_index, video_key=key,
        )  # fmt: skip

    def _commit(self, episode: EpisodeWriter, extra: dict[str, Any]) -> int:
        n = episode.length
        vectors = {
            v.name: np.concatenate(episode._vector_parts[v.name], axis=0)
            if episode._vector_parts[v.name]
            else np.zeros((0, v.dim), np.float32)
            for v in self.vectors
        }
        capture_time = np.concatenate(episode._capture_parts)
        frame_index = np.arange(n, dtype=np.int64)
        timestamp = (frame_index / self.fps).astype(np.float32)

        with self._lock:
            if self._closed:
                raise DatasetError(f"{self.root}: writer is closed")
            ep = self._next_episode
            task = episode.task
            new_task = task not in self._tasks
            task_index = len(self._tasks) if new_task else self._tasks[task]
            if new_task and task_index in self._tasks.values():
                task_index = max(self._tasks.values()) + 1
            start = self._total_frames

            columns: dict[str, pa.Array] = {}
            for v in self.vectors:
                flat = pa.array(vectors[v.name].reshape(-1), type=pa.float32())
                columns[v.name] = pa.FixedSizeListArray.from_arrays(flat, v.dim)
            columns["timestamp"] = pa.array(timestamp, type=pa.float32())
            if self._has_capture_time:
                columns[CAPTURE_TIME] = pa.array(capture_time, type=pa.float64())
            columns["frame_index"] = pa.array(frame_index)
            columns["episode_index"] = pa.array(np.full(n, ep, dtype=np.int64))
            columns["index"] = pa.array(np.arange(start, start + n, dtype=np.int64))
            columns["task_index"] = pa.array(np.full(n, task_index, dtype=np.int64))
            table = pa.table(columns).replace_schema_metadata(
                {"huggingface": huggingface_schema_metadata(self.features)}
            )

            ep_stats = dict(episode._image_stats_results())
            histograms = episode._image_histograms()
            for v in self.vectors:
                ep_stats[v.name] = _finite_row_stats(vectors[v.name])
            scalar_columns = ["timestamp", "frame_index", "episode_index", "index", "task_index"]
            if self._has_capture_time:
                scalar_columns.insert(1, CAPTURE_TIME)
            for name in scalar_columns:
                ep_stats[name] = _finite_row_stats(columns[name].to_numpy().reshape(n, 1))
            ep_stats = {k: ep_stats[k] for k in self.features if ep_stats.get(k) is not None}

            row: dict[str, Any] = {"episode_index": ep, "tasks": [task], "length": n}
            if self.cameras:
                row["video_keys"] = [c.key for c in self.cameras]
            row.update(extra)

            data_path = self._data_path(ep)
            tmp = data_path.with_name(atomic.TMP_PREFIX + data_path.name)
            moved: list[Path] = []
            rollback: list[tuple[Path, int]] = []

            def append_row(rel: str, row: dict[str, Any]) -> None:
                """Append one jsonl row, remembering the old size to take it back on failure."""
                path = self.root / rel
                rollback.append(_size_mark(path))
                atomic.append_jsonl_inplace(path, [row], durable=self.durable)

            # `eva qc` refuses a verdict for episode ep while this marker is locked.
            with flocked(self.work_root / saving_marker_name(ep), unlink=True):
                try:
                    self._real_parent(data_path)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)  # a planted link there would be written through
                    pq.write_table(table, tmp)
                    # Committed raw evidence is read-only (0444 under the usual umask): an
                    # export may then share it by hard link without exposing it to writes.
                    fsafe.make_read_only(tmp)
                    if self.durable:
                        fd = fsafe.open_regular(tmp)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                    os.replace(tmp, data_path)
                    moved.append(data_path)
                    for cam in self.cameras:
                        dest = self._video_path(ep, cam.key)
                        self._real_parent(dest)
                        fsafe.make_read_only(episode._video_files[cam.key])
                        os.replace(episode._video_files[cam.key], dest)
                        moved.append(dest)
                    if self.durable:
                        for d in {p.parent for p in moved}:
                            atomic.fsync_dir(d)
                    if new_task:
                        append_row(layout.TASKS, {"task_index": task_index, "task": task})
                    if histograms:
                        append_row(
                            layout.IMAGE_HISTOGRAMS, {"episode_index": ep, "histograms": histograms}
                        )
                    append_row(layout.EPISODES_STATS, {"episode_index": ep, "stats": ep_stats})
                    # Commit point: from here on the episode exists. The meta lock keeps a
                    # concurrent `eva qc` rewrite of episodes.jsonl from losing this row.
                    with meta_lock(self.root):
                        atomic.append_jsonl_inplace(
                            self.root / layout.EPISODES, [row], durable=self.durable
                        )
                except BaseException:
                    for p in moved:
                        with contextlib.suppress(OSError):
                            p.unlink()
                    with contextlib.suppress(OSError):
                        tmp.unlink()
                    # Take back the rows appended before the commit point (nobody else writes
                    # these two files); a torn episodes.jsonl fragment is healed by the next append.
                    for path, size in reversed(rollback):
                        with contextlib.suppress(OSError):
                            os.truncate(path, size)
                    raise

            if new_task:
                self._tasks[task] = task_index
            self._episode_indices.add(ep)
            self._next_episode = ep + 1
            self._total_frames += n
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
            return ep


class _StopWork:
    """Queue message that ends an encoder thread: flush and close the MP4, or discard it."""

    def __init__(self, close: bool) -> None:
        self.close = close


class _CameraEncoder:
    """One camera of an episode: its MP4 encoder and its image stats, fed from ONE thread.

    Threaded (``buffers`` given): ``submit`` copies frames into a free batch buffer and queues
    it; the worker encodes it, updates the stats and hands the buffer back. At most
    ``len(buffers)`` batches are in flight, so ``submit`` blocks while the encoder is behind.
    Inline (``buffers`` None): ``submit`` encodes in the calling thread.
    """

    def __init__(
        self,
        cam: CameraSpec,
        path: Path,
        fps: int,
        options: VideoOptions,
        buffers: list[np.ndarray] | None,
        codec_threads: int | None = None,
    ) -> None:
        self.cam = cam
        self.path = path
        self.fps = fps
        self.options = options
        self.codec_threads = codec_threads
        self.encoder: VideoEncoder | None = None
        self.stats = ImageStats()
        self.error: BaseException | None = None  # first failure of the encoder / stats
        self.buffers = buffers
        self._thread: threading.Thread | None = None
        if buffers is not None:
            self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
            for buf in buffers:
                self._free.put(buf)
            self._todo: queue.SimpleQueue[tuple[np.ndarray, int] | _StopWork] = queue.SimpleQueue()
            # Daemon: an episode its owner never commits or aborts must not hang interpreter exit.
            self._thread = threading.Thread(
                target=self._run, name=f"eva-encode-{path.stem}", daemon=True
            )
            self._thread.start()

    @property
    def frames_written(self) -> int:
        return self.encoder.frames_written if self.encoder is not None else 0

    def _encode(self, frames: np.ndarray) -> None:
        if self.encoder is None:
            self.encoder = VideoEncoder(
                self.path, self.cam.width, self.cam.height, self.fps, self.options,
                thread_count=self.codec_threads,
            )  # fmt: skip
        self.encoder.write(frames)
        self.stats.update(frames)

    def _run(self) -> None:
        while True:
            item = self._todo.get()
            if isinstance(item, _StopWork):
                self._finish_inline(item.close)
                return
            buf, n = item
            try:
                if self.error is None:
                    self._encode(buf[:n])
            except BaseException as e:  # reported to the producer by the next submit/finish
                self.error = e
            finally:
                self._free.put(buf)

    def _finish_inline(self, close: bool) -> None:
        if self.encoder is None:
            return
        if close and self.error is None:
            try:
                self.encoder.close()
            except BaseException as e:
                self.error = e
        else:
            self.encoder.abort()

    def submit(self, frames: np.ndarray) -> None:
        """Encode ``frames`` (n, H, W, 3) uint8; the caller may reuse them once this returns."""
        if self.error is not None:
            return
        if self._thread is None:
            try:
                self._encode(frames)
            except BaseException as e:
                self.error = e
            return
        for start in range(0, len(frames), ENCODE_BATCH_FRAMES):
            part = frames[start : start + ENCODE_BATCH_FRAMES]
            buf = self._free.get()  # waits while ENCODE_BUFFERS batches are in flight
            if self.error is not None:
                self._free.put(buf)
                return
            np.copyto(buf[: len(part)], part)
            self._todo.put((buf, len(part)))

    def request_stop(self, close: bool) -> None:
        """Ask the worker to finish after the queued batches (close) or to discard (abort)."""
        if self._thread is not None:
            self._todo.put(_StopWork(close))

    def join(self, close: bool) -> None:
        """Wait for the worker (after ``request_stop``); inline: close or abort here."""
        if self._thread is None:
            self._finish_inline(close)
            return
        self._thread.join()

    def failure(self) -> str | None:
        if self.error is None:
            return None
        text = error_line(self.error)
        return f"camera {self.cam.key}: encoding {self.path.name} failed ({text})"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _abandon_cameras(cameras: list[_CameraEncoder]) -> None:
    for camera in cameras:
        camera.request_stop(close=False)  # a no-op for threads already ended


class EpisodeWriter:
    """One episode being recorded: ``add_frames`` batches, then ``commit`` or ``abort``."""

    def __init__(self, writer: DatasetWriter, task: str) -> None:
        self.writer = writer
        self.task = task
        self.length = 0
        self.work_dir = Path(tempfile.mkdtemp(prefix="ep-", dir=writer.work_root))
        self._cameras: dict[str, _CameraEncoder] = {}  # started on the first frames
        self._video_files = {
            c.key: self.work_dir / f"{i:02d}.mp4" for i, c in enumerate(writer.cameras)
        }
        self._vector_parts: dict[str, list[np.ndarray]] = {v.name: [] for v in writer.vectors}
        self._capture_parts: list[np.ndarray] = []
        self._done = False
        self._failure: str | None = None  # why the episode was aborted by an encoder failure

    def _check_open(self) -> None:
        if self._failure is not None:
            raise DatasetError(f"episode in {self.work_dir} was aborted: {self._failure}")
        if self._done:
            raise DatasetError(f"episode in {self.work_dir}: already committed or aborted")

    def _start_cameras(self) -> None:
        w = self.writer
        # With at least one camera thread per CPU the cores are busy already: x264's slice
        # threads would only add synchronisation (measured: ~8% less CPU and ~8% more speed in
        # the 3-camera capture bench). Fewer cameras keep the codec's default threading.
        codec_threads = 1 if w.parallel_encode and len(w.cameras) >= _usable_cpus() else None
        for cam in w.cameras:
            buffers = w._take_buffers(cam) if w.parallel_encode else None
            self._cameras[cam.key] = _CameraEncoder(
                cam, self._video_files[cam.key], w.fps, w.video, buffers, codec_threads
            )
        # An episode dropped without commit/abort must not leave its encoder threads waiting
        # forever: when it is collected they discard their files and end (the work dir is
        # removed by the next writer that opens the dataset).
        weakref.finalize(self, _abandon_cameras, list(self._cameras.values()))

    def _raise_on_failure(self) -> None:
        """An encoder failed: abort the whole episode and raise its reason."""
        for camera in self._cameras.values():
            failure = camera.failure()
            if failure is not None:
                self._failure = failure
                self.abort()
                raise DatasetError(failure) from camera.error

    def add_frames(
        self,
        images: Mapping[str, np.ndarray] | None = None,
        vectors: Mapping[str, np.ndarray] | None = None,
        capture_time: np.ndarray | Sequence[float] | None = None,
    ) -> None:
        """Append n aligned frames: every camera (n,H,W,3) uint8, every vector (n,dim).

        ``capture_time`` (n,) float64 seconds; omitted, it defaults to the fps grid instants.
        Images are handed to the cameras' encoders right away (never held past a few batches;
        the arrays may be reused once this returns); vectors are buffered until commit. An
        encoder failure (this batch's or an earlier one's) aborts the episode and raises.
        """
        self._check_open()
        self._raise_on_failure()
        images = dict(images or {})
        vectors = dict(vectors or {})
        w = self.writer
        where = f"{w.root}: add_frames"  # errors name the dataset and the field
        want_cams = {c.key for c in w.cameras}
        want_vecs = {v.name for v in w.vectors}
        if set(images) != want_cams:
            raise DatasetError(
                f"{where}: images for {sorted(images)}, dataset cameras are {sorted(want_cams)}"
            )
        if set(vectors) != want_vecs:
            raise DatasetError(
                f"{where}: vectors {sorted(vectors)}, dataset vectors are {sorted(want_vecs)}"
            )
        counts = {k: len(a) for k, a in {**images, **vectors}.items()}
        if capture_time is not None:
            capture_time = np.asarray(capture_time, dtype=np.float64).reshape(-1)
            counts["capture_time"] = len(capture_time)
        if not counts:
            raise DatasetError(f"{where}: a dataset without cameras or vectors needs capture_time")
        n = next(iter(counts.values()))
        if any(c != n for c in counts.values()):
            raise DatasetError(f"{where}: frame counts differ between fields {counts}")
        if n == 0:
            return
        batches: dict[str, np.ndarray] = {}
        for cam in w.cameras:
            batch = np.asarray(images[cam.key])
            if batch.dtype != np.uint8 or batch.shape != (n, cam.height, cam.width, 3):
                raise DatasetError(
                    f"{where}: camera {cam.key} batch is {batch.dtype}{tuple(batch.shape)}, "
                    f"expected uint8({n}, {cam.height}, {cam.width}, 3)"
                )
            batches[cam.key] = batch
        checked: dict[str, np.ndarray] = {}
        for vec in w.vectors:
            arr = np.asarray(vectors[vec.name])
            if arr.shape != (n, vec.dim):
                raise DatasetError(
                    f"{where}: vector {vec.name} shape {tuple(arr.shape)} != ({n}, {vec.dim})"
                )
            checked[vec.name] = arr.astype(np.float32, copy=True)
        if capture_time is None:
            capture_time = (np.arange(self.length, self.length + n) / w.fps).astype(np.float64)
        if w.cameras and not self._cameras:
            self._start_cameras()
        for key, batch in batches.items():
            self._cameras[key].submit(batch)
        self._raise_on_failure()
        for name, arr in checked.items():
            self._vector_parts[name].append(arr)
        self._capture_parts.append(np.array(capture_time, dtype=np.float64))
        self.length += n

    def _image_stats_results(self) -> dict[str, Any]:
        """Per camera stats (only valid once the encoder threads have been joined)."""
        return {key: camera.stats.result() for key, camera in self._cameras.items()}

    def _image_histograms(self) -> dict[str, list[list[int]]]:
        """Per camera (3, 256) pixel counts as JSON lists (valid once the threads are joined)."""
        return {key: camera.stats.histogram().tolist() for key, camera in self._cameras.items()}

    def _stop_cameras(self, close: bool) -> None:
        """Finish every camera's encoder (in parallel when threaded) and pool the buffers."""
        for camera in self._cameras.values():
            camera.request_stop(close)
        for camera in self._cameras.values():
            camera.join(close)
            if camera.buffers is not None:
                self.writer._give_back_buffers(camera.cam.key, camera.buffers)
                camera.buffers = None

    def commit(self, extra_row_fields: Mapping[str, Any] | None = None) -> int | None:
        """Publish the episode; returns its index, or None (nothing written) for zero frames.

        ``extra_row_fields`` go into the episodes.jsonl row (quality, quality_issues, timing...).
        Waits for the cameras' encoders; if one failed, the episode is aborted and this raises.
        """
        self._check_open()
        extra = _jsonable(dict(extra_row_fields or {}), "extra_row_fields")
        clash = RESERVED_ROW_KEYS & set(extra)
        if clash:
            raise DatasetError(f"extra_row_fields may not set {sorted(clash)}")
        if self.length == 0:
            self.abort()
            return None
        try:
            self._stop_cameras(close=True)
            self._raise_on_failure()
            for key, camera in self._cameras.items():
                if camera.frames_written != self.length:
                    raise DatasetError(
                        f"camera {key}: encoded {camera.frames_written} frames, episode has "
                        f"{self.length}"
                    )
            episode_index = self.writer._commit(self, extra)
        except BaseException:
            self.abort()
            raise
        self._done = True
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return episode_index

    def abort(self) -> None:
        """Drop the episode: stop the encoders, remove the work dir. Idempotent."""
        self._done = True
        self._stop_cameras(close=False)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None or not self._done:
            self.abort()
