# cython: language_level=3, boundscheck=False, wraparound=False
"""Native MessagePack ndarray maps (docs/formats.md, "MessagePack"): encode into a caller buffer, parse zero-copy.

The bytes equal ``msgpack.packb({"__ndarray__": True, "data": <bytes>, "dtype": a.dtype.str,
"shape": list(a.shape)})``; the reference lives in ``eva.dataset.msgpack_codec``.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef extern from "msgpack_image.hpp" namespace "eva::msgpack_image":
    int kMaxDims
    cdef cppclass Parsed:
        uint64_t data_offset
        uint64_t data_len
        uint64_t dtype_offset
        uint64_t dtype_len
        int ndim
        int64_t shape[32]
        uint64_t end
    size_t encoded_size(size_t dtype_len, const int64_t* shape, int ndim, uint64_t nbytes) nogil
    size_t c_encode "eva::msgpack_image::encode"(
        uint8_t* out, const char* dtype, size_t dtype_len, const int64_t* shape, int ndim,
        const uint8_t* data, uint64_t nbytes) nogil
    bint c_parse "eva::msgpack_image::parse"(const uint8_t* buf, size_t len, Parsed* out) nogil

# Below this size the GIL round trip costs more than the copy it would free up.
cdef uint64_t NOGIL_MIN_BYTES = 65536
# msgpack bin32 carries at most 2**32 - 1 bytes.
cdef uint64_t MAX_BIN = 0xFFFFFFFF


cdef cnp.ndarray _checked(object array):
    if not isinstance(array, cnp.ndarray):
        raise TypeError(f"expected a numpy ndarray, got {type(array).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>array
    if arr.dtype.hasobject or arr.dtype.names is not None:
        raise TypeError(f"dtype {arr.dtype} has no raw-bytes form for an ndarray map")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        arr = np.ascontiguousarray(arr)
    if cnp.PyArray_NDIM(arr) > kMaxDims:
        raise ValueError(f"ndarray with {cnp.PyArray_NDIM(arr)} dims (max {kMaxDims})")
    if <uint64_t>cnp.PyArray_NBYTES(arr) > MAX_BIN:
        raise ValueError(f"ndarray of {cnp.PyArray_NBYTES(arr)} bytes exceeds msgpack bin32")
    return arr


cdef inline void _shape(cnp.ndarray arr, int64_t* shape):
    cdef int i
    for i in range(cnp.PyArray_NDIM(arr)):
        shape[i] = cnp.PyArray_DIMS(arr)[i]


cdef size_t _size(cnp.ndarray arr, bytes dtype):
    cdef int64_t shape[32]
    _shape(arr, shape)
    return encoded_size(len(dtype), shape, cnp.PyArray_NDIM(arr), cnp.PyArray_NBYTES(arr))


def size(object array) -> int:
    """Encoded size in bytes of ``array``'s ndarray map."""
    cdef cnp.ndarray arr = _checked(array)
    return _size(arr, arr.dtype.str.encode("ascii"))


cdef size_t _encode_to(cnp.ndarray arr, bytes dtype, uint8_t* out):
    cdef int64_t shape[32]
    _shape(arr, shape)
    cdef const char* dt = PyBytes_AS_STRING(dtype)
    cdef size_t dt_len = len(dtype)
    cdef int ndim = cnp.PyArray_NDIM(arr)
    cdef const uint8_t* data = <const uint8_t*>cnp.PyArray_DATA(arr)
    cdef uint64_t nbytes = cnp.PyArray_NBYTES(arr)
    cdef size_t written
    if nbytes >= NOGIL_MIN_BYTES:
        with nogil:
            written = c_encode(out, dt, dt_len, shape, ndim, data, nbytes)
    else:
        written = c_encode(out, dt, dt_len, shape, ndim, data, nbytes)
    return written


def encode(object array) -> bytes:
    """The ndarray map as a new ``bytes``: one allocation, one copy of the data."""
    cdef cnp.ndarray arr = _checked(array)
    cdef bytes dtype = arr.dtype.str.encode("ascii")
    cdef size_t n = _size(arr, dtype)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
    _encode_to(arr, dtype, <uint8_t*>PyBytes_AS_STRING(out))
    return out


def encode_into(object array, uint8_t[::1] out, Py_ssize_t offset=0) -> int:
    """Write the ndarray map into the writable buffer ``out`` at ``offset``; return its length.

    This is the hot path: with a reused buffer there is no allocation, and the data is copied
    once with the GIL released.
    """
    cdef cnp.ndarray arr = _checked(array)
    cdef bytes dtype = arr.dtype.str.encode("ascii")
    cdef size_t n = _size(arr, dtype)
    if offset < 0 or <size_t>offset > <size_t>out.shape[0] or n > <size_t>(out.shape[0] - offset):
        raise ValueError(
            f"buffer of {out.shape[0]} bytes cannot hold {n} bytes at offset {offset}"
        )
    return _encode_to(arr, dtype, &out[offset] if out.shape[0] > offset else &out[0])


def parse(const uint8_t[::1] buf):
    """Locate the parts of a strict ndarray map: (data_offset, data_len, dtype, shape, end).

    Returns None when ``buf`` does not start with the four-key ndarray map (the caller then uses
    a general MessagePack decoder).
    """
    cdef Parsed parsed
    cdef bint ok
    if buf.shape[0] == 0:
        return None
    with nogil:
        ok = c_parse(&buf[0], buf.shape[0], &parsed)
    if not ok:
        return None
    dtype = bytes(buf[parsed.dtype_offset:parsed.dtype_offset + parsed.dtype_len]).decode("ascii")
    shape = tuple(parsed.shape[i] for i in range(parsed.ndim))
    return parsed.data_offset, parsed.data_len, dtype, shape, parsed.end
