"""Per-episode feature statistics (LeRobot ``episodes_stats`` / ``stats.json`` shape) and their merge.

Two accumulators are fed batch by batch while an episode is written, so no episode is ever held
whole in memory:

* ``VectorStats(dim)`` for state/action-like columns: per-dimension min, max, mean, population std.
  Accumulation is float64 (in float32, every addition to a running sum near 10^5 is rounded to
  about 0.008, so a long episode's sums drift). For numerical stability each batch is reduced with a two-pass mean / M2 (sum of
  squared deviations from the batch mean, never the cancellation-prone ``E[x^2] - E[x]^2``), and
  batches are combined with Chan et al.'s parallel update::

      n = na + nb;  delta = mean_b - mean_a
      mean = mean_a + delta * nb / n;  M2 = M2a + M2b + delta^2 * na * nb / n

  so the error stays at the level of one batch's rounding, independent of the signal's offset.

* ``ImageStats()`` for camera frames (n, H, W, 3) uint8: the only thing accumulated is an exact
  per-channel 256-bin histogram (uint64). Everything else follows from it exactly: min/max are the
  first/last non-empty bins, sum and sum of squares are ``sum(v * h[v])`` and ``sum(v^2 * h[v])``
  in Python integers, so mean and std are exact (one rounding at the end), and exact quantiles are
  available through ``quantiles_from_histogram``. Results use the 0..1 scale and LeRobot's
  ``[3][1][1]`` nesting. LeRobot 0.3.3 samples (and downsamples) frames and counts the sampled
  frames; eva reduces every pixel of every frame and counts every frame (``count = [n_frames]``).

The public ``VectorStats`` / ``ImageStats`` use the native kernel ``eva_fast.stats`` when
``eva._native.load("stats")`` returns it; ``ReferenceVectorStats`` / ``ReferenceImageStats`` are the
plain numpy definitions the native kernel is tested against.

``merge_stats`` and ``RunningMerge`` (``eva.dataset.stats_merge``, re-exported here) build
dataset-level stats (``meta/stats.json``) from per-episode stats.

NaN/inf values (in an export asked to carry them) are left out of every stat: ``finite_rows``
for min/max/mean/std, each dimension's finite values for the quantiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from eva import _native
from eva.dataset.stats_merge import RunningMerge as RunningMerge  # re-exported
from eva.dataset.stats_merge import merge_stats as merge_stats  # re-exported

__all__ = [
    "DEFAULT_QUANTILES",
    "ImageStats",
    "ReferenceImageStats",
    "ReferenceVectorStats",
    "RunningMerge",
    "VectorStats",
    "merge_stats",
    "quantile_key",
    "quantiles_from_histogram",
    "finite_rows",
    "image_stats_from_histogram",
    "vector_quantile_table",
    "vector_quantiles",
]

# The quantiles LeRobot >= 0.4 uses for quantile normalisation.
DEFAULT_QUANTILES: tuple[float, ...] = (0.01, 0.10, 0.50, 0.90, 0.99)

_CHANNELS = 3
_BINS = 256


def quantile_key(q: float) -> str:
    """``0.01 -> "q01"``, ``0.5 -> "q50"``, ``0.995 -> "q99.5"`` (LeRobot's key names)."""
    percent = q * 100.0
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r} is outside [0, 1]")
    rounded = round(percent)
    if abs(percent - rounded) < 1e-9:
        return f"q{rounded:02d}"
    return f"q{percent:g}"


def _image_nested(per_channel: Sequence[float]) -> list[list[list[float]]]:
    """Per-channel values -> LeRobot's image stat shape [3][1][1]."""
    return [[[float(v)]] for v in per_channel]


# --------------------------------------------------------------------------------------------------
# Vectors
# --------------------------------------------------------------------------------------------------


def _as_float64_rows(batch: Any, dim: int) -> np.ndarray:
    """(n, dim) or (n,) numeric input -> C-contiguous (n, dim) float64 (no copy when already so)."""
    array = np.asarray(batch)
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"expected a (n, {dim}) array, got shape {array.shape}")
    if array.dtype.kind not in "biuf":
        raise ValueError(f"expected a numeric array, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float64)


class ReferenceVectorStats:
    """Numpy reference: running per-dim count, min, max, mean, M2 in float64 (see module doc)."""

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"vector dim must be >= 1, got {dim}")
        self.dim = dim
        self.count = 0
        self._min = np.full(dim, np.inf)
        self._max = np.full(dim, -np.inf)
        self._mean = np.zeros(dim)
        self._m2 = np.zeros(dim)

    def update(self, batch: Any) -> None:
        rows = _as_float64_rows(batch, self.dim)
        n_b = rows.shape[0]
        if n_b == 0:
            return
        mean_b = rows.mean(axis=0)
        m2_b = np.square(rows - mean_b).sum(axis=0)
        # np.minimum propagates NaN, like np.min over the concatenated data.
        self._min = np.minimum(self._min, rows.min(axis=0))
        self._max = np.maximum(self._max, rows.max(axis=0))
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self._mean
        self._mean = self._mean + delta * (n_b / n)
        self._m2 = self._m2 + m2_b + np.square(delta) * (n_a * n_b / n)
        self.count = n

    def result(self) -> dict[str, list[float] | list[int]]:
        if self.count == 0:
            raise ValueError("no samples were accumulated")
        return _vector_result(self._min, self._max, self._mean, self._m2, self.count)


def _vector_result(
    minimum: np.ndarray, maximum: np.ndarray, mean: np.ndarray, m2: np.ndarray, count: int
) -> dict[str, list[float] | list[int]]:
    std = np.sqrt(np.maximum(m2, 0.0) / count)
    return {
        "min": [float(v) for v in minimum],
        "max": [float(v) for v in maximum],
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "count": [int(count)],
    }


def finite_rows(values: np.ndarray) -> np.ndarray:
    """The rows of (n, dim) ``values`` whose values are all finite (all rows when they are).

    NaN/inf reach an export only when it is asked to carry them (``allow_non_finite``); the
    mean/std/min/max stats then describe the finite rows, as the capture writer's per-episode
    stats do, because JSON cannot hold NaN and one NaN would poison every merged stat.
    """
    finite = np.isfinite(values).all(axis=1)
    return values if finite.all() else values[finite]


def _linear_quantiles(array: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.quantile(array, q, axis=0)`` for a finite (n, dim) float64 array and 1-D float64
    ``q``, the same floats: the same order statistics (a partition at the same ranks) and numpy's
    own interpolation (its ``_lerp``: from below for weights under 0.5, from above otherwise).
    Written out because ``np.quantile`` calls ``np.unique``, which imports ``numpy.ma`` (15 ms of
    every v3 export); ``tests/test_stats.py`` compares the two."""
    n = array.shape[0]
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    following = previous + 1
    last = virtual >= n - 1  # numpy takes the maximum there (rank -1 for both)
    previous[last] = -1
    following[last] = -1
    first = virtual < 0
    previous[first] = 0
    following[first] = 0
    previous_ranks = previous.astype(np.intp)
    following_ranks = following.astype(np.intp)
    ranks = {
        0,
        n - 1,
        *(int(r) % n for r in previous_ranks),
        *(int(r) % n for r in following_ranks),
    }
    ordered = np.array(array, dtype=np.float64)
    ordered.partition(sorted(ranks), axis=0)
    below = ordered[previous_ranks]
    above = ordered[following_ranks]
    gamma = (virtual - previous_ranks).reshape(-1, 1)
    difference = above - below
    result: np.ndarray = np.add(below, difference * gamma)
    np.subtract(above, difference * (1 - gamma), out=result, where=gamma >= 0.5)
    return result


def vector_quantile_table(values: Any, qs: Sequence[float] = DEFAULT_QUANTILES) -> np.ndarray:
    """(len(qs), dim) exact per-dim quantiles of (n, dim) values (numpy's default linear
    interpolation) over each dimension's finite values; NaN in a dimension without any."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"expected a non-empty (n, dim) array, got shape {array.shape}")
    q = np.asarray(qs, dtype=np.float64)
    finite = np.isfinite(array)
    if finite.all():
        return _linear_quantiles(array, q)
    # nanquantile leaves NaN out; inf becomes NaN first. A dimension with no finite value at all
    # is computed on zeros (no All-NaN warning) and set to NaN afterwards.
    empty = ~finite.any(axis=0)
    array = np.where(finite, array, np.nan)
    array[:, empty] = 0.0
    table = np.nanquantile(array, q, axis=0)
    table[:, empty] = np.nan
    return table


def vector_quantiles(
    values: Any, qs: Sequence[float] = DEFAULT_QUANTILES
) -> dict[str, list[float]]:
    """Exact per-dim quantiles of (n, dim) values (numpy's default linear interpolation), over
    the finite values (see ``finite_rows``); empty when a dimension has no finite value (JSON
    cannot carry the NaN it would be)."""
    table = vector_quantile_table(values, qs)
    if np.isnan(table).any():
        return {}
    return {quantile_key(q): [float(v) for v in row] for q, row in zip(qs, table, strict=True)}


# --------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------


def _as_frames(frames: Any) -> np.ndarray:
    """(n, H, W, 3) or (H, W, 3) uint8 -> C-contiguous (n, H, W, 3) uint8."""
    array = np.asarray(frames)
    if array.ndim == 3:
        array = array[np.newaxis]
    if array.ndim != 4 or array.shape[3] != _CHANNELS:
        raise ValueError(f"expected (n, H, W, 3) frames, got shape {array.shape}")
    if array.dtype != np.uint8:
        raise ValueError(f"expected uint8 frames, got dtype {array.dtype}")
    return np.ascontiguousarray(array)


def reference_channel_histogram(frames: np.ndarray) -> np.ndarray:
    """(n, H, W, 3) uint8 -> (3, 256) uint64 counts, by plain numpy bincount.

    Frame by frame: bincount converts its input to intp, so a whole batch at once would need
    8 bytes of temporary memory per pixel value.
    """
    histogram = np.zeros((_CHANNELS, _BINS), dtype=np.uint64)
    for frame in frames:
        pixels = frame.reshape(-1, _CHANNELS)
        for channel in range(_CHANNELS):
            histogram[channel] += np.bincount(pixels[:, channel], minlength=_BINS).astype(np.uint64)
    return histogram


def _image_result_from_histogram(
    histogram: np.ndarray, frame_count: int
) -> dict[str, list[list[list[float]]] | list[int]]:
    if frame_count == 0:
        raise ValueError("no frames were accumulated")
    minimum: list[float] = []
    maximum: list[float] = []
    mean: list[float] = []
    std: list[float] = []
    for channel in range(_CHANNELS):
        counts = [int(c) for c in histogram[channel]]
        occupied = [v for v in range(_BINS) if counts[v]]
        pixel_count = sum(counts)
        if pixel_count == 0:
            # Frames with zero pixels (H or W = 0): nothing to describe.
            raise ValueError("the accumulated frames contain no pixels")
        # Exact integer moments: mean = S1/N, var = (N*S2 - S1^2) / N^2; one rounding each.
        s1 = sum(v * counts[v] for v in occupied)
        s2 = sum(v * v * counts[v] for v in occupied)
        minimum.append(occupied[0] / 255.0)
        maximum.append(occupied[-1] / 255.0)
        mean.append(s1 / (pixel_count * 255.0))
        std.append(math.sqrt(pixel_count * s2 - s1 * s1) / (pixel_count * 255.0))
    return {
        "min": _image_nested(minimum),
        "max": _image_nested(maximum),
        "mean": _image_nested(mean),
        "std": _image_nested(std),
        "count": [int(frame_count)],
    }


def image_stats_from_histogram(
    histogram: np.ndarray, frame_count: int
) -> dict[str, list[list[list[float]]] | list[int]]:
    """The image stats of ``frame_count`` frames whose (3, 256) pixel histogram is
    ``histogram``: the same result ``ImageStats.result()`` gives after those frames."""
    return _image_result_from_histogram(histogram, frame_count)


class ReferenceImageStats:
    """Numpy reference: exact per-channel histogram; stats derived from it (see module doc)."""

    def __init__(self) -> None:
        self.frame_count = 0
        self._histogram = np.zeros((_CHANNELS, _BINS), dtype=np.uint64)

    def update(self, frames: Any) -> None:
        array = _as_frames(frames)
        if array.shape[0] == 0:
            return
        self._histogram += reference_channel_histogram(array)
        self.frame_count += array.shape[0]

    def histogram(self) -> np.ndarray:
        """(3, 256) uint64 pixel counts per channel and value (a copy)."""
        return self._histogram.copy()

    def result(self) -> dict[str, list[list[list[float]]] | list[int]]:
        return _image_result_from_histogram(self._histogram, self.frame_count)


def quantiles_from_histogram(
    histogram: Any, qs: Sequence[float] = DEFAULT_QUANTILES
) -> dict[str, list[list[list[float]]]]:
    """Exact per-channel quantiles on the 0..1 scale, shape [3][1][1] per key.

    Definition: numpy's default ``np.quantile(..., method="linear")`` (Hyndman & Fan type 7) over
    the channel's sorted pixel values x[0..N-1]: position h = (N - 1) * q, value
    x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]), divided by 255. The sorted values
    are read off the cumulative histogram, so the result equals ``np.quantile`` on the same uint8
    data up to float rounding (documented bound: 1e-12 on the 0..1 scale).
    """
    hist = np.asarray(histogram)
    if hist.ndim != 2 or hist.shape[1] != _BINS:
        raise ValueError(f"expected a (channels, 256) histogram, got shape {hist.shape}")
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q!r} is outside [0, 1]")
    # cumulative[c, v] = pixels of channel c with value <= v; x[k] = first v with cumulative > k.
    # One searchsorted per channel for every quantile's two ranks (the v3 export asks 120 files
    # x 3 channels x 10 quantiles; per-rank calls were ~0.04 s of a 0.9 s export).
    cumulative = np.cumsum(hist.astype(np.uint64, copy=False), axis=1, dtype=np.uint64)
    quantiles: dict[str, list[list[list[float]]]] = {quantile_key(q): [] for q in qs}
    for channel in range(hist.shape[0]):
        total = int(cumulative[channel, -1])
        if total == 0:
            raise ValueError(f"channel {channel} of the histogram is empty")
        positions = [(total - 1) * q for q in qs]
        belows = [math.floor(position) for position in positions]
        ranks = belows + [min(below + 1, total - 1) for below in belows]
        values = np.searchsorted(
            cumulative[channel], np.asarray(ranks, dtype=np.uint64), side="right"
        ).tolist()
        count = len(qs)
        for i, q in enumerate(qs):
            x_below, x_above = values[i], values[count + i]
            value = x_below + (positions[i] - belows[i]) * (x_above - x_below)
            quantiles[quantile_key(q)].append([[value / 255.0]])
    return quantiles


# --------------------------------------------------------------------------------------------------
# Public classes: native kernel when available, else the references
# --------------------------------------------------------------------------------------------------


def _native_stats() -> Any:
    return _native.load("stats")


class _NativeVectorStats:
    """``eva_fast.stats.VectorAccumulator`` behind the ``ReferenceVectorStats`` interface."""

    def __init__(self, native: Any, dim: int) -> None:
        self.dim = dim
        self._acc = native.VectorAccumulator(dim)

    @property
    def count(self) -> int:
        return int(self._acc.count)

    def update(self, batch: Any) -> None:
        array = np.asarray(batch)
        if array.ndim == 1:
            array = array.reshape(-1, 1)
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise ValueError(f"expected a (n, {self.dim}) array, got shape {array.shape}")
        if array.dtype == np.float32:
            self._acc.update_f32(np.ascontiguousarray(array))
        else:
            self._acc.update_f64(_as_float64_rows(array, self.dim))

    def result(self) -> dict[str, list[float] | list[int]]:
        count = self.count
        if count == 0:
            raise ValueError("no samples were accumulated")
        minimum, maximum, mean, m2 = self._acc.moments()
        return _vector_result(minimum, maximum, mean, m2, count)


class _NativeImageStats:
    """``eva_fast.stats.ImageAccumulator`` behind the ``ReferenceImageStats`` interface."""

    def __init__(self, native: Any) -> None:
        self._acc = native.ImageAccumulator()

    @property
    def frame_count(self) -> int:
        return int(self._acc.frame_count)

    def update(self, frames: Any) -> None:
        array = _as_frames(frames)
        if array.shape[0] == 0:
            return
        self._acc.update(array.reshape(-1), array.shape[0])

    def histogram(self) -> np.ndarray:
        return np.asarray(self._acc.histogram(), dtype=np.uint64).reshape(_CHANNELS, _BINS)

    def result(self) -> dict[str, list[list[list[float]]] | list[int]]:
        return _image_result_from_histogram(self.histogram(), self.frame_count)


class VectorStats:
    """Per-dim float64 stats of (n, dim) batches; native kernel when built (see module doc)."""

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"vector dim must be >= 1, got {dim}")
        self.dim = dim
        native = _native_stats()
        self._impl: _NativeVectorStats | ReferenceVectorStats = (
            _NativeVectorStats(native, dim) if native is not None else ReferenceVectorStats(dim)
        )

    @property
    def count(self) -> int:
        return self._impl.count

    def update(self, batch: Any) -> None:
        self._impl.update(batch)

    def result(self) -> dict[str, list[float] | list[int]]:
        return self._impl.result()


class ImageStats:
    """Exact per-channel image stats of (n, H, W, 3) uint8 batches; native kernel when built."""

    def __init__(self) -> None:
        native = _native_stats()
        self._impl: _NativeImageStats | ReferenceImageStats = (
            _NativeImageStats(native) if native is not None else ReferenceImageStats()
        )

    @property
    def frame_count(self) -> int:
        return self._impl.frame_count

    def update(self, frames: Any) -> None:
        self._impl.update(frames)

    def histogram(self) -> np.ndarray:
        """(3, 256) uint64 pixel counts per channel and value (a copy)."""
        return self._impl.histogram()

    def result(self) -> dict[str, list[list[list[float]]] | list[int]]:
        return self._impl.result()
