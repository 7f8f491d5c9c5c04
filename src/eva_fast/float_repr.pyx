# cython: language_level=3, boundscheck=False, wraparound=False
"""Python's repr of doubles, many at once (native/float_repr.hpp). Reference and checks:
eva/formats/mcap/json_rows.py."""

from libc.stdint cimport int64_t, uint8_t

import numpy as np

cdef extern from "float_repr.hpp" namespace "eva":
    size_t FLOAT_REPR_MAX
    size_t float_repr(const double*, size_t, char*, int64_t*) nogil
    size_t float_objects(const double*, size_t, size_t, const char*, const int64_t*, char*,
                         int64_t*) nogil


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


def objects(const double[:, ::1] values not None, const uint8_t[::1] keys not None,
            const int64_t[::1] key_ends not None):
    """JSON objects of each row (uint8 array back to back, int64 length of each): key j then
    value (i, j), then "}"; NaN and infinity as null. ``key_ends``: one per column."""
    cdef Py_ssize_t rows = values.shape[0]
    cdef Py_ssize_t columns = values.shape[1]
    if key_ends.shape[0] != columns:
        raise ValueError("objects: one key per column")
    if columns and (key_ends[columns - 1] > keys.shape[0] or key_ends[0] < 0):
        raise ValueError("objects: keys shorter than their ends")
    cdef Py_ssize_t j
    for j in range(1, columns):
        if key_ends[j] < key_ends[j - 1]:
            raise ValueError("objects: key ends must not decrease")
    cdef Py_ssize_t key_bytes = key_ends[columns - 1] if columns else 0
    out = np.empty(max(rows * (key_bytes + columns * FLOAT_REPR_MAX + 1), 1), np.uint8)
    lengths = np.empty(rows, np.int64)
    cdef uint8_t[::1] out_view = out
    cdef int64_t[::1] lengths_view = lengths
    cdef size_t total = 0
    cdef const char* key_data = <const char*>&keys[0] if keys.shape[0] else <const char*>NULL
    cdef const int64_t* ends_data = &key_ends[0] if columns else <const int64_t*>NULL
    if rows:
        with nogil:
            total = float_objects(&values[0, 0] if columns else <const double*>NULL, rows,
                                  columns, key_data, ends_data, <char*>&out_view[0],
                                  &lengths_view[0])
    return out[:total], lengths
