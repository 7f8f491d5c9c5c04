"""Reading MP4s with PyAV for the formats: opening one, and decoding its frames to RGB arrays.

Every format opens and decodes through these (the writers' own decode pipelines included), so a
file that does not open is worded one way everywhere: ``<file>: cannot open video (<reason>)``
or ``<file>: no video stream``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from eva.dataset import video
from eva.dataset.errors import DatasetError
from eva.dataset.fsafe import FileBeneath, Readable


class VideoOpenError(ValueError):
    """An MP4 that does not open, or holds no video stream; the message names the file."""


def open_video(
    source: Readable,
) -> tuple[av.container.InputContainer, av.video.stream.VideoStream]:
    """The opened container of ``source`` and its first video stream (close the container): the
    dataset layer's ``open_video``, its error as a ``VideoOpenError``. A dataset's file comes as
    a ``FileBeneath`` (opened beneath its root, FFmpeg reading that open file)."""
    try:
        return video.open_video(source if isinstance(source, FileBeneath) else Path(source))
    except DatasetError as e:
        raise VideoOpenError(str(e)) from None


def rgb_arrays(frames: Iterable[av.VideoFrame]) -> Iterator[np.ndarray]:
    """Each frame as an (H, W, 3) uint8 RGB array. One reformatter for all frames:
    ``frame.to_ndarray(format=...)`` builds a new swscale context per frame, which costs ~100x
    the conversion of a small frame."""
    reformatter = VideoReformatter()
    for frame in frames:
        yield reformatter.reformat(frame, format="rgb24").to_ndarray()


def frame_time(frame: av.VideoFrame) -> float:
    """The frame's presentation time in seconds."""
    # A frame decoded from a demuxed stream always carries both (PyAV types them optional for
    # frames built by hand).
    return float(cast(int, frame.pts) * cast(Fraction, frame.time_base))


def decode_frame_times(path: Readable) -> list[float]:
    """Presentation time (seconds) of every decoded frame of ``path``, in order."""
    container, stream = open_video(path)
    with container:
        video.use_decode_threads(stream)
        return [frame_time(frame) for frame in container.decode(stream)]


def decode_frames(path: Readable) -> Iterator[tuple[float, np.ndarray]]:
    """Every frame of ``path`` in order as (presentation time in seconds, (H, W, 3) uint8 RGB)."""
    container, stream = open_video(path)
    with container:
        video.use_decode_threads(stream)
        reformatter = VideoReformatter()
        for frame in container.decode(stream):
            yield frame_time(frame), reformatter.reformat(frame, format="rgb24").to_ndarray()


def first_frame(path: Readable) -> np.ndarray | None:
    """The first decoded frame of ``path`` as RGB, None when it decodes to no frame."""
    container, stream = open_video(path)
    with container:
        for frame in container.decode(stream):
            return frame.to_ndarray(format="rgb24")
    return None


def frame_at(path: Readable, t: float, tolerance_s: float) -> tuple[float, np.ndarray] | None:
    """The first frame presented at ``t`` seconds or later (within ``tolerance_s``), with its
    time: seek to the keyframe before ``t``, decode on. None when there is no such frame."""
    container, stream = open_video(path)
    with container:
        # A demuxed stream always has a time base (PyAV types it optional for output streams).
        target = int(round(t / float(cast(Fraction, stream.time_base))))
        container.seek(target, stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            ft = frame_time(frame)
            if ft >= t - tolerance_s:
                return ft, frame.to_ndarray(format="rgb24")
    return None
