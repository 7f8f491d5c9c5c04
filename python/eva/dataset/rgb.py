"""Decoded PyAV frames -> rgb24 pixels written straight into a slot of a reused batch buffer.

``frame.to_ndarray(format="rgb24")`` converts into a fresh frame-sized buffer that the caller
then copies into its batch. ``FrameConverter`` writes into the slot itself, by the first of:

1. libswscale, the library PyAV converts with, called with the slot as its destination
   (``eva.dataset.swscale``: 0.15 ms a 640x480 frame);
2. the native ``rgb`` kernel, lookup tables calibrated from PyAV's own conversion (0.5 ms);
3. PyAV's ``to_ndarray`` and a copy (0.35-0.5 ms).

The first two are checked on each video's first frame against ``to_ndarray`` and used for that
video only if the pixels are identical, so every path gives PyAV's pixels. Used by the HDF5 and
MCAP exporters (``dataset/video.py``'s batch decoders) and by camera sources. The
``*_reference`` functions are the numpy definitions the kernels are tested against.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

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

    One frame of 16 x 16 tiles, a tile of 128x512 luma per U value, covers every (U, V, Y): in a
    tile, chroma sample (row V, column k) covers the 2x2 luma block holding Y = 4k .. 4k+3. One
    conversion of the whole frame (not 256 small ones: each new frame size costs FFmpeg a scaler
    set-up of milliseconds). Red must depend on (V, Y) only and blue on (U, Y) only (checked
    here); green keeps all three but has only a few hundred distinct rows over Y, stored once
    each. Per-pixel (nearest chroma) behaviour at other frame sizes is checked by the tests and by
    a first-frame comparison on every exported video.
    """
    key = (colorspace, color_range)
    if key in _yuv_tables:
        return _yuv_tables[key]
    cache = tables_cache_path(colorspace, color_range)
    cached = _load_tables(cache) if cache is not None else None
    if cached is not None:
        _yuv_tables[key] = cached
        return cached
    k = np.arange(64, dtype=np.uint8)
    tile = np.empty((512, 128), dtype=np.uint8)
    for dy in (0, 1):
        for dx in (0, 1):
            tile[dy::2, dx::2] = (4 * k + 2 * dy + dx)[None, :]
    # tiles: row-major over U = 16 * tile_row + tile_col; chroma planes (256 x 64 per tile)
    luma = np.tile(tile, (16, 16))
    u_plane = np.repeat(np.repeat(np.arange(256, dtype=np.uint8).reshape(16, 16), 256, 0), 64, 1)
    v_plane = np.tile(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 64, axis=1), (16, 16))
    frame = av.VideoFrame.from_ndarray(
        np.concatenate([luma.ravel(), u_plane.ravel(), v_plane.ravel()]).reshape(-1, 2048),
        format="yuv420p",
    )
    frame.colorspace = colorspace
    frame.color_range = color_range
    rgb = frame.to_ndarray(format="rgb24")
    # a view [tile_row, V, dy, tile_col, k, dx, channel]: U = 16 tile_row + tile_col and
    # Y = 4k + 2dy + dx; compared and gathered without copying the whole 50 MB
    view = rgb.reshape(16, 256, 2, 16, 64, 2, 3)
    red, blue = view[..., 0], view[..., 2]
    red_of_u0 = red[0, :, :, 0]  # [V, dy, k, dx]
    blue_of_v0 = blue[:, 0]  # [tile_row, dy, tile_col, k, dx]
    separable = bool(
        (red == red_of_u0[None, :, :, None]).all() and (blue == blue_of_v0[:, None]).all()
    )
    tables: YuvTables | None = None
    if separable:
        lut_r = red_of_u0.transpose(0, 2, 1, 3).reshape(65536)  # [V*256 + Y]
        lut_b = blue_of_v0.transpose(0, 2, 3, 1, 4).reshape(65536)  # [U*256 + Y]
        # green [U*256 + V, Y]
        green = view[..., 1].transpose(0, 3, 1, 4, 2, 5).reshape(65536, 256)
        g_index, distinct = _distinct_rows(green)
        tables = YuvTables(lut_r, lut_b, green[distinct], g_index)
        if cache is not None:
            _save_tables(cache, tables)
    _yuv_tables[key] = tables
    return tables


def tables_cache_path(colorspace: int, color_range: int) -> Path | None:
    """Where the tables of this colour description are kept between processes: the user's
    cache directory (``EVA_CACHE_DIR``, else ``$XDG_CACHE_HOME/eva``, else ``~/.cache/eva``),
    one file per PyAV and libswscale version (another version may convert differently)."""
    root = os.environ.get("EVA_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg else Path.home() / ".cache"
        root = str(base / "eva")
    swscale = ".".join(map(str, av.library_versions.get("libswscale", ())))
    name = f"yuv420p-rgb24-av{av.__version__}-sws{swscale}-cs{colorspace}-cr{color_range}.npz"
    return Path(root) / name


def _load_tables(path: Path) -> YuvTables | None:
    """The cached tables, or None if absent or not exactly what a calibration gives (a damaged
    or foreign file is ignored, then replaced)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            tables = YuvTables(*(data[name] for name in YuvTables._fields))
            digest = str(data["sha256"])
    except Exception:  # any unreadable file (a bad zip, a missing array): calibrate instead
        return None
    shapes_ok = (
        tables.lut_r.shape == tables.lut_b.shape == (65536,)
        and tables.lut_r.dtype == tables.lut_b.dtype == tables.g_rows.dtype == np.uint8
        and tables.g_rows.ndim == 2
        and tables.g_rows.shape[1] == 256
        and 0 < tables.g_rows.shape[0] <= 65536
        and tables.g_index.shape == (65536,)
        and tables.g_index.dtype == np.uint16
        and int(tables.g_index.max()) < tables.g_rows.shape[0]
    )
    if not shapes_ok or digest != _digest(tables):
        return None
    return tables


def _save_tables(path: Path, tables: YuvTables) -> None:
    """Written to a temporary file then renamed, so a reader never sees half a file; a cache
    that cannot be written (read-only home, full disk) only costs the next process a
    calibration."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tables-", suffix=".npz", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **tables._asdict(), sha256=np.array(_digest(tables)))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass


def _digest(tables: YuvTables) -> str:
    h = hashlib.sha256()
    for array in tables:
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's id among the distinct rows (numbered by first appearance, uint16) and the
    index of each distinct row's first appearance. Rows (a multiple of 8 bytes long) are
    compared through a 64-bit hash of their bytes, then checked whole: a collision (never seen)
    falls back to exact keys."""
    words = np.ascontiguousarray(rows).view(np.uint64)  # 8 bytes a word, no conversion
    odd = np.random.default_rng(0).integers(0, 2**63, words.shape[1], dtype=np.uint64) * 2 + 1
    hashes = (words * odd).sum(axis=1, dtype=np.uint64)  # wraps modulo 2**64
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    if not np.array_equal(rows, rows[first[inverse]]):
        keys = rows.view(np.dtype((np.void, rows.shape[1]))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # ids by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.ravel()].astype(np.uint16), first[order]


def _plane_array(plane: Any) -> np.ndarray:
    return np.frombuffer(plane, dtype=np.uint8).reshape(-1, plane.line_size)


class FrameConverter:
    """Writes decoded PyAV frames as rgb24 into a batch slot: libswscale called straight into
    the slot (``eva.dataset.swscale``), else the native LUT kernel, else PyAV's own conversion
    and a copy. Whichever is chosen for a video has matched ``to_ndarray`` on its first frame.

    ``native_frames`` counts the frames written straight into their slot (libswscale or the LUT
    kernel), ``pyav_frames`` those converted by ``to_ndarray`` and copied."""

    def __init__(self, native_convert: bool = True) -> None:
        self.use_native = native_convert and _native is not None
        self.native_frames = 0
        self.pyav_frames = 0
        self._luts: YuvTables | None = None
        self._luts_for: tuple[str, int, int] | None = None
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
        self._luts = None
        if self.use_native and self._start_scaler(first_frame, batch, slot):
            self.native_frames += 1
            return
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
        # A scaler and the tables hold for the checked frame description only.
        if self._scaler is not None and self._description(frame) == self._scaler_for:
            try:
                self._scaler.convert(frame, batch[slot])
            except ValueError:  # a slot unlike the checked one (another batch): PyAV's way
                pass
            else:
                self.native_frames += 1
                return
        described = (frame.format.name, frame.colorspace, frame.color_range)
        if self._luts is not None and described == self._luts_for:
            self._native_convert(frame, self._luts, batch, slot)
            self.native_frames += 1
        else:
            pack_frame(frame.to_ndarray(format="rgb24"), batch, slot)
            self.pyav_frames += 1
