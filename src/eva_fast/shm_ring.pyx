# cython: language_level=3, boundscheck=False, wraparound=False
"""Cross-process SPSC snapshot ring over a shared mapping (native/shm_ring.hpp).

Reference and file handling (create / attach / header checks): eva/capture/shm_ring.py, which
maps the file and hands the ``mmap`` to this class; both use the same bytes.
"""

cimport numpy as cnp
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint64_t
from libcpp cimport bool as cbool

import os

import numpy as np

cnp.import_array()

cdef extern from "shm_ring.hpp" namespace "eva":
    cdef cppclass CShmRing "eva::ShmRing":
        CShmRing(void*, size_t) except +
        cbool push(double, const void*) nogil
        void heartbeat(uint64_t) nogil
        void set_producer_pid(uint64_t) nogil
        size_t pop(void*, double*, size_t) nogil
        size_t discard(size_t) nogil
        cbool peek_time(double*) nogil
        void request_stop() nogil
        void reset_high_water() nogil
        size_t size() nogil
        uint64_t pushed() nogil
        uint64_t popped() nogil
        uint64_t overflow_count() nogil
        uint64_t high_water() nogil
        uint64_t heartbeat_ns() nogil
        uint64_t producer_pid() nogil
        uint64_t consumer_pid() nogil
        cbool stop_requested() nogil
        size_t slots() nogil
        size_t item_bytes() nogil
        size_t slot_stride() nogil
        size_t file_bytes() nogil

cdef extern from "shm_ring.hpp" nogil:
    uint64_t monotonic_ns "eva::ShmRing::monotonic_ns"()
    const char* kMagic "eva::shm_layout::kMagic"
    const unsigned int kVersion "eva::shm_layout::kVersion"
    const size_t kAlign "eva::shm_layout::kAlign"
    const size_t kHeaderBytes "eva::shm_layout::kHeaderBytes"
    const size_t kMaxDims "eva::shm_layout::kMaxDims"
    const size_t kDtypeBytes "eva::shm_layout::kDtypeBytes"
    const size_t kOffMagic "eva::shm_layout::kOffMagic"
    const size_t kOffVersion "eva::shm_layout::kOffVersion"
    const size_t kOffHeaderBytes "eva::shm_layout::kOffHeaderBytes"
    const size_t kOffItemBytes "eva::shm_layout::kOffItemBytes"
    const size_t kOffSlots "eva::shm_layout::kOffSlots"
    const size_t kOffSlotStride "eva::shm_layout::kOffSlotStride"
    const size_t kOffTimesOffset "eva::shm_layout::kOffTimesOffset"
    const size_t kOffDataOffset "eva::shm_layout::kOffDataOffset"
    const size_t kOffFileBytes "eva::shm_layout::kOffFileBytes"
    const size_t kOffNdim "eva::shm_layout::kOffNdim"
    const size_t kOffConsumerPid "eva::shm_layout::kOffConsumerPid"
    const size_t kOffDtype "eva::shm_layout::kOffDtype"
    const size_t kOffShape "eva::shm_layout::kOffShape"
    const size_t kOffHead "eva::shm_layout::kOffHead"
    const size_t kOffOverflow "eva::shm_layout::kOffOverflow"
    const size_t kOffHeartbeat "eva::shm_layout::kOffHeartbeat"
    const size_t kOffProducerPid "eva::shm_layout::kOffProducerPid"
    const size_t kOffHighWater "eva::shm_layout::kOffHighWater"
    const size_t kOffTail "eva::shm_layout::kOffTail"
    const size_t kOffStop "eva::shm_layout::kOffStop"

# The C++ layout constants (tests compare them with eva/capture/shm_ring.py's).
LAYOUT = {
    "magic": (<bytes>kMagic)[:8],
    "version": kVersion,
    "align": kAlign,
    "header_bytes": kHeaderBytes,
    "max_dims": kMaxDims,
    "dtype_bytes": kDtypeBytes,
    "magic_offset": kOffMagic,
    "version_offset": kOffVersion,
    "header_bytes_offset": kOffHeaderBytes,
    "item_bytes_offset": kOffItemBytes,
    "slots_offset": kOffSlots,
    "slot_stride_offset": kOffSlotStride,
    "times_offset_offset": kOffTimesOffset,
    "data_offset_offset": kOffDataOffset,
    "file_bytes_offset": kOffFileBytes,
    "ndim_offset": kOffNdim,
    "consumer_pid_offset": kOffConsumerPid,
    "dtype_offset": kOffDtype,
    "shape_offset": kOffShape,
    "head_offset": kOffHead,
    "overflow_offset": kOffOverflow,
    "heartbeat_offset": kOffHeartbeat,
    "producer_pid_offset": kOffProducerPid,
    "high_water_offset": kOffHighWater,
    "tail_offset": kOffTail,
    "stop_offset": kOffStop,
}

# Default for ``release_gil_min_bytes``, as in ring.pyx: a push holds the GIL on entry, and
# re-taking it after a release waits up to a whole switch interval (5 ms) when another Python
# thread is busy, far more than copying a frame (~9 GB/s). Only copies >= 32 MiB release it.
cdef Py_ssize_t NOGIL_MIN_BYTES = 32 * 1024 * 1024


cdef class ShmRing:
    """Fixed slots of one sample plus a float64 time each, shared by a producer process and a
    consumer process. Made by eva.capture.shm_ring.create_shm_ring / attach_shm_ring, which
    validate the file and hand over ``mm`` (``close()`` unmaps it)."""

    cdef CShmRing* ring
    cdef Py_buffer view
    cdef bint has_view
    cdef object mm
    cdef object file_id
    cdef int busy
    cdef int typenum
    cdef readonly tuple shape
    cdef readonly object dtype
    cdef readonly Py_ssize_t item_bytes
    cdef readonly Py_ssize_t block_slots
    cdef readonly Py_ssize_t slot_stride
    cdef readonly bint release_gil
    cdef readonly str path
    cdef readonly bint owner

    def __init__(self, mm, path, shape, dtype, *, bint owner=False, file_id=None,
                 release_gil_min_bytes=None):
        # The work is in __cinit__ (always run, so the view is never left half set up); this
        # gives the class a signature help() and stubtest can read.
        pass

    def __cinit__(self, mm, path, shape, dtype, *, bint owner=False, file_id=None,
                  release_gil_min_bytes=None):
        self.ring = NULL
        self.has_view = False
        self.busy = 0
        self.path = str(path)
        self.owner = owner
        self.file_id = file_id
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.typenum = self.dtype.num
        self.item_bytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        threshold = NOGIL_MIN_BYTES if release_gil_min_bytes is None else release_gil_min_bytes
        self.release_gil = self.item_bytes >= threshold
        PyObject_GetBuffer(mm, &self.view, PyBUF_WRITABLE)
        self.has_view = True
        self.mm = mm
        try:
            self.ring = new CShmRing(self.view.buf, <size_t>self.view.len)
        except ValueError as error:
            raise ValueError(f"{self.path}: {error}") from None
        if <Py_ssize_t>self.ring.item_bytes() != self.item_bytes:
            raise ValueError(
                f"{self.path}: shm ring holds {self.ring.item_bytes()}-byte samples, not "
                f"{self.shape} {self.dtype.str!r} ({self.item_bytes} bytes)")
        self.block_slots = self.ring.slots()
        self.slot_stride = self.ring.slot_stride()

    def __dealloc__(self):
        if self.ring != NULL:
            del self.ring
            self.ring = NULL
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False

    cdef inline CShmRing* _r(self) except NULL:
        if self.ring == NULL:
            raise ValueError(f"shm ring {self.path} is closed")
        return self.ring

    # -- producer --

    def push(self, double t, sample) -> bool:
        """Copy ``sample`` into the next slot; False (and counted) when the ring is full."""
        cdef CShmRing* r = self._r()
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
            self.busy += 1
            try:
                with nogil:
                    ok = r.push(t, src)
            finally:
                self.busy -= 1
        else:
            ok = r.push(t, src)
        return ok

    def heartbeat(self, now_ns=None) -> None:
        """Store a CLOCK_MONOTONIC ns liveness stamp (default: now)."""
        cdef CShmRing* r = self._r()
        if now_ns is None:
            r.heartbeat(monotonic_ns())
            return
        if not 0 <= now_ns < 2**64:
            raise ValueError(f"heartbeat now_ns must be a u64 (>= 0), not {now_ns}")
        r.heartbeat(<uint64_t>now_ns)

    def claim_producer(self, pid) -> None:
        """PRODUCER side: record ``pid`` as the producer's and stamp the heartbeat (what
        :func:`eva.capture.shm_ring.attach_shm_ring` does on attach)."""
        cdef CShmRing* r = self._r()
        r.set_producer_pid(<uint64_t>pid)
        r.heartbeat(monotonic_ns())

    # -- consumer --

    def pop_batch(self, cnp.ndarray out, cnp.ndarray out_times, Py_ssize_t max_n=-1) -> int:
        """Copy up to ``max_n`` oldest samples into ``out[:n]`` / ``out_times[:n]``; return n."""
        cdef CShmRing* r = self._r()
        cdef size_t n
        cdef size_t limit
        cdef void* dst
        cdef double* dst_t
        if not cnp.PyArray_ISCARRAY(out) or cnp.PyArray_TYPE(out) != self.typenum:
            raise ValueError("pop_batch: out must be a writable C-contiguous array of the ring dtype")
        if (not cnp.PyArray_ISCARRAY(out_times) or cnp.PyArray_TYPE(out_times) != cnp.NPY_FLOAT64
                or cnp.PyArray_NDIM(out_times) != 1):
            raise ValueError("pop_batch: out_times must be a writable C-contiguous 1-D float64 array")
        limit = min(<size_t>(cnp.PyArray_NBYTES(out) // self.item_bytes),
                    <size_t>cnp.PyArray_DIM(out_times, 0))
        if max_n >= 0:
            limit = min(<size_t>max_n, limit)
        dst = cnp.PyArray_DATA(out)
        dst_t = <double*>cnp.PyArray_DATA(out_times)
        self.busy += 1
        try:
            with nogil:  # like ring.pyx: the consumer copies batches without the GIL
                n = r.pop(dst, dst_t, limit)
        finally:
            self.busy -= 1
        return n

    def discard(self, Py_ssize_t max_n=-1) -> int:
        """Free up to ``max_n`` (all when negative) samples without reading them."""
        cdef CShmRing* r = self._r()
        cdef size_t limit = <size_t>max_n if max_n >= 0 else <size_t>-1
        return r.discard(limit)

    def peek_time(self):
        """Capture time of the oldest unread sample, or None when empty (consumer side)."""
        cdef CShmRing* r = self._r()
        cdef double t = 0.0
        if r.peek_time(&t):
            return t
        return None

    def request_stop(self) -> None:
        """Ask the producer to finish (it polls ``stop_requested``)."""
        self._r().request_stop()

    def reset_high_water(self) -> None:
        self._r().reset_high_water()

    # -- either side --

    def __len__(self) -> int:
        return self._r().size()

    @property
    def pushed(self) -> int:
        return self._r().pushed()

    @property
    def popped(self) -> int:
        return self._r().popped()

    @property
    def overflow_count(self) -> int:
        return self._r().overflow_count()

    @property
    def high_water(self) -> int:
        return self._r().high_water()

    @property
    def heartbeat_ns(self) -> int:
        return self._r().heartbeat_ns()

    @property
    def producer_pid(self) -> int:
        return self._r().producer_pid()

    @property
    def consumer_pid(self) -> int:
        return self._r().consumer_pid()

    @property
    def stop_requested(self) -> bool:
        return self._r().stop_requested()

    @property
    def capacity(self) -> int:
        return self.block_slots

    @property
    def max_capacity(self) -> int:
        return self.block_slots

    @property
    def allocated_bytes(self) -> int:
        return self.block_slots * self.item_bytes

    @property
    def closed(self) -> bool:
        return self.ring == NULL

    def close(self) -> None:
        """Unmap (idempotent). The file stays until the owner's ``unlink()``."""
        if self.busy:
            raise RuntimeError(f"shm ring {self.path}: close() while a push/pop runs")
        if self.ring != NULL:
            del self.ring
            self.ring = NULL
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False
        mm, self.mm = self.mm, None
        if mm is not None:
            mm.close()

    def unlink(self) -> None:
        """Remove the file if it is still the one this consumer created (idempotent)."""
        if not self.owner:
            raise ValueError(f"shm ring {self.path}: only the consumer that created it unlinks it")
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if self.file_id is None or (st.st_dev, st.st_ino) == tuple(self.file_id):
            os.unlink(self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
