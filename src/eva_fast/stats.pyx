# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Native per-episode statistics accumulators (see native/stats.hpp, eva.dataset.stats).

Thin bindings: inputs are C-contiguous buffers validated by eva.dataset.stats; the loops run with
the GIL released. One accumulator instance must be fed from one thread at a time.
"""

from libc.stdint cimport uint8_t, uint64_t
from libcpp.memory cimport unique_ptr

import numpy as np

cdef extern from "stats.hpp" namespace "eva::stats" nogil:
    cdef cppclass CppImageAccumulator "eva::stats::ImageAccumulator":
        CppImageAccumulator()
        void update(const uint8_t* pixels, size_t n_pixels, size_t n_frames) noexcept
        const uint64_t* histogram() noexcept
        uint64_t frame_count() noexcept
        uint64_t pixel_count() noexcept

    cdef cppclass CppVectorAccumulator "eva::stats::VectorAccumulator":
        CppVectorAccumulator(size_t dim) except +
        void update_f64(const double* rows, size_t n) noexcept
        void update_f32(const float* rows, size_t n) noexcept
        size_t dim() noexcept
        uint64_t count() noexcept
        const double* min() noexcept
        const double* max() noexcept
        const double* mean() noexcept
        const double* m2() noexcept


cdef class ImageAccumulator:
    """Exact per-channel 256-bin histogram of interleaved RGB uint8 pixels."""

    cdef CppImageAccumulator acc

    def update(self, const uint8_t[::1] pixels not None, Py_ssize_t n_frames):
        """Add n_frames frames given as one flat C-contiguous buffer of interleaved RGB bytes."""
        cdef Py_ssize_t n_bytes = pixels.shape[0]
        if n_bytes % 3 != 0:
            raise ValueError(f"pixel buffer length {n_bytes} is not a multiple of 3")
        if n_frames < 0:
            raise ValueError("n_frames must be >= 0")
        if n_bytes == 0:
            self.acc.update(NULL, 0, n_frames)
            return
        with nogil:
            self.acc.update(&pixels[0], <size_t>(n_bytes // 3), <size_t>n_frames)

    def histogram(self):
        """(768,) uint64 counts: index channel * 256 + value (a copy)."""
        out = np.empty(768, dtype=np.uint64)
        cdef uint64_t[::1] view = out
        cdef const uint64_t* hist = self.acc.histogram()
        cdef Py_ssize_t i
        for i in range(768):
            view[i] = hist[i]
        return out

    @property
    def frame_count(self):
        return self.acc.frame_count()

    @property
    def pixel_count(self):
        return self.acc.pixel_count()


cdef class VectorAccumulator:
    """Running float64 per-dim count, min, max, mean, M2 over (n, dim) row batches."""

    cdef unique_ptr[CppVectorAccumulator] acc
    cdef Py_ssize_t _dim

    def __init__(self, Py_ssize_t dim):
        # The work is in __cinit__ (always run); this gives the class a signature for help()
        # and stubtest.
        pass

    def __cinit__(self, Py_ssize_t dim):
        if dim < 1:
            raise ValueError(f"vector dim must be >= 1, got {dim}")
        self._dim = dim
        self.acc.reset(new CppVectorAccumulator(<size_t>dim))

    def update_f64(self, const double[:, ::1] rows not None):
        if rows.shape[1] != self._dim:
            raise ValueError(f"expected (n, {self._dim}) rows, got (n, {rows.shape[1]})")
        cdef size_t n = <size_t>rows.shape[0]
        if n == 0:
            return
        with nogil:
            self.acc.get().update_f64(&rows[0, 0], n)

    def update_f32(self, const float[:, ::1] rows not None):
        if rows.shape[1] != self._dim:
            raise ValueError(f"expected (n, {self._dim}) rows, got (n, {rows.shape[1]})")
        cdef size_t n = <size_t>rows.shape[0]
        if n == 0:
            return
        with nogil:
            self.acc.get().update_f32(&rows[0, 0], n)

    @property
    def dim(self):
        return self._dim

    @property
    def count(self):
        return self.acc.get().count()

    def moments(self):
        """(min, max, mean, m2) as float64 arrays of length dim (copies)."""
        cdef CppVectorAccumulator* acc = self.acc.get()
        return (
            _copy_doubles(acc.min(), self._dim),
            _copy_doubles(acc.max(), self._dim),
            _copy_doubles(acc.mean(), self._dim),
            _copy_doubles(acc.m2(), self._dim),
        )


cdef object _copy_doubles(const double* values, Py_ssize_t n):
    out = np.empty(n, dtype=np.float64)
    cdef double[::1] view = out
    cdef Py_ssize_t i
    for i in range(n):
        view[i] = values[i]
    return out
