# cython: language_level=3, boundscheck=False, wraparound=False
"""Python's repr of doubles, many at once (native/float_repr.hpp). Reference and checks:
eva/formats/mcap/json_rows.py."""

from libc.stdint cimport int64_t, uint8_t

import numpy as np

cdef extern from "float_repr.hpp" namespace "eva":
    size_t FLOAT_REPR_MAX
    size_t float_repr(const double*, size_t, char*, int64_t*) nogil


def reprs(const double[::1] values not None):
    """(uint8 array of every value's repr back to back, int64 length of each)."""
    cdef Py_ssize_t n = values.shape[0]
    out = np.empty(max(n, 1) * FLOAT_REPR_MAX, np.uint8)
    lengths = np.empty(n, np.int64)
    cdef uint8_t[::1] out_view = out
    cdef int64_t[::1] lengths_view = lengths
    cdef size_t total = 0
    if n:
        with nogil:
            total = float_repr(&values[0], n, <char*>&out_view[0], &lengths_view[0])
    return out[:total], lengths
