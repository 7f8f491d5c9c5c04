"""Random-access decode latency of a camera's MP4s (``eva verify --decode-latency``): what a
training loader pays for one frame at a random index.

Each sample does what LeRobot's pyav backend does for one frame: open the file, seek to the
keyframe at or before the frame's time, decode forward to the frame, close. The latency is the
wall time of that; the report gives its 50th and 99th percentiles per camera, and the camera's
bytes per frame. A training-profile export (a keyframe every 2 frames) decodes at most 2 frames
per sample; a packet copy of the recorded GOP decodes up to a GOP's worth.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av
import numpy as np

from eva.dataset import layout
from eva.dataset.atomic import read_json_object

DEFAULT_SAMPLES = 200


@dataclass(frozen=True)
class Latency:
    """One camera's random-access figures."""

    samples: int
    p50_ms: float
    p99_ms: float
    frames: int
    bytes_per_frame: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "frames": self.frames,
            "bytes_per_frame": round(self.bytes_per_frame, 1),
        }


def frame_times(path: Path) -> list[float]:
    """Every frame's presentation time in ``path`` (from the packets: no decoding)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        base = float(cast(Fraction, stream.time_base))
        times = [float(p.pts) * base for p in container.demux(stream) if p.pts is not None]
    return sorted(times)


def read_frame_at(path: Path, t: float) -> np.ndarray:
    """The frame of ``path`` presented at ``t`` seconds, as LeRobot's pyav backend reads one:
    seek to the keyframe before, decode forward."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        base = float(cast(Fraction, stream.time_base))
        container.seek(int(round(t / base)), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if frame.pts is not None and frame.pts * base >= t - 1e-4:
                return frame.to_ndarray(format="rgb24")
    raise ValueError(f"{path}: no frame at {t:.4f} s")


def measure(files: Sequence[Path], samples: int = DEFAULT_SAMPLES, seed: int = 0) -> Latency:
    """``samples`` random frames read from ``files`` (one camera's MP4s; a frame index drawn
    over all their frames)."""
    frames = [(path, t) for path in files for t in frame_times(path)]
    if not frames:
        raise ValueError("no video frames to sample")
    size = sum(path.stat().st_size for path in files)
    rng = random.Random(seed)
    picks = [frames[rng.randrange(len(frames))] for _ in range(samples)]
    times = []
    for path, t in picks:
        start = time.perf_counter()
        read_frame_at(path, t)
        times.append(time.perf_counter() - start)
    p50, p99 = np.percentile(np.asarray(times) * 1000, [50, 99])
    return Latency(samples, float(p50), float(p99), len(frames), size / len(frames))


def camera_files(export_dir: Path) -> dict[str, list[Path]]:
    """Each camera of an export subset (info.json's video features) -> its MP4s, in path
    order: every file under ``videos/`` that has the camera's key as a folder name."""
    info = read_json_object(export_dir / layout.INFO)
    features = info.get("features")
    keys = [
        k
        for k, f in (features.items() if isinstance(features, dict) else [])
        if isinstance(f, dict) and f.get("dtype") == "video"
    ]
    videos = sorted(p for p in (export_dir / "videos").rglob("*.mp4") if p.is_file())
    return {key: [p for p in videos if key in p.relative_to(export_dir).parts] for key in keys}


def export_latency(
    export_dir: Path, samples: int = DEFAULT_SAMPLES, seed: int = 0
) -> dict[str, Latency]:
    """Every camera's random-access figures (cameras without a file are left out)."""
    return {
        key: measure(files, samples, seed)
        for key, files in camera_files(export_dir).items()
        if files
    }
