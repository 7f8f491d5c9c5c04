# cython: language_level=3, boundscheck=False, wraparound=False
"""Native conversion of decoded frames to RGB (reference: ``eva.dataset.rgb``).

Both functions write one decoded frame into slot ``slot`` of a preallocated batch buffer shaped
(n, H, W, 3) uint8: the HDF5 exporter's chunk-sized blocks, the MCAP exporter's and the decoding
readers' batches, and the camera source workers' frames. The loops run with the GIL released so
decoder threads keep running.
"""

from libc.stdint cimport uint8_t, uint16_t


cdef extern from "rgb.hpp" namespace "eva::rgb" nogil:
    void copy_rows(const uint8_t* src, Py_ssize_t src_stride, size_t height, size_t row_bytes,
                   uint8_t* dst)
    void c_yuv420p_to_rgb24 "eva::rgb::yuv420p_to_rgb24"(
        const uint8_t* y_plane, Py_ssize_t y_stride, const uint8_t* u_plane, Py_ssize_t u_stride,
        const uint8_t* v_plane, Py_ssize_t v_stride, size_t width, size_t height,
        const uint8_t* lut_r, const uint8_t* lut_b, const uint8_t* g_rows, size_t g_row_count,
        const uint16_t* g_index, uint8_t* dst)


cdef inline void _check_slot(uint8_t[:, :, :, ::1] batch, Py_ssize_t slot, Py_ssize_t height,
                             Py_ssize_t width) except *:
    if batch.shape[3] != 3:
        raise ValueError(f"batch must be shaped (n, H, W, 3), got last axis {batch.shape[3]}")
    if batch.shape[1] != height or batch.shape[2] != width:
        raise ValueError(
            f"frame is {height}x{width} but the batch holds {batch.shape[1]}x{batch.shape[2]} frames"
        )
    if slot < 0 or slot >= batch.shape[0]:
        raise IndexError(f"slot {slot} outside a batch of {batch.shape[0]} frames")


def pack_frame(const uint8_t[:, :, :] frame, uint8_t[:, :, :, ::1] batch, Py_ssize_t slot):
    """Copy one (H, W, 3) frame whose rows may be padded (stride > W*3) into ``batch[slot]``."""
    cdef Py_ssize_t height = frame.shape[0]
    cdef Py_ssize_t width = frame.shape[1]
    if frame.shape[2] != 3 or frame.strides[2] != 1 or (width > 1 and frame.strides[1] != 3):
        raise ValueError("frame must be (H, W, 3) with packed pixels")
    _check_slot(batch, slot, height, width)
    if height == 0 or width == 0:
        return
    cdef Py_ssize_t stride = frame.strides[0]
    with nogil:
        copy_rows(&frame[0, 0, 0], stride, <size_t>height, <size_t>(width * 3),
                  &batch[slot, 0, 0, 0])


def yuv420p_to_rgb24(const uint8_t[:, ::1] y_plane, const uint8_t[:, ::1] u_plane,
                     const uint8_t[:, ::1] v_plane, Py_ssize_t width, Py_ssize_t height,
                     const uint8_t[::1] lut_r, const uint8_t[::1] lut_b,
                     const uint8_t[:, ::1] g_rows, const uint16_t[::1] g_index,
                     uint8_t[:, :, :, ::1] batch, Py_ssize_t slot):
    """Convert one yuv420p frame (planes shaped (rows, line_size)) into ``batch[slot]`` as rgb24.

    red ``lut_r[v*256+y]``, blue ``lut_b[u*256+y]``, green ``g_rows[g_index[u*256+v], y]``.
    """
    cdef Py_ssize_t chroma_w = (width + 1) // 2
    cdef Py_ssize_t chroma_h = (height + 1) // 2
    if width <= 0 or height <= 0:
        raise ValueError(f"invalid frame size {width}x{height}")
    if y_plane.shape[0] < height or y_plane.shape[1] < width:
        raise ValueError("luma plane smaller than the frame")
    if (u_plane.shape[0] < chroma_h or u_plane.shape[1] < chroma_w
            or v_plane.shape[0] < chroma_h or v_plane.shape[1] < chroma_w):
        raise ValueError("chroma plane smaller than half the frame")
    if lut_r.shape[0] != 65536 or lut_b.shape[0] != 65536 or g_index.shape[0] != 65536:
        raise ValueError("lut_r, lut_b and g_index must hold 2**16 entries")
    if g_rows.shape[0] < 1 or g_rows.shape[1] != 256:
        raise ValueError("g_rows must be shaped (n >= 1, 256)")
    _check_slot(batch, slot, height, width)
    cdef Py_ssize_t ys = y_plane.strides[0]
    cdef Py_ssize_t us = u_plane.strides[0]
    cdef Py_ssize_t vs = v_plane.strides[0]
    cdef size_t row_count = <size_t>g_rows.shape[0]
    with nogil:
        c_yuv420p_to_rgb24(&y_plane[0, 0], ys, &u_plane[0, 0], us, &v_plane[0, 0], vs,
                           <size_t>width, <size_t>height, &lut_r[0], &lut_b[0], &g_rows[0, 0],
                           row_count, &g_index[0], &batch[slot, 0, 0, 0])
