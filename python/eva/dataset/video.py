"""MP4 encode / decode / probe with PyAV, shaped for LeRobot v2.1 episodes (docs/formats.md).

Encoding: H.264 (libx264) yuv420p at the target fps with a fixed GOP, no scene-cut keyframes and
no B-frames, so that episodes can later be concatenated packet by packet (v3.0 shards) without
re-encoding. libsvtav1 is accepted as an optional codec (what LeRobot itself writes).

Decoding: bounded batches into one preallocated buffer (never a whole episode in memory), with
PyAV frame threading on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av
import numpy as np

from eva.dataset import fsafe, mp4box
from eva.dataset.errors import DatasetError
from eva.dataset.rgb import FrameConverter
from eva.dataset.spool import VideoSpool

# Threads per decoder in this process; None: FFmpeg's own choice (one per core).
_decode_threads: list[int | None] = [None]


def set_decode_threads(count: int | None) -> None:
    """Threads of every decoder this process opens from now on (None: FFmpeg's default, one per
    core). A process pool's worker takes its share of the cores, so that workers times
    decoders do not oversubscribe them (the frames decoded are the same either way)."""
    _decode_threads[0] = count


def use_decode_threads(stream: av.video.stream.VideoStream) -> None:
    """Frame/slice threading on ``stream``'s decoder, with this process's thread count."""
    stream.thread_type = "AUTO"
    if _decode_threads[0] is not None:
        stream.codec_context.thread_count = _decode_threads[0]


SUPPORTED_CODECS = ("libx264", "libsvtav1")
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)
# Codec name as LeRobot records it in info.json `video.codec`.
CODEC_INFO_NAME = {"libx264": "h264", "libsvtav1": "av1"}


class FrameSizeError(DatasetError):
    """A video's frames do not have the expected size (the out buffer's, or the stream's)."""


@dataclass(frozen=True)
class VideoOptions:
    """Encoder settings. ``preset`` is an x264 preset name, or an SVT-AV1 preset number as text."""

    codec: str = "libx264"
    crf: int = 23
    preset: str = "veryfast"
    gop: int = 30
    pix_fmt: str = "yuv420p"

    def __post_init__(self) -> None:
        if self.codec not in SUPPORTED_CODECS:
            raise ValueError(
                f"video codec {self.codec!r}: choose one of {', '.join(SUPPORTED_CODECS)}"
            )
        if self.gop < 1:
            raise ValueError(f"video gop {self.gop}: must be >= 1")
        if not 0 <= int(self.crf) <= 63:
            raise ValueError(f"video crf {self.crf}: must be in 0..63")
        if self.codec == "libx264" and self.preset not in X264_PRESETS:
            raise ValueError(
                f"video preset {self.preset!r}: choose one of {', '.join(X264_PRESETS)}"
            )
        if self.codec == "libsvtav1" and not (self.preset.isdigit() or self.preset in X264_PRESETS):
            raise ValueError(f"video preset {self.preset!r}: SVT-AV1 takes a number 0..13")
        if self.pix_fmt not in ("yuv420p",):
            raise ValueError(f"video pix_fmt {self.pix_fmt!r}: only yuv420p is supported")

    @property
    def info_codec(self) -> str:
        return CODEC_INFO_NAME[self.codec]


def _codec_options(options: VideoOptions) -> dict[str, str]:
    if options.codec == "libx264":
        # keyint = min-keyint and scenecut=0: a keyframe exactly every `gop` frames and nowhere
        # else; bframes=0 keeps decode order == presentation order (packet-copy concatenation).
        return {
            "crf": str(options.crf),
            "preset": options.preset,
            "x264-params": (
                f"keyint={options.gop}:min-keyint={options.gop}:scenecut=0:bframes=0:"
                "open-gop=0:repeat-headers=1"
            ),
        }
    preset = options.preset if options.preset.isdigit() else "12"
    return {
        "crf": str(options.crf),
        "preset": preset,
        "g": str(options.gop),
        "svtav1-params": f"keyint={options.gop}:scd=0",
    }


class VideoEncoder:
    """Stream RGB frames into one MP4 file.

    ``write`` takes (n, H, W, 3) uint8 batches; the file is complete only after ``close``.
    One encoder is used by one thread at a time; PyAV releases the GIL in the pixel conversion
    and in libx264, so encoders of different cameras run in parallel on their own threads
    (``EpisodeWriter`` does that).

    ``thread_type`` / ``thread_count`` set the codec's own threading (PyAV's default: ``SLICE``
    with one thread per CPU, which libx264 maps to sliced threads); ``"FRAME"`` gives x264 frame
    threads, which only delay packets (no B-frames, the GOP stays fixed: the x264 params decide
    that). None keeps PyAV's default; ``EpisodeWriter`` passes ``thread_count=1`` when it runs
    at least one camera thread per CPU (``bench/bench_capture.py`` measures these levers).
    """

    def __init__(
        self,
        path: Path,
        width: int,
        height: int,
        fps: int,
        options: VideoOptions | None = None,
        *,
        thread_type: str | None = None,
        thread_count: int | None = None,
        spool_path: Path | None = None,
    ) -> None:
        self.path = Path(path)
        # A fragmented copy of the packets that survives a kill (eva.dataset.spool); opened at
        # the first packet, when the codec's global header exists.
        self.spool_path = spool_path
        self._spool: VideoSpool | None = None
        self.width = int(width)
        self.height = int(height)
        self.fps = int(fps)
        self.options = options or VideoOptions()
        if self.options.pix_fmt == "yuv420p" and (self.width % 2 or self.height % 2):
            raise DatasetError(
                f"{self.path.name}: {self.width}x{self.height} must have even width and height for yuv420p"
            )
        self.frames_written = 0
        self._container = av.open(str(self.path), mode="w", format="mp4")
        try:
            # Every SUPPORTED_CODECS entry is a video encoder (VideoOptions checks the name).
            stream = cast(
                av.VideoStream,
                self._container.add_stream(
                    self.options.codec, rate=self.fps, options=_codec_options(self.options)
                ),
            )
            stream.width = self.width
            stream.height = self.height
            stream.pix_fmt = self.options.pix_fmt
            stream.codec_context.time_base = Fraction(1, self.fps)
            stream.codec_context.gop_size = self.options.gop
            stream.codec_context.max_b_frames = 0
            if thread_type is not None:
                stream.codec_context.thread_type = thread_type
            if thread_count is not None:
                stream.codec_context.thread_count = int(thread_count)
        except BaseException:
            self._container.close()
            raise
        self._stream = stream
        self._closed = False

    def write(self, batch: np.ndarray) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path.name}: encoder already closed")
        if batch.ndim != 4 or batch.shape[1:] != (self.height, self.width, 3):
            raise DatasetError(
                f"{self.path.name}: frame batch shape {tuple(batch.shape)} != "
                f"(n, {self.height}, {self.width}, 3)"
            )
        if batch.dtype != np.uint8:
            raise DatasetError(f"{self.path.name}: frame dtype {batch.dtype} != uint8")
        for image in batch:
            # Wrap the caller's pixels without copying: a fresh frame-sized buffer per frame costs
            # a copy plus page faults (~1 ms at 640x480). Safe: the rgb24 frame is
            # converted to yuv420p (a new frame) inside ``encode``, before this call returns.
            if image.strides[1:] == (3, 1):
                frame = av.VideoFrame.from_numpy_buffer(image, format="rgb24")
            else:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = self.frames_written
            frame.time_base = self._stream.codec_context.time_base
            self._mux(self._stream.encode(frame))
            self.frames_written += 1

    def _mux(self, packets: list[av.Packet[Any]]) -> None:
        for packet in packets:
            if self.spool_path is not None:
                if self._spool is None:
                    self._spool = VideoSpool(self.spool_path, self._stream)
                self._spool.write(packet)
            self._container.mux(packet)

    def close(self) -> None:
        """Flush the encoder and finish the MP4 and its spool (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._mux(self._stream.encode(None))
        finally:
            try:
                self._container.close()
            finally:
                if self._spool is not None:
                    self._spool.close()

    def abort(self) -> None:
        """Close without caring about the output (which the caller deletes)."""
        if self._closed:
            return
        self._closed = True
        # The half-written file is discarded by the caller: errors closing it do not matter.
        with contextlib.suppress(Exception):
            self._container.close()
        if self._spool is not None:
            self._spool.abandon()

    def __enter__(self) -> VideoEncoder:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_video(
    source: fsafe.Readable,
) -> tuple[av.container.InputContainer, av.video.stream.VideoStream]:
    """The opened container of ``source`` and its first video stream (close the container);
    ``DatasetError`` naming the file when it does not open or holds no decodable video."""
    container = open_input(source)
    try:
        return container, _video_stream(container, fsafe.name_of(source))
    except DatasetError:
        container.close()
        raise


def open_input(source: fsafe.Readable) -> av.container.InputContainer:
    """``source`` opened by FFmpeg. A dataset file (``FileBeneath``) is opened beneath its root
    first and FFmpeg opens ``/proc/self/fd/<fd>``: the magic link names that open file, so no
    link swapped in after the open is followed, and FFmpeg still reads and seeks with its own
    I/O (a Python file object would call back into Python on every read)."""
    path = fsafe.name_of(source)
    try:
        if not isinstance(source, fsafe.FileBeneath):
            # Tags in a broken text encoding must not make a playable video unreadable.
            return av.open(str(path), mode="r", metadata_errors="replace")
        fd = source.open()
        try:
            if not fsafe.has_proc_fd():
                return av.open(os.fdopen(os.dup(fd), "rb"), mode="r", metadata_errors="replace")
            return av.open(fsafe.proc_path(fd), mode="r", metadata_errors="replace")
        finally:
            os.close(fd)  # FFmpeg holds its own open of the file
    except FileNotFoundError:
        raise DatasetError(f"{path}: cannot open video (missing)") from None
    except (av.error.FFmpegError, OSError) as e:
        reason = e.strerror if isinstance(source, fsafe.FileBeneath) and e.strerror else e
        raise DatasetError(
            f"{path}: cannot open video ({e.__class__.__name__}: {reason})"
        ) from None


def _video_stream(
    container: av.container.InputContainer, path: Path
) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise DatasetError(f"{path}: no video stream")
    stream = container.streams.video[0]
    if stream.codec_context is None:  # a sample description FFmpeg has no decoder for
        raise DatasetError(f"{path}: the video stream has no decoder (damaged or unknown codec)")
    return stream


def probe(source: fsafe.Readable) -> dict[str, Any]:
    """Codec, size, pixel format, fps and frame count of the first video stream (no decoding)."""
    path = fsafe.name_of(source)
    with open_input(source) as container:
        stream = _video_stream(container, path)
        ctx = stream.codec_context
        rate = stream.average_rate or stream.guessed_rate
        return {
            "codec": ctx.name,
            "width": ctx.width,
            "height": ctx.height,
            "pix_fmt": ctx.pix_fmt,
            "fps": float(rate) if rate else None,
            "frames": count_frames(source),
        }


def _count_stream_frames(
    container: av.container.InputContainer, stream: av.video.stream.VideoStream, path: Path
) -> int:
    """Frames FFmpeg will output, by demuxing (no decoding): the packets that carry data and are
    not flagged discard. The header's ``stream.frames`` is not used: it is the raw sample count,
    which counts samples an edit list hides (see ``mp4box``) and is 0 for fragmented files."""
    try:
        return sum(
            1 for packet in container.demux(stream) if packet.size > 0 and not packet.is_discard
        )
    except av.error.FFmpegError as e:
        raise DatasetError(f"{path}: demux failed ({e})") from None


def count_frames(source: fsafe.Readable) -> int:
    """Frames the video decodes to, without decoding.

    From the MP4 sample table read with ``mp4box`` (tens of microseconds) when that is certainly
    the decoded count; otherwise (fragmented MP4, edit lists that may hide frames, several video
    tracks, not an MP4 at all...) by demuxing with PyAV. A file cut short or unreadable raises a
    one-line ``DatasetError`` naming it.
    """
    path = fsafe.name_of(source)
    try:
        return mp4box.count_video_samples(source)
    except mp4box.Mp4Truncated as e:
        raise DatasetError(str(e)) from None
    except (mp4box.Mp4Unsupported, OSError):
        pass  # FFmpeg decides, and words its own errors (missing file, not a video...)
    with open_input(source) as container:
        return _count_stream_frames(container, _video_stream(container, path), path)


# Decoders that conceal a damaged slice (and return a frame) unless told to fail on errors.
_CONCEALING_DECODERS = ("h264", "hevc")


def _strict_decoder(stream: av.video.stream.VideoStream) -> av.VideoCodecContext | None:
    """A decoder for ``stream`` that fails on bitstream errors (``err_detect=explode``) instead
    of concealing them; None for codecs that do not conceal (their stream decodes as is)."""
    source = stream.codec_context
    if source.name not in _CONCEALING_DECODERS:
        return None
    # A decoder named after a video stream's codec is a video decoder.
    ctx = cast(av.VideoCodecContext, av.CodecContext.create(source.name, "r"))
    if source.extradata:
        ctx.extradata = source.extradata
    ctx.thread_type = "AUTO"
    ctx.options = {"err_detect": "explode"}
    return ctx


def count_decoded_frames(source: fsafe.Readable) -> int:
    """Frame count by actually decoding every frame (no pixel conversion): the ground truth.

    H.264/HEVC decode with ``err_detect=explode``: FFmpeg otherwise conceals a damaged slice and
    counts its frame as decoded."""
    path = fsafe.name_of(source)
    with open_input(source) as container:
        stream = _video_stream(container, path)
        try:
            strict = _strict_decoder(stream)
            if strict is None:
                use_decode_threads(stream)
                return sum(1 for _ in container.decode(stream))
            count = 0
            for packet in container.demux(stream):
                count += len(strict.decode(packet))  # the last, empty packet flushes
            return count
        except av.error.FFmpegError as e:
            raise DatasetError(f"{path}: decode failed ({e})") from None


def iter_frame_batches(
    source: fsafe.Readable,
    batch_size: int = 32,
    *,
    out: np.ndarray | None = None,
    alternate: bool = False,
) -> Iterator[np.ndarray]:
    """Yield (n, H, W, 3) uint8 RGB batches of at most ``batch_size`` frames.

    ``FrameSizeError`` (a ``DatasetError`` naming the file) when ``out`` does not fit the
    stream's frames or a frame changes size mid-file.

    Every batch is a view of ONE preallocated buffer (``out`` if given, shape
    (batch_size, H, W, 3)) that is overwritten by the next batch: copy a batch if you keep it
    past the next iteration. This keeps memory bounded and avoids touching fresh pages per batch.

    ``alternate``: the buffer holds two batches (``out`` of at least 2 x ``batch_size`` frames)
    and batches fill its halves in turn, so a batch stays valid while the next one is decoded
    (a consumer may ask for batch k+1 as soon as it has batch k, and use k meanwhile).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    path = fsafe.name_of(source)
    with open_input(source) as container:
        stream = _video_stream(container, path)
        use_decode_threads(stream)
        height, width = stream.codec_context.height, stream.codec_context.width
        halves = 2 if alternate else 1
        if out is None:
            out = np.empty((halves * batch_size, height, width, 3), dtype=np.uint8)
        elif out.shape[1:] != (height, width, 3) or out.dtype != np.uint8 or len(out) < halves:
            raise FrameSizeError(
                f"{path}: frames are {width}x{height}, the out buffer {out.shape} {out.dtype} "
                f"does not fit them"
            )
        capacity = min(batch_size, len(out) // halves)
        # the half being filled: a view, so slots are numbered from 0 in either half
        fill = out[:capacity]
        half = 0
        filled = 0
        # Straight into the batch slot (no frame-sized temporary per frame): libswscale,
        # self-checked against PyAV on the first frame, or PyAV's own conversion and a copy
        # for anything else (same pixels either way; rgb.FrameConverter).
        converter = FrameConverter()
        started = False
        try:
            for number, frame in enumerate(container.decode(stream)):
                if frame.width != width or frame.height != height:
                    raise FrameSizeError(
                        f"{path}: frame {number} is {frame.width}x{frame.height}, "
                        f"stream is {width}x{height}"
                    )
                if started:
                    converter.convert(frame, fill, filled)
                else:
                    converter.start_video(frame, fill, filled)
                    started = True
                filled += 1
                if filled == capacity:
                    yield fill
                    filled = 0
                    if alternate:
                        half ^= 1
                        fill = out[half * capacity : (half + 1) * capacity]
        except av.error.FFmpegError as e:
            raise DatasetError(f"{path}: decode failed ({e})") from None
        if filled:
            yield fill[:filled]
