# cython: language_level=3, boundscheck=False, wraparound=False
"""Native packing of decoded RGB frames into a batch (reference: ``eva.dataset.rgb``).

``pack_frame`` writes one decoded frame into slot ``slot`` of a preallocated batch buffer shaped
(n, H, W, 3) uint8: the HDF5 exporter's chunk-sized blocks, the MCAP exporter's and the decoding
readers' batches, and the camera source workers' frames. The loops run with the GIL released so
decoder threads keep running.
"""

from libc.stdint cimport uint8_t


cdef extern from "rgb.hpp" namespace "eva::rgb" nogil:
    void copy_rows(const uint8_t* src, Py_ssize_t src_stride, size_t height, size_t row_bytes,
                   uint8_t* dst)


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
