"""Decode checks of MP4 bitstreams: the container can be intact while the frames are not.

The MP4 boxes (``moov``) say how many samples a file has and where they are; they say nothing
about whether the bytes in ``mdat`` decode. A file whose ``mdat`` was overwritten passes every
box-level check, so two decode checks are offered:

* ``check_keyframes(path)``: seek to a few keyframes spread over the file (the first, the last
  and evenly spaced ones between) and decode one frame at each. Milliseconds per file; run by
  ``validate_dataset`` on every MP4, so an export refuses a source whose sampled keyframes do not
  decode. It proves that those keyframes decode, not that every frame does: damage confined to
  the predicted frames between them is found only by a full decode.
* ``check_full_decode(path)``: decode every frame and compare the count with the container's.
  ``verify_videos`` runs it on one randomly chosen MP4 per camera of an export (every MP4 with
  ``full=True``, ``eva verify --full``).

Every failure is a one-line ``DatasetError`` naming the file.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import av
import numpy as np

from eva.dataset import mp4box
from eva.dataset.errors import DatasetError

if TYPE_CHECKING:
    from eva.dataset.validate import Problem

__all__ = ["KEYFRAME_SAMPLES", "check_full_decode", "check_keyframes", "verify_videos"]

# Keyframes decoded per file by check_keyframes: the first, the last and one between.
KEYFRAME_SAMPLES = 3


def _keyframe_times(path: Path, samples: int) -> tuple[list[int], int] | None:
    """Presentation times (track ticks) of up to ``samples`` keyframes spread over the file, and
    the track's timescale, from the MP4 sample table; None when the boxes cannot say (FFmpeg then
    decides which frame to decode). FFmpeg's MP4 seek goes by presentation time: with B-frames a
    keyframe's dts would land on the keyframe before it."""
    try:
        table = mp4box.read_video_samples(path)
    except mp4box.Mp4Truncated as e:
        raise DatasetError(str(e)) from None
    except (mp4box.Mp4Unsupported, OSError):
        return None
    positions = np.flatnonzero(table.keyframes)
    if len(positions) == 0:
        return None
    picks = sorted(
        {int(i) for i in np.linspace(0, len(positions) - 1, min(samples, len(positions)))}
    )
    return [int(table.pts[positions[i]]) for i in picks], table.track.timescale


def _open(path: Path) -> av.container.InputContainer:
    try:
        return av.open(str(path), mode="r", metadata_errors="replace")
    except (av.error.FFmpegError, OSError) as e:
        raise DatasetError(f"{path}: cannot open video ({e.__class__.__name__}: {e})") from None


def check_keyframes(path: Path | str, samples: int = KEYFRAME_SAMPLES) -> None:
    """Decode one frame at each of up to ``samples`` keyframes of the MP4 (see module doc)."""
    path = Path(path)
    sampled = _keyframe_times(path, samples)
    with _open(path) as container:
        if not container.streams.video:
            raise DatasetError(f"{path}: no video stream")
        stream = container.streams.video[0]
        # Without a sample table the first frame is the one sample that is certainly a keyframe.
        times = sampled[0] if sampled is not None else [None]
        for pts in times:
            try:
                if pts is not None:
                    container.seek(pts, stream=stream, backward=True, any_frame=False)
                frame = next(iter(container.decode(stream)), None)
            except av.error.FFmpegError as e:
                where = (
                    f"keyframe at {pts / sampled[1]:.3f} s" if sampled and pts else "first frame"
                )
                raise DatasetError(f"{path}: {where} does not decode ({e})") from None
            if frame is None:
                raise DatasetError(f"{path}: no frame decodes")


def check_full_decode(path: Path | str) -> int:
    """Decode every frame; the count must equal the container's. Returns the count."""
    from eva.dataset import video

    path = Path(path)
    expected = video.count_frames(path)
    decoded = video.count_decoded_frames(path)
    if decoded != expected:
        raise DatasetError(
            f"{path}: {decoded} frames decode, the container has {expected} (damaged bitstream)"
        )
    return decoded


def _camera_of(path: Path, videos: Path) -> str:
    """The video key a file belongs to: its path under ``videos/`` without chunk directories
    and file name (v2.1: chunk-000/<key>/episode_N.mp4, v3.0: <key>/chunk-000/file-000.mp4)."""
    parts = path.relative_to(videos).parts[:-1]
    return "/".join(p for p in parts if not p.startswith("chunk-"))


def verify_videos(
    export_dir: Path | str, *, full: bool = False, rng: random.Random | None = None
) -> list[Problem]:
    """Decode checks of an export's MP4s (under ``videos/``; formats without MP4s have none):
    the keyframe check of every file, then a full decode of one random file per camera, or of
    every file with ``full``."""
    from eva.dataset.validate import Problem  # validate imports this module

    videos = Path(export_dir) / "videos"
    if not videos.is_dir():
        return []
    by_camera: dict[str, list[Path]] = {}
    for path in sorted(videos.rglob("*.mp4")):
        if path.is_file() and not path.is_symlink():
            by_camera.setdefault(_camera_of(path, videos), []).append(path)
    rng = rng or random.Random()
    problems: list[Problem] = []
    for files in by_camera.values():
        chosen: Sequence[Path] = files if full else [rng.choice(files)]
        for path in files:
            try:
                check_keyframes(path)
                if path in chosen:
                    check_full_decode(path)
            except DatasetError as e:
                problems.append(Problem("undecodable_video", str(e), str(path), None))
    return problems
