"""Decode checks of MP4 bitstreams: the container can be intact while the frames are not.

The MP4 boxes (``moov``) say how many samples a file has and where they are; they say nothing
about whether the bytes in ``mdat`` decode. A file whose ``mdat`` was overwritten passes every
box-level check, so three checks are offered:

* ``inspect_video(path)``, what ``validate_dataset`` runs on every MP4 (so every export refuses a
  source that fails it): the frame count from the sample table, the framing of every sample
  (``eva.dataset.bitstream``: each sample parses into whole NAL units/OBUs, which overwritten or
  zeroed data almost never does) and a decode of the first keyframe. About 1 ms per file plus
  one keyframe decode (2-4 ms at 640x480), and no FFmpeg demuxer: the keyframe's bytes go
  straight to a decoder configured from the sample entry.
* ``check_keyframes(path)``: decode one frame at each of a few keyframes spread over the file
  (the first, the last and evenly spaced ones between). It proves that those keyframes decode,
  not that every frame does.
* ``check_full_decode(path)``: decode every frame and compare the count with the container's.
  ``verify_videos`` runs it on one randomly chosen MP4 per camera of an export (every MP4 with
  ``full=True``, ``eva verify --full``).

Damage inside a predicted frame that keeps its framing is found only by a full decode. Every
failure is a one-line ``DatasetError`` naming the file.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import av
import numpy as np

from eva.dataset import bitstream, fsafe, mp4box
from eva.dataset.errors import DatasetError

if TYPE_CHECKING:
    from eva.dataset.validate import Problem

__all__ = [
    "KEYFRAME_SAMPLES",
    "UndecodableVideo",
    "check_full_decode",
    "check_keyframes",
    "inspect_video",
    "verify_videos",
]

# Keyframes decoded per file by check_keyframes: the first, the last and one between.
KEYFRAME_SAMPLES = 3

# Decoders for the sample entries eva can feed without a demuxer, best first (FFmpeg's native
# AV1 decoder needs a hardware device; dav1d or libaom decode in software).
_DECODERS = {
    b"avc1": ("h264",),
    b"avc3": ("h264",),
    b"hvc1": ("hevc",),
    b"hev1": ("hevc",),
    b"av01": ("libdav1d", "libaom-av1", "av1"),
}
# err_detect=explode: FFmpeg's H.264/HEVC decoders conceal a damaged slice and still return a
# frame (64 overwritten bytes inside an IDR decode "fine" without it). Deblocking changes pixels,
# not whether the bitstream decodes: skipping it saves ~20 %.
_STRICT = {"err_detect": "explode", "skip_loop_filter": "all"}
_DECODER_OPTIONS = {"h264": _STRICT, "hevc": _STRICT}


class UndecodableVideo(DatasetError):
    """The container is sound but its video data is not: badly framed samples or a keyframe
    that does not decode."""


def _decoder_name(fourcc: bytes) -> str | None:
    available = av.codecs_available
    return next((name for name in _DECODERS.get(fourcc, ()) if name in available), None)


def _spread(positions: np.ndarray, samples: int) -> list[int]:
    """Up to ``samples`` of ``positions``, evenly spread, always with the first."""
    if samples <= 1 or len(positions) <= 1:
        return [int(positions[0])]
    picks = np.linspace(0, len(positions) - 1, min(samples, len(positions)))
    return [int(positions[i]) for i in sorted({int(i) for i in picks})]


def _decode_samples(fd: int, path: Path, table: mp4box.VideoSamples, indices: list[int]) -> bool:
    """Decode each sample of ``indices`` alone (keyframes) with a decoder configured from the
    sample entry; False when no such decoder exists (the caller asks FFmpeg's demuxer)."""
    name = _decoder_name(table.entry.fourcc)
    if name is None:
        return False
    try:
        # a video decoder: create() is typed as the codec-agnostic base class
        ctx = cast(av.VideoCodecContext, av.CodecContext.create(name, "r"))
        if table.entry.config:
            ctx.extradata = table.entry.config
        ctx.thread_count = 1  # frame threads would hold the frame back until several packets
        ctx.options = dict(_DECODER_OPTIONS.get(name, {}))
    except (av.error.FFmpegError, ValueError):
        return False
    timescale = table.track.timescale or 1
    for index in indices:
        data = os.pread(fd, int(table.sizes[index]), int(table.offsets[index]))
        where = f"keyframe at {table.pts[index] / timescale:.3f} s (sample {index})"
        if len(data) < int(table.sizes[index]):
            raise UndecodableVideo(f"{path}: {where}: its data ends early")
        try:
            packet = av.Packet(data)
            packet.pts = int(table.pts[index])
            frames = ctx.decode(packet) + ctx.decode(None)
            ctx.flush_buffers()
        except av.error.FFmpegError as e:
            raise UndecodableVideo(f"{path}: {where} does not decode ({e})") from None
        if not frames:
            raise UndecodableVideo(f"{path}: {where} does not decode (no frame)")
    return True


def _read_table(source: fsafe.Readable) -> mp4box.VideoSamples | None:
    try:
        return mp4box.read_video_samples(source)
    except mp4box.Mp4Truncated as e:
        raise DatasetError(str(e)) from None
    except (mp4box.Mp4Unsupported, OSError):
        return None


def _check_table(
    source: fsafe.Readable,
    table: mp4box.VideoSamples,
    keyframes: int,
    *,
    check_framing: bool = True,
) -> bool:
    """Framing of every sample (``check_framing``), then ``keyframes`` keyframes decoded; False
    when the decode needs FFmpeg's demuxer (an unknown sample entry)."""
    path = fsafe.name_of(source)
    try:
        fd = source.open() if isinstance(source, fsafe.FileBeneath) else fsafe.open_regular(path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    try:
        framing = bitstream.framing_of(table.entry.config_type, table.entry.config)
        if check_framing and framing is not None:
            try:
                bitstream.check_samples(fd, path, table.offsets, table.sizes, framing)
            except bitstream.FramingError as e:
                raise UndecodableVideo(str(e)) from None
        positions = np.flatnonzero(table.keyframes)
        if len(positions) == 0:
            raise UndecodableVideo(f"{path}: no keyframe")
        return _decode_samples(fd, path, table, _spread(positions, keyframes))
    except OSError as e:
        raise fsafe.os_error(e, path) from None
    finally:
        os.close(fd)


def inspect_video(source: fsafe.Readable | str, keyframes: int = 1) -> int:
    """Frames of the MP4 (as ``video.count_frames``), after checking that every sample is well
    framed and that ``keyframes`` keyframes decode (the first always).

    Raises ``UndecodableVideo`` for damaged video data, ``DatasetError`` for a file that cannot
    be read or counted. A dataset's file (``fsafe.FileBeneath``) is opened beneath its root
    by every reader of it (box parser, sample reads, FFmpeg)."""
    from eva.dataset import video

    source = source if isinstance(source, fsafe.FileBeneath) else Path(source)
    table = _read_table(source)
    if table is None:  # fragmented, several tracks, not an MP4...: FFmpeg counts and decodes
        frames = video.count_frames(source)
        _check_with_demuxer(source, None)
        return frames
    if not _check_table(source, table, keyframes):
        _check_with_demuxer(source, _keyframe_times(table, keyframes))
    return table.track.sample_count


def _keyframe_times(table: mp4box.VideoSamples, samples: int) -> tuple[list[int], int]:
    """Presentation times (track ticks) of the keyframes to decode, and the timescale. FFmpeg's
    MP4 seek goes by presentation time: with B-frames a keyframe's dts would land on the
    keyframe before it."""
    positions = np.flatnonzero(table.keyframes)
    return [int(table.pts[i]) for i in _spread(positions, samples)], table.track.timescale


def _check_with_demuxer(source: fsafe.Readable, sampled: tuple[list[int], int] | None) -> None:
    """Decode one frame at each sampled keyframe through FFmpeg's demuxer (seeking by
    presentation time); the first frame only when the sample table could not be read."""
    from eva.dataset import video

    path = fsafe.name_of(source)
    with video.open_input(source) as container:
        if not container.streams.video:
            raise DatasetError(f"{path}: no video stream")
        stream = container.streams.video[0]
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
                raise UndecodableVideo(f"{path}: {where} does not decode ({e})") from None
            if frame is None:
                raise UndecodableVideo(f"{path}: no frame decodes")


def check_keyframes(path: Path | str, samples: int = KEYFRAME_SAMPLES) -> None:
    """Decode one frame at each of up to ``samples`` keyframes of the MP4 (see module doc)."""
    path = Path(path)
    table = _read_table(path)
    if table is None:
        _check_with_demuxer(path, None)
    elif not _check_table(path, table, samples, check_framing=False):
        _check_with_demuxer(path, _keyframe_times(table, samples))


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
