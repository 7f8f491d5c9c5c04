"""Cutting a trimmed v2.1 episode's MP4 (``eva.dataset.video_cut``): smart cut vs a file copy
and vs re-encoding every kept frame.

``report(quick)`` encodes one camera episode with eva's capture encoder (H.264, no B-frames,
GOP 30; full: 600 frames of 640x480, quick: 150 of 320x240) and one with x264 B-frames and a
GOP of 60, cached under the temp dir, then trims 17 frames from the start and 13 from the end
(both cuts inside a GOP). Rows (best of ``repeats``, measured in this run):

* smart cut vs copying the same source bytes (``shutil.copyfile``): what trimming costs over
  the untrimmed episode's copy (ratio = copy / cut: the fraction of copy speed reached);
* smart cut vs re-encoding every kept frame with the same settings (``smart=False``): ratio =
  re-encode / cut, the speed-up of copying the inner GOPs;
* the same two, in CPU time (steadier on the shared VM).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np

from eva.dataset.video import VideoEncoder, VideoOptions
from eva.dataset.video_cut import cut_episode_video

CACHE = Path(tempfile.gettempdir()) / "eva-bench-video-cut"
HEAD, TAIL = 17, 13


def camera_frames(count: int, width: int, height: int) -> np.ndarray:
    """Camera-like content: a smooth texture panning, a moving soft disc, light noise."""
    rng = np.random.default_rng(0)
    big_h, big_w = height + count // 2 + 8, width + count + 8
    small = rng.normal(0, 1, (big_h // 32 + 2, big_w // 32 + 2, 1)).astype(np.float32)
    texture = np.kron(small, np.ones((32, 32, 1), np.float32))[:big_h, :big_w]
    kernel = np.ones(17, np.float32) / 17
    for axis in (0, 1):
        texture = np.apply_along_axis(np.convolve, axis, texture, kernel, mode="same")
    base = 120 + 60 * texture + np.array([10, 0, -10], np.float32)
    yy, xx = np.mgrid[0:height, 0:width]
    frames = np.empty((count, height, width, 3), np.uint8)
    for i in range(count):
        image = base[i // 2 : i // 2 + height, i : i + width]
        cy, cx = height / 2 + height / 3 * np.sin(i / 9), width / 2 + width / 3 * np.cos(i / 7)
        alpha = (np.clip(height / 10 - np.hypot(yy - cy, xx - cx), 0, 3) / 3)[..., None]
        image = image * (1 - alpha) + alpha * np.array([220, 200, 90], np.float32)
        frames[i] = np.clip(image + rng.normal(0, 1.5, image.shape), 0, 255)
    return frames


def _episode(name: str, frames: np.ndarray, bframes: bool) -> Path:
    count, height, width = frames.shape[:3]
    path = CACHE / f"{name}-{count}-{width}x{height}.mp4"
    if path.is_file():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.mp4")
    if not bframes:
        with VideoEncoder(tmp, width, height, 30, VideoOptions(gop=30)) as encoder:
            encoder.write(frames)
    else:
        params = "keyint=60:min-keyint=60:scenecut=0:bframes=3:open-gop=0:repeat-headers=1"
        options = {"crf": "23", "preset": "veryfast", "x264-params": params}
        with av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=30, options=options)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for image in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            container.mux(stream.encode(None))
    tmp.replace(path)
    return path


def _best(run: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``repeats`` runs."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        run()
        wall = min(wall, time.perf_counter() - w)
        cpu = min(cpu, time.process_time() - c)
    return wall, cpu


def _rows(name: str, source: Path, frames: int, repeats: int, out: Path) -> list[dict[str, Any]]:
    start, end = HEAD, frames - TAIL
    dest = out / "cut.mp4"
    result = cut_episode_video(source, dest, start, end, durable=False)
    cut = _best(lambda: cut_episode_video(source, dest, start, end, durable=False), repeats)
    copy = _best(lambda: shutil.copyfile(source, out / "copy.mp4"), repeats)
    whole = _best(
        lambda: cut_episode_video(source, dest, start, end, durable=False, smart=False), repeats
    )
    kept = f"{end - start} of {frames} frames kept, {result.copied} copied"
    rows = []
    for unit, i in (("s", 0), ("cpu-s", 1)):
        rows.append(
            _row(f"{name}: smart cut vs copy", cut[i], copy[i], copy[i] / cut[i], unit, kept)
        )
        rows.append(
            _row(f"{name}: smart cut vs re-encode", cut[i], whole[i], whole[i] / cut[i], unit, kept)
        )
    return rows


def _row(
    name: str, value: float, baseline: float, ratio: float, unit: str, note: str
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "baseline": baseline,
        "ratio": ratio,
        "unit": unit,
        "note": note,
    }


def report(quick: bool = False) -> list[dict[str, Any]]:
    count, width, height = (150, 320, 240) if quick else (600, 640, 480)
    repeats = 2 if quick else 3
    frames = camera_frames(count, width, height)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, bframes in (
            ("eva capture (no B, GOP 30)", False),
            ("x264 B-frames, GOP 60", True),
        ):
            source = _episode("bframes" if bframes else "eva", frames, bframes)
            rows += _rows(f"{width}x{height} {name}", source, count, repeats, Path(tmp))
    return rows


if __name__ == "__main__":
    for row in report(quick="--quick" in sys.argv):
        print(
            f"{row['name']:<60} {row['value']:.4f} {row['unit']} vs {row['baseline']:.4f}  ratio {row['ratio']:.3f}  ({row['note']})"
        )
