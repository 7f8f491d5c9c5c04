# cython: language_level=3, boundscheck=False, wraparound=False
"""Lock-free SPSC snapshot ring (native/ring.hpp). Reference: eva/capture/ring.py."""

cimport numpy as cnp
from libc.stdint cimport uint64_t
from libcpp cimport bool as cbool

import numpy as np

cnp.import_array()

cdef extern from "ring.hpp" namespace "eva":
    cdef cppclass CRing "eva::SnapshotRing":
        CRing(size_t, size_t, size_t, size_t) except +
        cbool push(double, const void*) nogil
        size_t pop(void*, double*, size_t) nogil
        size_t discard(size_t) nogil
        cbool peek_time(double*) nogil
        size_t size() nogil
        uint64_t pushed() nogil
        uint64_t popped() nogil
        uint64_t overflow_count() nogil
        size_t high_water() nogil
        void reset_high_water() nogil
        size_t capacity() nogil
        size_t max_capacity() nogil
        size_t allocated_bytes() nogil

# Default for ``release_gil_min_bytes``: copies smaller than this keep the GIL. The push is called
# from Python, so it holds the GIL on entry; releasing it for the copy means re-taking it after,
# and with another busy Python thread (eva's own consumer, a driver loop) that waits up to a whole
# switch interval (5 ms). Measured for a 640x480x3 frame with one busy thread (bench_capture.py):
# GIL released p50 5.2 ms / p99 15.6 ms; GIL kept p50 39 us / p99 0.38 ms. A memcpy runs at about
# 9 GB/s, so only a sample whose copy itself takes milliseconds (>= 32 MiB) is worth releasing for.
cdef Py_ssize_t NOGIL_MIN_BYTES = 32 * 1024 * 1024


cdef class SnapshotRing:
    """Fixed-size sample slots plus a float64 time each; one producer thread, one consumer thread."""

    cdef CRing* ring
    cdef readonly tuple shape
    cdef readonly object dtype
    cdef readonly Py_ssize_t item_bytes
    cdef readonly Py_ssize_t block_slots
    cdef int typenum
    cdef readonly bint release_gil

    def __init__(self, shape, dtype, Py_ssize_t block_slots=64, Py_ssize_t initial_blocks=2,
                 Py_ssize_t max_bytes=0, release_gil_min_bytes=None):
        # The work is in __cinit__ (always run, so the C++ ring pointer is never left unset);
        # this gives the class a signature help() and stubtest can read.
        pass

    def __cinit__(self, shape, dtype, Py_ssize_t block_slots=64, Py_ssize_t initial_blocks=2,
                  Py_ssize_t max_bytes=0, release_gil_min_bytes=None):
        self.ring = NULL
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.item_bytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        if self.item_bytes <= 0:
            raise ValueError(f"ring sample shape {self.shape} holds no bytes")
        if block_slots <= 0 or initial_blocks <= 0:
            raise ValueError("ring block_slots and initial_blocks must be positive")
        self.block_slots = block_slots
        self.typenum = self.dtype.num
        threshold = NOGIL_MIN_BYTES if release_gil_min_bytes is None else release_gil_min_bytes
        self.release_gil = self.item_bytes >= threshold
        self.ring = new CRing(self.item_bytes, block_slots, initial_blocks, max_bytes)

    def __dealloc__(self):
        if self.ring != NULL:
            del self.ring

    def push(self, double t, sample) -> bool:
        """Copy ``sample`` into the next slot; False (and counted) when past the hard limit."""
        cdef cnp.ndarray arr
        cdef const void* src
        cdef cbool ok
        if (type(sample) is not np.ndarray or not cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>sample)
                or cnp.PyArray_TYPE(<cnp.ndarray>sample) != self.typenum):
            sample = np.ascontiguousarray(sample, dtype=self.dtype)
        arr = <cnp.ndarray>sample
        if cnp.PyArray_NBYTES(arr) != self.item_bytes:
            raise ValueError(
                f"sample shape {np.shape(sample)} does not match the ring's {self.shape}")
        src = cnp.PyArray_DATA(arr)
        if self.release_gil:
            with nogil:
                ok = self.ring.push(t, src)
        else:
            ok = self.ring.push(t, src)
        return ok

    def pop_batch(self, cnp.ndarray out, cnp.ndarray out_times, Py_ssize_t max_n=-1) -> int:
        """Copy up to ``max_n`` oldest samples into ``out[:n]`` / ``out_times[:n]``; return n."""
        cdef size_t n
        cdef size_t limit
        cdef void* dst
        cdef double* dst_t
        if not cnp.PyArray_ISCARRAY(out) or cnp.PyArray_TYPE(out) != self.typenum:
            raise ValueError("pop_batch: out must be a writable C-contiguous array of the ring dtype")
        # A 0-d out_times has no dims array to read its length from (a NULL read, not an error).
        if (not cnp.PyArray_ISCARRAY(out_times) or cnp.PyArray_TYPE(out_times) != cnp.NPY_FLOAT64
                or cnp.PyArray_NDIM(out_times) != 1):
            raise ValueError("pop_batch: out_times must be a writable C-contiguous 1-D float64 array")
        capacity = cnp.PyArray_NBYTES(out) // self.item_bytes
        limit = min(capacity, <size_t>cnp.PyArray_DIM(out_times, 0))
        if max_n >= 0:
            limit = min(<size_t>max_n, limit)
        dst = cnp.PyArray_DATA(out)
        dst_t = <double*>cnp.PyArray_DATA(out_times)
        with nogil:
            n = self.ring.pop(dst, dst_t, limit)
        return n

    def discard(self, Py_ssize_t max_n=-1) -> int:
        """Free up to ``max_n`` (all when negative) samples without reading them."""
        cdef size_t limit = <size_t>max_n if max_n >= 0 else <size_t>-1
        cdef size_t n
        with nogil:
            n = self.ring.discard(limit)
        return n

    def peek_time(self):
        """Capture time of the oldest unread sample, or None when empty (consumer side)."""
        cdef double t = 0.0
        if self.ring.peek_time(&t):
            return t
        return None

    def __len__(self) -> int:
        return self.ring.size()

    @property
    def pushed(self) -> int:
        return self.ring.pushed()

    @property
    def popped(self) -> int:
        return self.ring.popped()

    @property
    def overflow_count(self) -> int:
        return self.ring.overflow_count()

    @property
    def high_water(self) -> int:
        return self.ring.high_water()

    def reset_high_water(self) -> None:
        self.ring.reset_high_water()

    @property
    def capacity(self) -> int:
        return self.ring.capacity()

    @property
    def max_capacity(self) -> int:
        return self.ring.max_capacity()

    @property
    def allocated_bytes(self) -> int:
        return self.ring.allocated_bytes()
