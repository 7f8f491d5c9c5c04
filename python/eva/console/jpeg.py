"""JPEG encoding of preview frames through PyAV's MJPEG encoder (no imaging library needed)."""

from __future__ import annotations

import threading
from fractions import Fraction

import av
import numpy as np


class JpegEncoder:
    """Encodes RGB frames of one size as baseline JPEGs, reusing one MJPEG codec context (MJPEG
    frames are independent: each ``encode`` gives its packet at once, nothing is buffered).
    ``quality`` is FFmpeg's qscale (2 best .. 31 worst). Odd sizes lose one pixel row/column
    (yuv420 needs even sizes). Thread-safe: one encode at a time."""

    def __init__(self, width: int, height: int, quality: int = 5) -> None:
        self.width, self.height = width & ~1, height & ~1
        codec = av.CodecContext.create("mjpeg", "w")
        codec.width, codec.height = self.width, self.height
        codec.pix_fmt = "yuvj420p"
        codec.time_base = Fraction(1, 30)
        codec.flags |= av.codec.context.Flags.qscale  # fixed quality, no rate control
        codec.qmin = codec.qmax = quality
        self._codec = codec
        self._pts = 0
        self._lock = threading.Lock()

    def encode(self, frame: np.ndarray) -> bytes:
        rgb = np.ascontiguousarray(frame[: self.height, : self.width])
        video = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuvj420p")
        with self._lock:
            video.pts = self._pts
            self._pts += 1
            packets = self._codec.encode(video)
        return b"".join(bytes(p) for p in packets)
