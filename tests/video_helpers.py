"""Tiny real videos for the exporter tests: encode frames with PyAV, decode a file the way any
consumer would (PyAV, rgb24), so exported pixels can be compared with an independent decode."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

NO_BFRAMES = {"g": "30", "bf": "0", "sc_threshold": "0", "preset": "ultrafast"}


def encode_video(
    path: Path,
    frames: np.ndarray,
    fmt: str | None = None,
    codec: str = "libx264",
    options: dict[str, str] | None = None,
) -> Path:
    """(n, H, W, 3) uint8 frames -> a yuv420p file at 30 fps (by default no B-frames, fixed GOP;
    ``options``: the encoder's options instead)."""
    container = av.open(str(path), "w", format=fmt)
    stream = container.add_stream(codec, rate=30)
    stream.width, stream.height = frames.shape[2], frames.shape[1]
    stream.pix_fmt = "yuv420p"
    stream.options = dict(NO_BFRAMES if options is None else options)
    for image in frames:
        for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return path


def pyav_decode(path: Path) -> np.ndarray:
    """Every frame of the first video stream as an (n, H, W, 3) rgb24 array."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
