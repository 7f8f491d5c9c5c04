"""Decoded PyAV frames -> rgb24 pixels written straight into a slot of a reused batch buffer.

``frame.to_ndarray(format="rgb24")`` allocates a fresh frame-sized array per frame (page faults
on every frame, then a copy into the caller's buffer). When the native core is built, yuv420p
frames are converted by the native ``rgb`` kernel straight into the batch slot through lookup
tables calibrated from PyAV's own conversion, so pixels are identical to ``to_ndarray``; a
self-check on each video's first frame falls back to PyAV for that video if they ever differ.
Used by the HDF5 exporter; any decoder that fills reused batches (``dataset/video.py``) can use
``FrameConverter`` the same way. The ``*_reference`` functions are the numpy definitions the
kernels are tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import av
import numpy as np

from eva._native import load

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


def yuv420p_to_rgb24_reference(
    y_plane: np.ndarray,
    u_plane: np.ndarray,
    v_plane: np.ndarray,
    width: int,
    height: int,
    lut_r: np.ndarray,
    lut_b: np.ndarray,
    g_rows: np.ndarray,
    g_index: np.ndarray,
    batch: np.ndarray,
    slot: int,
) -> None:
    """Reference of ``eva_fast.rgb.yuv420p_to_rgb24`` (nearest chroma, table lookups)."""
    if g_rows.ndim != 2 or g_rows.shape[1] != 256 or len(g_rows) < 1:
        raise ValueError("g_rows must be shaped (n >= 1, 256)")
    y = y_plane[:height, :width].astype(np.intp)
    rows = np.arange(height) // 2
    cols = np.arange(width) // 2
    u = u_plane[rows][:, cols].astype(np.intp)
    v = v_plane[rows][:, cols].astype(np.intp)
    out = batch[slot]
    out[..., 0] = lut_r[v * 256 + y]
    green_row = np.minimum(g_index[u * 256 + v].astype(np.intp), len(g_rows) - 1)
    out[..., 1] = g_rows[green_row, y]
    out[..., 2] = lut_b[u * 256 + y]


pack_frame: Callable[[np.ndarray, np.ndarray, int], None] = (
    _native.pack_frame if _native is not None else pack_frame_reference
)


class YuvTables(NamedTuple):
    """PyAV's yuv420p -> rgb24 conversion as tables (the arguments of ``yuv420p_to_rgb24``).

    red ``lut_r[v*256+y]``, blue ``lut_b[u*256+y]``, green ``g_rows[g_index[u*256+v], y]``.
    """

    lut_r: np.ndarray
    lut_b: np.ndarray
    g_rows: np.ndarray
    g_index: np.ndarray


# Tables per (colorspace, color_range) of the decoded frames, built once per process; None when
# PyAV's conversion for that description is not a per-pixel function of this shape.
_yuv_tables: dict[tuple[int, int], YuvTables | None] = {}


def calibrate_yuv420p_luts(colorspace: int = 2, color_range: int = 0) -> YuvTables | None:
    """Tabulate PyAV's yuv420p -> rgb24 conversion for frames with this colour description.

    One 128x512 frame per U value covers every (V, Y) pair: chroma sample (row V, column k)
    covers the 2x2 luma block holding Y = 4k .. 4k+3. Red must depend on (V, Y) only and blue on
    (U, Y) only (checked here); green keeps all three but has only a few hundred distinct rows
    over Y, stored once each. Per-pixel (nearest chroma) behaviour at other frame sizes is checked
    by the tests and by a first-frame comparison on every exported video.
    """
    key = (colorspace, color_range)
    if key in _yuv_tables:
        return _yuv_tables[key]
    k = np.arange(64, dtype=np.uint8)
    luma = np.empty((512, 128), dtype=np.uint8)
    for dy in (0, 1):
        for dx in (0, 1):
            luma[dy::2, dx::2] = (4 * k + 2 * dy + dx)[None, :]
    v_plane = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 64, axis=1)
    green = np.empty((256, 256, 256), dtype=np.uint8)
    lut_r = np.empty((256, 256), dtype=np.uint8)
    lut_b = np.empty((256, 256), dtype=np.uint8)
    separable = True
    for u in range(256):
        u_plane = np.full((256, 64), u, dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(
            np.concatenate([luma.ravel(), u_plane.ravel(), v_plane.ravel()]).reshape(-1, 128),
            format="yuv420p",
        )
        frame.colorspace = colorspace
        frame.color_range = color_range
        rgb = frame.to_ndarray(format="rgb24")
        # [2V+dy, 2k+dx, c] -> [V, k, dy, dx, c] -> [V, Y=4k+2dy+dx, c]
        by_vy = rgb.reshape(256, 2, 64, 2, 3).transpose(0, 2, 1, 3, 4).reshape(256, 256, 3)
        green[u] = by_vy[:, :, 1]
        lut_b[u] = by_vy[0, :, 2]
        if u == 0:
            lut_r[:] = by_vy[:, :, 0]
        separable = (
            separable
            and np.array_equal(by_vy[:, :, 0], lut_r)
            and bool((by_vy[:, :, 2] == lut_b[u][None, :]).all())
        )
    tables: YuvTables | None = None
    if separable:
        # Deduplicate the green rows by their bytes (a dict is ~30x faster than np.unique here).
        flat = green.reshape(65536, 256)
        g_index = np.empty(65536, dtype=np.uint16)
        first_of_row: dict[bytes, int] = {}
        distinct: list[int] = []
        for uv in range(65536):
            row_id = first_of_row.setdefault(flat[uv].tobytes(), len(distinct))
            if row_id == len(distinct):
                distinct.append(uv)
            g_index[uv] = row_id
        tables = YuvTables(lut_r.reshape(-1), lut_b.reshape(-1), flat[distinct].copy(), g_index)
    _yuv_tables[key] = tables
    return tables


def _plane_array(plane: Any) -> np.ndarray:
    return np.frombuffer(plane, dtype=np.uint8).reshape(-1, plane.line_size)


class FrameConverter:
    """Writes decoded PyAV frames as rgb24 into a batch slot (native LUT path or PyAV's own)."""

    def __init__(self, native_convert: bool = True) -> None:
        self.use_native = native_convert and _native is not None
        self.native_frames = 0
        self.pyav_frames = 0
        self._luts: YuvTables | None = None
        self._luts_for: tuple[str, int, int] | None = None

    def start_video(self, first_frame: av.VideoFrame, batch: np.ndarray, slot: int) -> None:
        """Decide the path for a new video from its first frame (a self-check against PyAV)."""
        self._luts = None
        if self.use_native and first_frame.format.name == "yuv420p":
            luts = calibrate_yuv420p_luts(first_frame.colorspace, first_frame.color_range)
            if luts is not None:
                self._native_convert(first_frame, luts, batch, slot)
            if luts is not None and np.array_equal(
                batch[slot], first_frame.to_ndarray(format="rgb24")
            ):
                self._luts = luts
                self._luts_for = ("yuv420p", first_frame.colorspace, first_frame.color_range)
                self.native_frames += 1
                return
        self.convert(first_frame, batch, slot)

    def _native_convert(
        self,
        frame: av.VideoFrame,
        luts: YuvTables,
        batch: np.ndarray,
        slot: int,
    ) -> None:
        planes = frame.planes
        assert _native is not None  # use_native is set only when the kernel loaded
        _native.yuv420p_to_rgb24(
            _plane_array(planes[0]),
            _plane_array(planes[1]),
            _plane_array(planes[2]),
            frame.width,
            frame.height,
            *luts,
            batch,
            slot,
        )

    def convert(self, frame: av.VideoFrame, batch: np.ndarray, slot: int) -> None:
        # The tables hold for the calibrated pixel format and colour description only.
        described = (frame.format.name, frame.colorspace, frame.color_range)
        if self._luts is not None and described == self._luts_for:
            self._native_convert(frame, self._luts, batch, slot)
            self.native_frames += 1
        else:
            pack_frame(frame.to_ndarray(format="rgb24"), batch, slot)
            self.pyav_frames += 1
