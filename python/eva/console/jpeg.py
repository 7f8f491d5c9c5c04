"""JPEG encoding of preview frames through PyAV's MJPEG encoder (no imaging library needed)."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np


def encode_jpeg(frame: np.ndarray, quality: int = 5) -> bytes:
    """One (H, W, 3) uint8 RGB frame as a baseline JPEG; ``quality`` is FFmpeg's qscale
    (2 best .. 31 worst). Odd sizes are cropped by one pixel (yuv420 needs even sizes)."""
    height, width = frame.shape[0] & ~1, frame.shape[1] & ~1
    rgb = np.ascontiguousarray(frame[:height, :width])
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height = width, height
    codec.pix_fmt = "yuvj420p"
    codec.time_base = Fraction(1, 30)
    codec.options = {"qscale": str(quality)}
    # fixed quality: qscale applies only with the qscale flag set
    codec.flags |= av.codec.context.Flags.qscale
    codec.qmin = codec.qmax = quality
    video = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuvj420p")
    packets = list(codec.encode(video)) + list(codec.encode(None))
    return b"".join(bytes(p) for p in packets)
