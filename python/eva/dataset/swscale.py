"""Decoded frames -> rgb24 straight into a batch slot, by the libswscale PyAV itself loaded.

``frame.to_ndarray(format="rgb24")`` runs libswscale into a new frame, then the caller copies
that frame into its batch: per 640x480 frame about 0.13 ms of conversion plus 0.2-0.35 ms of
writing and re-reading 0.9 MB through the caches. Called here through ``ctypes`` with the batch
slot as its destination, the same conversion costs 0.15 ms and nothing more. The library is the very one PyAV
uses (found among the process's mapped files after ``import av``), so the code that computes
the pixels is PyAV's; ``FrameConverter`` still compares each video's first frame with
``to_ndarray`` and converts through PyAV when they differ, so a colour description this call
does not reproduce costs speed, never pixels.

Only the stable part of libswscale's C interface is used (``sws_getContext``,
``sws_setColorspaceDetails``, ``sws_scale``, ``sws_freeContext``, and pixel format numbers that
have not changed since FFmpeg 0.x), with plain pointers: no FFmpeg struct layout is assumed.
A scaler is made for one frame geometry and colour description and used by one thread
(``sws_scale`` on one context is not thread-safe); ``ctypes`` releases the GIL during the call.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

__all__ = ["Rgb24Scaler", "available", "library_path"]

# AVPixelFormat numbers of the three-plane 8-bit formats handled here (FFmpeg's ABI keeps them).
_PIX_FMTS = {
    "yuv420p": 0,
    "yuv422p": 4,
    "yuv444p": 5,
    "yuvj420p": 12,
    "yuvj422p": 13,
    "yuvj444p": 14,
}
_FULL_RANGE_FORMATS = {"yuvj420p", "yuvj422p", "yuvj444p"}
_RGB24 = 2
_VECTOR_PIXELS = 16
_ALIGN = 16  # every slot of a batch of these widths starts 16-byte aligned like the first
_SWS_BILINEAR = 2  # PyAV's default interpolation (no scaling happens: the sizes are equal)
_AVCOL_RANGE_JPEG = 2
# AVColorSpace values whose libswscale coefficient table has the same number (BT.709, FCC,
# BT.470BG, SMPTE 170M, SMPTE 240M, BT.2020); anything else is converted as unspecified.
_KNOWN_COLORSPACES = {1, 4, 5, 6, 7, 9, 10}
_UNSPECIFIED_COLORSPACE = 2

_library: Any = None
_searched = False


def library_path() -> str | None:
    """The libswscale mapped into this process by PyAV (None: not found, or not on Linux)."""
    import av.video.reformatter  # noqa: F401  # links libswscale into the process

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    if os.path.basename(path).startswith("libswscale") and ".so" in path:
                        return path
    except OSError:
        return None
    return None


def _load() -> Any:
    global _library, _searched
    if _searched:
        return _library
    _searched = True
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        lib.sws_getContext.restype = ctypes.c_void_p
        lib.sws_getContext.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 3
        lib.sws_getCoefficients.restype = ctypes.c_void_p
        lib.sws_getCoefficients.argtypes = [ctypes.c_int]
        lib.sws_setColorspaceDetails.restype = ctypes.c_int
        lib.sws_setColorspaceDetails.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.sws_scale.restype = ctypes.c_int
        lib.sws_scale.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int),
        ]
        lib.sws_freeContext.restype = None
        lib.sws_freeContext.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):  # not loadable, or an interface without these symbols
        return None
    _library = lib
    return lib


def available() -> bool:
    return _load() is not None


class Rgb24Scaler:
    """libswscale converting frames of one size, pixel format and colour description to rgb24
    written into ``(H, W, 3)`` uint8 slots. Raises ``ValueError`` for what it does not handle
    (check ``supports`` first)."""

    def __init__(self, width: int, height: int, pix_fmt: str, colorspace: int, color_range: int):
        self._ctx: int | None = None
        lib = _load()
        if lib is None:
            raise ValueError("libswscale is not available")
        if not self.supports(pix_fmt, width) or height <= 0:
            raise ValueError(f"cannot convert {pix_fmt} {width}x{height}")
        self._lib = lib
        self.width = width
        self.height = height
        self._ctx = lib.sws_getContext(
            width,
            height,
            _PIX_FMTS[pix_fmt],
            width,
            height,
            _RGB24,
            _SWS_BILINEAR,
            None,
            None,
            None,
        )
        if not self._ctx:
            raise ValueError(f"libswscale refuses {pix_fmt} {width}x{height} -> rgb24")
        if colorspace != _UNSPECIFIED_COLORSPACE or color_range == _AVCOL_RANGE_JPEG:
            # as the frame describes itself: its matrix, its range; rgb out is full range
            table = lib.sws_getCoefficients(
                colorspace if colorspace in _KNOWN_COLORSPACES else _UNSPECIFIED_COLORSPACE
            )
            full = color_range == _AVCOL_RANGE_JPEG or pix_fmt in _FULL_RANGE_FORMATS
            lib.sws_setColorspaceDetails(self._ctx, table, int(full), table, 1, 0, 1 << 16, 1 << 16)
        self._src = (ctypes.c_void_p * 4)()
        self._src_stride = (ctypes.c_int * 4)()
        self._dst = (ctypes.c_void_p * 4)()
        self._dst_stride = (ctypes.c_int * 4)(width * 3, 0, 0, 0)

    @staticmethod
    def supports(pix_fmt: str, width: int) -> bool:
        """Whether frames of this format and width can be tried. libswscale's vectorised
        converters go 16 pixels at a time; the last columns of a width that is not a multiple
        of 16 take another path than PyAV's padded frames, with other pixels (seen at 66, 100
        and 322 pixels)."""
        return pix_fmt in _PIX_FMTS and width > 0 and width % _VECTOR_PIXELS == 0 and available()

    def convert(self, frame: Any, out: np.ndarray) -> None:
        """``frame`` (a PyAV ``VideoFrame`` of this scaler's size and format) into ``out``, a
        C-contiguous (H, W, 3) uint8 array."""
        if out.shape != (self.height, self.width, 3) or not out.flags.c_contiguous:
            raise ValueError(f"out must be a contiguous ({self.height}, {self.width}, 3) array")
        if out.dtype != np.uint8 or out.ctypes.data % _ALIGN:
            raise ValueError(f"out must be {_ALIGN}-byte aligned uint8")
        if frame.width != self.width or frame.height != self.height:
            raise ValueError(
                f"frame is {frame.width}x{frame.height}, not {self.width}x{self.height}"
            )
        planes = frame.planes
        for i in range(3):
            self._src[i] = planes[i].buffer_ptr
            self._src_stride[i] = planes[i].line_size
        self._dst[0] = out.ctypes.data
        rows = self._lib.sws_scale(
            self._ctx, self._src, self._src_stride, 0, self.height, self._dst, self._dst_stride
        )
        if rows != self.height:
            raise ValueError(f"libswscale wrote {rows} of {self.height} rows")

    def close(self) -> None:
        if self._ctx:
            self._lib.sws_freeContext(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        if getattr(self, "_ctx", None):
            self.close()
