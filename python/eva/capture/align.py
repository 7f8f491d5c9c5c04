"""Alignment of captured streams onto the even fps grid (docs/capture.md, "Alignment").

- The grid starts at the latest first sample over all required streams and ends at the earliest
  last sample: ``t_k = start + k / fps`` for every ``t_k <= end``.
- Images take the nearest sample, the earlier one on a tie; a nearest sample farther than the skew
  tolerance (default ``1 / (2 (fps - 1))`` s: ``CollectionConfig.skew_tolerance``) is a skew
  violation.
- Vectors are linearly interpolated between neighbouring samples; discrete dimensions (grippers)
  hold the latest sample at or before the grid instant.

The public functions use the native kernels (``eva_fast.align``, two-pointer merges) when present
and the numpy references below (``np.searchsorted``) otherwise; the two agree bit for bit.
Sample times must be finite and non-decreasing (the recorder checks and reports this).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from eva._native import load

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def grid_length(start: float, end: float, fps: float) -> int:
    """Number of grid instants ``start + k / fps`` that are ``<= end``."""
    if end < start:
        return 0
    n = int(np.floor((end - start) * fps)) + 1
    # Guard the floor against rounding: keep exactly the instants that are <= end.
    while n > 0 and start + (n - 1) / fps > end:
        n -= 1
    while start + n / fps <= end:
        n += 1
    return n


def grid_times(start: float, fps: float, first: int, count: int) -> F64:
    """Grid instants ``start + k / fps`` for ``k`` in ``[first, first + count)``."""
    return start + np.arange(first, first + count, dtype=np.float64) / fps


def _check_grid(grid: F64, what: str) -> F64:
    grid = np.ascontiguousarray(grid, dtype=np.float64)
    if grid.ndim != 1 or (grid.size and np.any(np.diff(grid) < 0)):
        raise ValueError(f"{what}: the grid must be a non-decreasing 1-D array")
    return grid


def _check_times(times: F64, what: str) -> F64:
    times = np.ascontiguousarray(times, dtype=np.float64)
    if times.ndim != 1:
        raise ValueError(f"{what}: timestamps must be 1-D")
    if times.size and (not np.all(np.isfinite(times)) or np.any(np.diff(times) < 0)):
        raise ValueError(f"{what}: timestamps must be finite and non-decreasing")
    return times


# ---- numpy references ----


def nearest_reference(times: F64, grid: F64, tolerance: float) -> tuple[I64, npt.NDArray[np.bool_]]:
    j = np.searchsorted(times, grid, side="right").astype(np.int64) - 1  # last sample <= g
    last = times.size - 1
    inner = (j >= 0) & (j < last)
    jc = np.clip(j, 0, last)
    jn = np.clip(j + 1, 0, last)
    before = grid - times[jc]
    after = times[jn] - grid
    pick = np.where(inner & (before > after), jn, jc)
    pick = np.where(j < 0, 0, pick)
    skew = np.abs(times[pick] - grid) > tolerance
    return pick.astype(np.int64), skew


def hold_reference(times: F64, grid: F64) -> I64:
    return np.searchsorted(times, grid, side="right").astype(np.int64) - 1


def interp_reference(times: F64, values: F64, grid: F64) -> F64:
    last = times.size - 1
    j = np.searchsorted(times, grid, side="right").astype(np.int64) - 1
    edge = (j < 0) | (j >= last)
    j0 = np.clip(j, 0, max(last - 1, 0))
    j1 = np.minimum(j0 + 1, last)
    t0 = times[j0]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (grid - t0) / (times[j1] - t0)
        v0 = values[j0]
        out = v0 + (values[j1] - v0) * w[:, None]
    held = np.where(j < 0, 0, last)
    out[edge] = values[held[edge]]
    return out


# ---- public entry points (native when available) ----


def nearest_indices(
    times: F64, grid: F64, tolerance: float, *, native: bool | None = None
) -> tuple[I64, npt.NDArray[np.bool_]]:
    """Index of the nearest sample per grid instant (earlier on a tie) and the skew mask."""
    times = _check_times(times, "nearest")
    grid = _check_grid(grid, "nearest")
    if times.size == 0:
        raise ValueError("nearest: the stream has no samples")
    mod = load("align") if native is not False else None
    if mod is None:
        return nearest_reference(times, grid, tolerance)
    idx = np.empty(grid.size, dtype=np.int64)
    skew = np.empty(grid.size, dtype=np.uint8)
    mod.nearest(times, grid, float(tolerance), idx, skew)
    return idx, skew.view(np.bool_)


def hold_indices(times: F64, grid: F64, *, native: bool | None = None) -> I64:
    """Index of the latest sample at or before each grid instant, -1 when there is none."""
    times = _check_times(times, "hold")
    grid = _check_grid(grid, "hold")
    mod = load("align") if native is not False else None
    if mod is None:
        return hold_reference(times, grid)
    idx = np.empty(grid.size, dtype=np.int64)
    mod.hold(times, grid, idx)
    return idx


def interpolate(times: F64, values: F64, grid: F64, *, native: bool | None = None) -> F64:
    """Values linearly interpolated at each grid instant; the end samples are held outside."""
    times = _check_times(times, "interp")
    values = np.ascontiguousarray(values, dtype=np.float64)
    grid = _check_grid(grid, "interp")
    if times.size == 0:
        raise ValueError("interp: the stream has no samples")
    if values.ndim != 2 or values.shape[0] != times.size:
        raise ValueError("interp: values must be (n_samples, dim)")
    mod = load("align") if native is not False else None
    if mod is None:
        return interp_reference(times, values, grid)
    out = np.empty((grid.size, values.shape[1]), dtype=np.float64)
    mod.interp(times, values, grid, out)
    return out


def align_vector(
    times: F64,
    values: F64,
    grid: F64,
    discrete_dims: Sequence[int] = (),
    *,
    native: bool | None = None,
) -> F64:
    """A vector stream on the grid: interpolated, with ``discrete_dims`` held (zero-order)."""
    out = interpolate(times, values, grid, native=native)
    if discrete_dims:
        held = hold_indices(times, grid, native=native)
        rows = np.maximum(held, 0)  # before the first sample: the first sample
        dims = np.asarray(discrete_dims, dtype=np.int64)
        out[:, dims] = np.asarray(values, dtype=np.float64)[rows][:, dims]
    return out
