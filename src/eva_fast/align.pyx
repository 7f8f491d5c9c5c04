# cython: language_level=3, boundscheck=False, wraparound=False
"""fps-grid alignment kernels (native/align.hpp). Reference and checks: eva/capture/align.py."""

from libc.stdint cimport int64_t, uint8_t

cdef extern from "align.hpp" namespace "eva":
    void align_nearest(const double*, size_t, const double*, size_t, double, int64_t*,
                       uint8_t*) nogil
    void align_hold(const double*, size_t, const double*, size_t, int64_t*) nogil
    void align_interp(const double*, size_t, const double*, size_t, const double*, size_t,
                      double*) nogil


def nearest(const double[::1] times, const double[::1] grid, double tolerance,
            int64_t[::1] out_index, uint8_t[::1] out_skew) -> None:
    """Nearest sample per grid instant (earlier on a tie) and skew flags; times non-empty."""
    if times.shape[0] == 0:
        raise ValueError("nearest: no samples")
    if out_index.shape[0] < grid.shape[0] or out_skew.shape[0] < grid.shape[0]:
        raise ValueError("nearest: output arrays shorter than the grid")
    if grid.shape[0] == 0:
        return
    with nogil:
        align_nearest(&times[0], times.shape[0], &grid[0], grid.shape[0], tolerance,
                      &out_index[0], &out_skew[0])


def hold(const double[::1] times, const double[::1] grid, int64_t[::1] out_index) -> None:
    """Latest sample at or before each grid instant (-1 when none)."""
    if out_index.shape[0] < grid.shape[0]:
        raise ValueError("hold: output array shorter than the grid")
    if grid.shape[0] == 0:
        return
    if times.shape[0] == 0:
        out_index[:grid.shape[0]] = -1
        return
    with nogil:
        align_hold(&times[0], times.shape[0], &grid[0], grid.shape[0], &out_index[0])


def interp(const double[::1] times, const double[:, ::1] values, const double[::1] grid,
           double[:, ::1] out) -> None:
    """Linear interpolation of ``values`` (n, dim) at each grid instant into ``out`` (m, dim)."""
    if times.shape[0] == 0:
        raise ValueError("interp: no samples")
    if values.shape[0] != times.shape[0]:
        raise ValueError("interp: values and times differ in length")
    if out.shape[0] < grid.shape[0] or out.shape[1] != values.shape[1]:
        raise ValueError("interp: output array has the wrong shape")
    if grid.shape[0] == 0 or values.shape[1] == 0:
        return
    with nogil:
        align_interp(&times[0], times.shape[0], &values[0, 0], values.shape[1], &grid[0],
                     grid.shape[0], &out[0, 0])
