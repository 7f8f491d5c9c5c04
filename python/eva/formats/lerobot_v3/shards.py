"""Where a v3 subset's rows and frames go: data shards, per-camera video shards, and the quantiles collected on the way."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from eva.dataset.columns import fixed_size_values, list_lengths, list_values
from eva.dataset.errors import DatasetError
from eva.dataset.stats import (
    DEFAULT_QUANTILES,
    ImageStats,
    quantile_key,
    quantiles_from_histogram,
    vector_quantile_table,
    vector_quantiles,
)
from eva.formats._decode import decode_frames
from eva.formats.lerobot_v3.mux import decode_keyframes
from eva.formats.lerobot_v3.video import StreamParams

# --------------------------------------------------------------------------------------------------
# Video files
# --------------------------------------------------------------------------------------------------


@dataclass
class PlacedEpisode:
    """Where an episode landed in its video file; ``keyframes``: the packets kept for the
    quantile sample, with their stream's parameters (None: no sample)."""

    episode: int
    from_timestamp: float
    to_timestamp: float
    frames: int
    keyframes: tuple[StreamParams, list[bytes]] | None = None
    cut: int = 0  # recorded frames of the shard its trim leaves out (outside from..to)


class KeyframeHistograms:
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
        self._lock = threading.Lock()  # video files written on two threads share this

    def submit(self, params: StreamParams, packets: list[bytes]) -> Future[np.ndarray]:
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            oldest = self._pending[: max(0, len(self._pending) - self._max_pending + 1)]
            del self._pending[: len(oldest)]
        for future in oldest:  # outside the lock: the other writer need not wait for these
            future.result()
        future = self._executor.submit(_keyframe_histogram, params, packets)
        with self._lock:
            self._pending.append(future)
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _keyframe_histogram(params: StreamParams, packets: list[bytes]) -> np.ndarray:
    stats = ImageStats()
    decode_keyframes(params, packets, stats.update)
    return stats.histogram()


def decode_shard(path: Path, key: str, placed: list[PlacedEpisode]) -> dict[int, np.ndarray]:
    """Decode every frame of a finished shard: count each episode's frames by timestamp (they
    must equal its rows) and return each episode's exact pixel histogram."""
    stats = {ep.episode: ImageStats() for ep in placed}
    counts = dict.fromkeys(stats, 0)
    # Episode boundaries, shifted half a frame down so float rounding never moves a frame across;
    # a trimmed episode's cut frames lie outside its [from, to) and belong to none.
    halves = [(ep.to_timestamp - ep.from_timestamp) / ep.frames / 2 for ep in placed]
    starts = np.asarray([ep.from_timestamp - h for ep, h in zip(placed, halves, strict=True)])
    ends = [ep.to_timestamp - h for ep, h in zip(placed, halves, strict=True)]
    order = [ep.episode for ep in placed]
    stray = -sum(ep.cut for ep in placed)
    for t, frame in decode_frames(path):
        slot = int(np.searchsorted(starts, t, side="right")) - 1
        if slot < 0 or t >= ends[slot]:
            stray += 1
            continue
        episode = order[slot]
        counts[episode] += 1
        stats[episode].update(frame)
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


def numeric_vector_columns(table: pa.Table, features: Mapping[str, Any]) -> list[str]:
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


def column_matrix(table: pa.Table, name: str, where: str) -> np.ndarray:
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


def episode_quantiles(columns: Mapping[str, np.ndarray]) -> dict[str, dict[str, list[float]]]:
    """``vector_quantiles`` of every (n, dim) column (``column_matrix`` output), from ONE
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


class QuantileCollector:
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
