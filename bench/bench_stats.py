"""Per-episode statistics: native kernel vs numpy reference vs a plain byte copy.

``report(quick)`` rows (times are the best of several repeats, measured in this run):

* image stats over 300 frames of 480x640x3 (fed in batches of 30 frames, the way the writer feeds
  them), native vs reference, and native vs ``np.copyto`` of the same bytes into a reused buffer
  (the physical limit: a pass over the bytes that does no work).
* vector stats over an 1800x14 float32 episode, native vs reference, fed whole and in 60 batches of
  30 rows.

``ratio`` is always baseline_time / value_time: > 1 means faster than the baseline; against the
byte copy it is the fraction of memory-copy speed reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from eva import _native
from eva.dataset import stats

FRAME_SHAPE = (480, 640, 3)
FRAMES_PER_BATCH = 30


def _best_seconds(run: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def camera_like_frames(count: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus sensor-like noise: neighbouring pixels share values, like real video.

    (Pure noise would flatter a naive histogram loop; long runs of close values are what stall it.)
    """
    rng = np.random.default_rng(seed)
    height, width, _ = FRAME_SHAPE
    rows = np.linspace(0, 180, height)[:, None, None]
    cols = np.linspace(0, 60, width)[None, :, None]
    tint = np.array([0.0, 20.0, 45.0])[None, None, :]
    base = rows + cols + tint
    frames = np.empty((count, *FRAME_SHAPE), dtype=np.uint8)
    for index in range(count):
        noise = rng.integers(0, 6, size=FRAME_SHAPE)
        np.clip(base + index + noise, 0, 255, out=frames[index], casting="unsafe")
    return frames


def _image_row(
    label: str, batch: np.ndarray, batches: int, repeats: int, ref_repeats: int
) -> list[dict]:
    frames = len(batch) * batches
    megabytes = batch.nbytes * batches / 1e6

    def feed(accumulator: Any) -> None:
        for _ in range(batches):
            accumulator.update(batch)
        accumulator.result()

    target = np.empty_like(batch)
    target.fill(0)  # pages touched once, so the copy measures bandwidth, not page faults

    def copy_all() -> None:
        for _ in range(batches):
            np.copyto(target, batch)

    reference_s = _best_seconds(lambda: feed(stats.ReferenceImageStats()), ref_repeats)
    copy_s = _best_seconds(copy_all, repeats)
    size = f"{frames}x{'x'.join(map(str, batch.shape[1:]))}"
    rows = []
    native_available = _native.load("stats") is not None
    if native_available:
        native_s = _best_seconds(lambda: feed(stats.ImageStats()), repeats)
        rows.append(
            {
                "name": f"stats.image {label} native vs reference",
                "value": native_s * 1e3,
                "baseline": reference_s * 1e3,
                "ratio": reference_s / native_s,
                "unit": "ms",
                "note": f"{size} uint8, batches of {len(batch)}; native {megabytes / native_s / 1e3:.2f} GB/s",
            }
        )
        rows.append(
            {
                "name": f"stats.image {label} native vs np.copyto",
                "value": native_s * 1e3,
                "baseline": copy_s * 1e3,
                "ratio": copy_s / native_s,
                "unit": "ms",
                "note": f"copy {megabytes / copy_s / 1e3:.2f} GB/s = physical limit of one pass",
            }
        )
    rows.append(
        {
            "name": f"stats.image {label} reference vs np.copyto",
            "value": reference_s * 1e3,
            "baseline": copy_s * 1e3,
            "ratio": copy_s / reference_s,
            "unit": "ms",
            "note": f"{size}; reference {megabytes / reference_s / 1e3:.2f} GB/s"
            + ("" if native_available else " (native core not available)"),
        }
    )
    return rows


def _vector_rows(values: np.ndarray, batch_rows: int, repeats: int) -> list[dict]:
    batches = (
        [values] if batch_rows >= len(values) else np.array_split(values, len(values) // batch_rows)
    )
    dim = values.shape[1]

    def feed(make: Callable[[int], Any]) -> None:
        accumulator = make(dim)
        for batch in batches:
            accumulator.update(batch)
        accumulator.result()

    reference_s = _best_seconds(lambda: feed(stats.ReferenceVectorStats), repeats)
    label = "whole episode" if len(batches) == 1 else f"{len(batches)} batches"
    if _native.load("stats") is None:
        return [
            {
                "name": f"stats.vector {values.shape[0]}x{dim} {label} reference",
                "value": reference_s * 1e3,
                "baseline": None,
                "ratio": None,
                "unit": "ms",
                "note": "native core not available",
            }
        ]
    native_s = _best_seconds(lambda: feed(stats.VectorStats), repeats)
    return [
        {
            "name": f"stats.vector {values.shape[0]}x{dim} {label} native vs reference",
            "value": native_s * 1e3,
            "baseline": reference_s * 1e3,
            "ratio": reference_s / native_s,
            "unit": "ms",
            "note": f"{values.dtype}, per-call overhead included",
        }
    ]


def report(quick: bool = False) -> list[dict]:
    """Rows for bench/run_all.py; about 10 s at full size, 2 s with quick."""
    batches = 2 if quick else 10  # x 30 frames: 60 or 300 frames of 480x640x3
    repeats = 3 if quick else 5
    camera = camera_like_frames(FRAMES_PER_BATCH)
    noise = np.random.default_rng(1).integers(
        0, 256, size=(FRAMES_PER_BATCH, *FRAME_SHAPE), dtype=np.uint8
    )
    rows = _image_row("camera-like", camera, batches, repeats, ref_repeats=2)
    rows += _image_row("noise", noise, batches, repeats, ref_repeats=1)
    vectors = np.random.default_rng(2).normal(size=(1800, 14)).astype(np.float32)
    vector_repeats = 5 if quick else 20
    rows += _vector_rows(vectors, batch_rows=1800, repeats=vector_repeats)
    rows += _vector_rows(vectors, batch_rows=30, repeats=vector_repeats)
    return rows


# --------------------------------------------------------------------------------------------------
# pytest-benchmark (small sizes; `pytest bench/bench_stats.py --benchmark-enable`)
# --------------------------------------------------------------------------------------------------

_BACKENDS = ["native", "reference"]


def _image_class(backend: str) -> type:
    if backend == "native":
        if _native.load("stats") is None:
            pytest.skip("native core not built or EVA_PUREPYTHON=1")
        return stats.ImageStats
    return stats.ReferenceImageStats


def _vector_class(backend: str) -> type:
    if backend == "native":
        if _native.load("stats") is None:
            pytest.skip("native core not built or EVA_PUREPYTHON=1")
        return stats.VectorStats
    return stats.ReferenceVectorStats


@pytest.mark.parametrize("backend", _BACKENDS)
def test_image_stats_30_frames(benchmark: Any, backend: str) -> None:
    image_cls = _image_class(backend)
    frames = camera_like_frames(FRAMES_PER_BATCH)

    def run() -> dict:
        accumulator = image_cls()
        accumulator.update(frames)
        return accumulator.result()

    result = benchmark(run)
    assert result["count"] == [FRAMES_PER_BATCH]


def test_copyto_30_frames(benchmark: Any) -> None:
    frames = camera_like_frames(FRAMES_PER_BATCH)
    target = np.zeros_like(frames)
    benchmark(np.copyto, target, frames)
    np.testing.assert_array_equal(target, frames)


@pytest.mark.parametrize("backend", _BACKENDS)
def test_vector_stats_1800x14_in_batches_of_30(benchmark: Any, backend: str) -> None:
    vector_cls = _vector_class(backend)
    values = np.random.default_rng(2).normal(size=(1800, 14)).astype(np.float32)

    def run() -> dict:
        accumulator = vector_cls(14)
        for start in range(0, len(values), 30):
            accumulator.update(values[start : start + 30])
        return accumulator.result()

    result = benchmark(run)
    assert result["count"] == [1800]
