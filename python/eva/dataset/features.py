"""The feature layout of a raw LeRobot v2.1 dataset: what cameras and vectors a writer records,
the ``features`` map of ``meta/info.json`` they give, and the columns and per-episode stats of
one episode's parquet table (docs/design.md).

Table order is: vectors, videos (MP4s beside the table, not columns), timestamp, capture_time,
then the bookkeeping indices LeRobot adds to every table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.limits import MAX_VECTOR_DIM, image_size_problem
from eva.dataset.stats import VectorStats
from eva.dataset.video import VideoOptions

__all__ = [
    "CAPTURE_TIME",
    "CameraSpec",
    "INDEX_FEATURES",
    "VectorSpec",
    "build_features",
    "check_features",
    "default_feature_names",
    "episode_columns",
    "episode_stats",
    "episode_table",
    "finite_row_stats",
    "huggingface_schema_metadata",
    "specs_from_features",
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


@dataclass(frozen=True)
class CameraSpec:
    """One camera: ``key`` is the video feature name (e.g. ``observation.images.front``)."""

    key: str
    height: int
    width: int

    def __post_init__(self) -> None:
        layout.check_video_key(self.key)
        problem = image_size_problem(self.width, self.height)
        if problem is not None:
            raise ValueError(f"camera {self.key}: {problem}")


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
        if not 1 <= self.dim <= MAX_VECTOR_DIM:
            raise ValueError(f"vector {self.name}: dim {self.dim} is not in 1..{MAX_VECTOR_DIM}")
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


def check_features(
    features: Mapping[str, Any],
    cameras: Sequence[CameraSpec],
    vectors: Sequence[VectorSpec],
    codec: str,
    path: Path,
) -> None:
    """An existing dataset's ``features`` (from ``path``) hold exactly the requested cameras (key,
    size, ``codec`` video) and vectors (name, float32 dim); a ``DatasetError`` names the first
    difference."""
    want_cams = {c.key: c for c in cameras}
    want_vecs = {v.name: v for v in vectors}
    have_cams = {k for k, f in features.items() if f.get("dtype") == "video"}
    if have_cams != set(want_cams):
        raise DatasetError(f"{path}: cameras {sorted(have_cams)} != requested {sorted(want_cams)}")
    for key, cam in want_cams.items():
        feat = features[key]
        if list(feat.get("shape", [])) != [cam.height, cam.width, 3]:
            raise DatasetError(
                f"{path}: feature {key} shape {feat.get('shape')} != [{cam.height}, {cam.width}, 3]"
            )
        have_codec = (feat.get("info") or {}).get("video.codec")
        if have_codec not in (None, codec):
            raise DatasetError(
                f"{path}: feature {key} is {have_codec} video, writer encodes {codec}"
            )
    skip = set(INDEX_FEATURES) | {CAPTURE_TIME} | have_cams
    have_vecs = {k for k in features if k not in skip}
    if have_vecs != set(want_vecs):
        raise DatasetError(f"{path}: vectors {sorted(have_vecs)} != requested {sorted(want_vecs)}")
    for name, vec in want_vecs.items():
        feat = features[name]
        if feat.get("dtype") != "float32" or list(feat.get("shape", [])) != [vec.dim]:
            raise DatasetError(
                f"{path}: feature {name} is {feat.get('dtype')}{feat.get('shape')}, "
                f"requested float32[{vec.dim}]"
            )


def specs_from_features(
    features: dict[str, Any],
) -> tuple[list[CameraSpec], list[VectorSpec], str]:
    """The cameras, vectors and encoder an info.json's features declare (KeyError, IndexError,
    TypeError or ValueError when they are malformed)."""
    cameras: list[CameraSpec] = []
    vectors: list[VectorSpec] = []
    codec = "libx264"
    skip = set(INDEX_FEATURES) | {CAPTURE_TIME}
    for name, feature in features.items():
        if not isinstance(feature, dict) or name in skip:
            continue
        shape = list(feature.get("shape") or [])
        if feature.get("dtype") == "video":
            cameras.append(CameraSpec(name, int(shape[0]), int(shape[1])))
            info_codec = (feature.get("info") or {}).get("video.codec")
            codec = {"av1": "libsvtav1"}.get(str(info_codec), codec)
        else:
            names = feature.get("names")
            names = names if isinstance(names, list) and len(names) == shape[0] else None
            vectors.append(VectorSpec(name, int(shape[0]), names))
    return cameras, vectors, codec


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


def finite_row_stats(values: np.ndarray) -> dict[str, Any] | None:
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


def episode_columns(
    vectors: Sequence[VectorSpec],
    values: Mapping[str, np.ndarray],
    capture_time: np.ndarray,
    *,
    with_capture_time: bool,
    fps: int,
    episode_index: int,
    first_index: int,
    task_index: int,
) -> dict[str, pa.Array]:
    """The columns of one episode's table in table order: each vector's (n, dim) ``values``, the
    fps-grid timestamp, the (n,) ``capture_time`` (unless the dataset was created without that
    column) and the bookkeeping indices, its global ``index`` counting up from ``first_index``."""
    n = len(capture_time)
    frame_index = np.arange(n, dtype=np.int64)
    columns: dict[str, pa.Array] = {}
    for v in vectors:
        flat = pa.array(values[v.name].reshape(-1), type=pa.float32())
        columns[v.name] = pa.FixedSizeListArray.from_arrays(flat, v.dim)
    columns["timestamp"] = pa.array((frame_index / fps).astype(np.float32), type=pa.float32())
    if with_capture_time:
        columns[CAPTURE_TIME] = pa.array(capture_time, type=pa.float64())
    columns["frame_index"] = pa.array(frame_index)
    columns["episode_index"] = pa.array(np.full(n, episode_index, dtype=np.int64))
    columns["index"] = pa.array(np.arange(first_index, first_index + n, dtype=np.int64))
    columns["task_index"] = pa.array(np.full(n, task_index, dtype=np.int64))
    return columns


def episode_table(
    columns: Mapping[str, pa.Array], features: Mapping[str, Mapping[str, Any]]
) -> pa.Table:
    """The parquet table of ``episode_columns``, with the ``huggingface`` schema metadata."""
    return pa.table(dict(columns)).replace_schema_metadata(
        {"huggingface": huggingface_schema_metadata(features)}
    )


def episode_stats(
    columns: Mapping[str, pa.Array],
    vectors: Sequence[VectorSpec],
    values: Mapping[str, np.ndarray],
    image_stats: Mapping[str, Any],
    features: Mapping[str, Any],
) -> dict[str, Any]:
    """The episodes_stats.jsonl stats of one episode, in feature order: each camera's
    ``image_stats``, each vector's and each scalar column's over its finite rows (a feature
    without finite rows has none)."""
    stats = dict(image_stats)
    for v in vectors:
        stats[v.name] = finite_row_stats(values[v.name])
    n = len(columns["timestamp"])
    scalar_columns = ["timestamp", "frame_index", "episode_index", "index", "task_index"]
    if CAPTURE_TIME in columns:
        scalar_columns.insert(1, CAPTURE_TIME)
    for name in scalar_columns:
        stats[name] = finite_row_stats(columns[name].to_numpy().reshape(n, 1))
    return {k: stats[k] for k in features if stats.get(k) is not None}
