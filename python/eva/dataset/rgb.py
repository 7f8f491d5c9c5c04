"""Decoded PyAV frames -> rgb24 pixels written straight into a slot of a reused batch buffer.

``frame.to_ndarray(format="rgb24")`` converts into a fresh frame-sized buffer that the caller
then copies into its batch. ``FrameConverter`` writes into the slot itself, by the first of:

1. libswscale, the library PyAV converts with, called with the slot as its destination
   (``eva.dataset.swscale``: 0.13-0.15 ms a 640x480 frame), for widths that are a multiple of
   16 pixels; checked on each video's first frame against ``to_ndarray`` and used for that video
   only if the pixels are identical;
2. otherwise PyAV's ``to_ndarray`` and a copy into the slot (``pack_frame``: 0.2-0.45 ms).

eva's own lookup-table kernel once sat between the two; measured 1.5-3.6x slower than
``to_ndarray`` and a copy wherever it was taken (bench/README.md), it is gone. Used by the HDF5
and MCAP exporters (``dataset/video.py``'s batch decoders) and by camera sources.
``pack_frame_reference`` is the numpy definition the native ``pack_frame`` is tested against.
"""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np

from eva._native import load
from eva.dataset import swscale

_native = load("rgb")


def pack_frame_reference(frame: np.ndarray, batch: np.ndarray, slot: int) -> None:
    """Reference of ``eva_fast.rgb.pack_frame``: copy an (H, W, 3) frame into batch[slot]."""
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError("frame must be (H, W, 3) with packed pixels")
    if batch.shape[1:] != frame.shape:
        raise ValueError(
            f"frame is {frame.shape[0]}x{frame.shape[1]} but the batch holds "
            f"{batch.shape[1]}x{batch.shape[2]} frames"
        )
    if not 0 <= slot < batch.shape[0]:
        raise IndexError(f"slot {slot} outside a batch of {batch.shape[0]} frames")
    batch[slot] = frame


pack_frame: Callable[[np.ndarray, np.ndarray, int], None] = (
    _native.pack_frame if _native is not None else pack_frame_reference
)


class FrameConverter:
    """Writes decoded PyAV frames as rgb24 into a batch slot: libswscale called straight into
    the slot (``eva.dataset.swscale``) where it matched ``to_ndarray`` on the video's first
    frame, else PyAV's own conversion and a copy.

    ``native_frames`` counts the frames written straight into their slot by libswscale,
    ``pyav_frames`` those converted by ``to_ndarray`` and copied."""

    def __init__(self, native_convert: bool = True) -> None:
        # EVA_PUREPYTHON (no native kernels) means PyAV's conversion everywhere
        self.use_native = native_convert and _native is not None
        self.native_frames = 0
        self.pyav_frames = 0
        self._scaler: swscale.Rgb24Scaler | None = None
        self._scaler_for: tuple[str, int, int, int, int] | None = None

    @staticmethod
    def _description(frame: av.VideoFrame) -> tuple[str, int, int, int, int]:
        return (frame.format.name, frame.width, frame.height, frame.colorspace, frame.color_range)

    def _start_scaler(self, frame: av.VideoFrame, batch: np.ndarray, slot: int) -> bool:
        """libswscale for this video, if it reproduces ``to_ndarray`` on its first frame."""
        if self._scaler is not None:
            self._scaler.close()
        self._scaler = self._scaler_for = None
        described = self._description(frame)
        if not swscale.Rgb24Scaler.supports(described[0], described[1]):
            return False
        try:
            pix_fmt, width, height, colorspace, color_range = described
            scaler = swscale.Rgb24Scaler(width, height, pix_fmt, colorspace, color_range)
            scaler.convert(frame, batch[slot])
        except ValueError:
            return False
        if not np.array_equal(batch[slot], frame.to_ndarray(format="rgb24")):
            scaler.close()
            return False
        self._scaler, self._scaler_for = scaler, described
        return True

    def start_video(self, first_frame: av.VideoFrame, batch: np.ndarray, slot: int) -> None:
        """Decide the path for a new video from its first frame (a self-check against PyAV)."""
        if self.use_native and self._start_scaler(first_frame, batch, slot):
            self.native_frames += 1
            return
        self.convert(first_frame, batch, slot)

    def convert(self, frame: av.VideoFrame, batch: np.ndarray, slot: int) -> None:
        # A scaler holds for the checked frame description only.
        if self._scaler is not None and self._description(frame) == self._scaler_for:
            try:
                self._scaler.convert(frame, batch[slot])
            except ValueError:  # a slot unlike the checked one (another batch): PyAV's way
                pass
            else:
                self.native_frames += 1
                return
        pack_frame(frame.to_ndarray(format="rgb24"), batch, slot)
        self.pyav_frames += 1
