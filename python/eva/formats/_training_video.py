"""The training video profile (``--video-profile training``) of the LeRobot formats: each camera
re-encoded as ``lerobot-record`` writes it, a keyframe every 2 frames, so that a training loader's
random read of one frame decodes at most 2 frames (the recorded GOP can be tens of frames).

The settings are LeRobot's (0.4.4's ``encode_video_frames``, 0.6's ``VideoEncoderConfig``):
``g`` 2, CRF 30, libsvtav1 at preset 12 (libx264 at its own default preset), yuv420p; they are
recorded in each camera's ``info`` block of ``meta/info.json`` with the keys LeRobot 0.6 records
(``video.g``, ``video.crf``, ``video.preset``...).

Frames stream from the source's decoder into the encoder one at a time (the recorded yuv420p
frames as decoded: no RGB round trip), so memory does not grow with an episode's length; a
trimmed episode's cut frames are decoded and dropped. The bytes depend on the source frames and
the settings only, never on the executor or the machine: libx264's output depends on its thread
count, so it is pinned (``X264_THREADS``); SVT-AV1's does not (checked by the executor tests).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av
from av.video.frame import PictureType

from eva.dataset import video
from eva.dataset.errors import DatasetError, naming_write_errors
from eva.dataset.fsafe import Readable, name_of
from eva.formats._decode import VideoOpenError, open_video
from eva.formats.options import VideoProfileOptions

GOP = 2  # LeRobot's g: a keyframe every 2 frames
SVTAV1_PRESET = 12  # LeRobot's default libsvtav1 preset
X264_THREADS = 1  # pinned: libx264's bytes change with its thread count
PIX_FMT = "yuv420p"
# The codec name a stream of each encoder reports (``video.codec``).
CANONICAL_CODEC = {"libsvtav1": "av1", "libx264": "h264"}


@dataclass(frozen=True)
class TrainingEncoding:
    """One camera's encoder settings in the training profile."""

    codec: str  # libsvtav1 | libx264
    crf: int

    @property
    def preset(self) -> int | None:
        return SVTAV1_PRESET if self.codec == "libsvtav1" else None

    def codec_options(self) -> dict[str, str]:
        """The encoder's options, as LeRobot passes them (``g``, ``crf``, libsvtav1's preset)."""
        options = {"g": str(GOP), "crf": str(self.crf)}
        if self.preset is not None:
            options["preset"] = str(self.preset)
        if self.codec == "libx264":
            options["threads"] = str(X264_THREADS)
        return options

    def feature_info(self, height: int, width: int, fps: float) -> dict[str, Any]:
        """A camera's ``info`` block, with the keys and values LeRobot 0.6.1 records for a video
        it encoded with these settings (its ``get_video_info``)."""
        return {
            "video.height": height,
            "video.width": width,
            "video.codec": CANONICAL_CODEC[self.codec],
            "video.pix_fmt": PIX_FMT,
            "video.fps": int(fps) if float(fps).is_integer() else fps,
            "video.channels": 3,
            "has_audio": False,
            "video.g": GOP,
            "video.crf": self.crf,
            "video.preset": self.preset,
            "video.fast_decode": 0,
            "video.extra_options": {},
            "video.video_backend": "pyav",
            "is_depth_map": False,
        }


def training_encoding(settings: VideoProfileOptions) -> TrainingEncoding | None:
    """The encoding of the training profile, None for the archive profile (packet copy)."""
    if settings.video_profile != "training":
        return None
    return TrainingEncoding(settings.video_codec, settings.video_crf)


def training_features(
    features: dict[str, Any], video_keys: tuple[str, ...] | list[str], encoding: TrainingEncoding
) -> None:
    """Each camera's ``info`` block in ``features`` (an info.json's, changed in place) replaced
    by the training encoding's; its frame size from the recorded block, else its shape."""
    for key in video_keys:
        feature = features.get(key)
        if not isinstance(feature, dict):
            continue
        block = feature.get("info")
        recorded: dict[str, Any] = block if isinstance(block, dict) else {}
        shape = list(feature.get("shape") or [0, 0, 3])
        height = int(recorded.get("video.height") or shape[0])
        width = int(recorded.get("video.width") or shape[1])
        fps = recorded.get("video.fps") or feature.get("fps") or 0
        feature["info"] = encoding.feature_info(height, width, float(fps))


class TrainingEncoder:
    """One output MP4 of one camera, its episodes' frames appended in turn (one stream; frame
    ``k`` of the file is presented at ``k / fps``). ``abort`` removes the partial file."""

    def __init__(self, path: Path, encoding: TrainingEncoding, fps: float) -> None:
        self.path = path
        self.encoding = encoding
        self.rate = Fraction(fps).limit_denominator(1_000_000)
        self.frames = 0
        # SVT-AV1 prints a banner and a note on its settings on stderr for every encoder (at
        # LeRobot's settings: "TPL is disabled for aq_mode 0"); errors still show, and a user's
        # own SVT_LOG wins
        os.environ.setdefault("SVT_LOG", "1")
        with naming_write_errors(path):
            self._out = av.open(str(path), "w", format="mp4")
        self._stream: av.video.stream.VideoStream | None = None

    def _open_stream(self, frame: av.VideoFrame) -> av.video.stream.VideoStream:
        stream = cast(
            av.video.stream.VideoStream,
            self._out.add_stream(
                self.encoding.codec, rate=self.rate, options=self.encoding.codec_options()
            ),
        )
        stream.pix_fmt = PIX_FMT
        stream.width, stream.height = frame.width, frame.height
        return stream

    def add_episode(self, source: Readable, keep: tuple[int, int] | None, frames: int) -> int:
        """Decode ``source`` (``frames`` recorded frames) and encode its frames ``keep`` =
        [start, end) (all without a trim); the number encoded. ``DatasetError`` naming the file
        when it holds another number of frames, or a frame of another size."""
        where = name_of(source)
        start, end = keep if keep is not None else (0, frames)
        try:
            container, in_stream = open_video(source)
        except VideoOpenError as e:
            raise DatasetError(str(e)) from None
        decoded = 0
        with container:
            video.use_decode_threads(in_stream)
            for frame in container.decode(in_stream):
                if start <= decoded < end:
                    self._encode(frame, where)
                decoded += 1
        if decoded != frames:
            raise DatasetError(f"{where}: holds {decoded} frames, the table has {frames} rows")
        return end - start

    def _encode(self, frame: av.VideoFrame, where: Path) -> None:
        if self._stream is None:
            self._stream = self._open_stream(frame)
        stream = self._stream
        if (frame.width, frame.height) != (stream.width, stream.height):
            raise DatasetError(
                f"{where}: frames of {frame.width}x{frame.height}, the file's are "
                f"{stream.width}x{stream.height}"
            )
        if frame.format.name != PIX_FMT:
            frame = frame.reformat(format=PIX_FMT)
        # the recorded picture type would force the encoder's keyframes where the source had them
        frame.pict_type = PictureType.NONE
        frame.pts, frame.time_base = self.frames, 1 / self.rate
        self.frames += 1
        with naming_write_errors(self.path):
            self._out.mux(stream.encode(frame))

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        with naming_write_errors(self.path):
            if self._stream is not None:
                self._out.mux(self._stream.encode(None))
            self._out.close()

    def abort(self) -> None:
        with contextlib.suppress(av.error.FFmpegError, OSError, ValueError):
            self._out.close()  # the partial file goes anyway
        self.path.unlink(missing_ok=True)


def encode_episode(
    source: Readable,
    dest: Path,
    encoding: TrainingEncoding,
    fps: float,
    keep: tuple[int, int] | None,
    frames: int,
) -> int:
    """One episode's camera as its own MP4 (the v2.1 layout): the frames encoded."""
    encoder = TrainingEncoder(dest, encoding, fps)
    try:
        encoded = encoder.add_episode(source, keep, frames)
        encoder.close()
    except BaseException:
        encoder.abort()
        raise
    return encoded
