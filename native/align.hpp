// Alignment of sampled streams onto the fps grid (docs/capture.md, "Alignment").
//
// All inputs are sorted (non-decreasing) timestamp arrays; every function is one two-pointer
// merge over samples and grid instants, O(n + m). The numpy reference is eva/capture/align.py
// (np.searchsorted); both use the same floating-point operations in the same order so that they
// agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eva {

// For each grid instant: the nearest sample (the earlier one on a tie) and whether it lies
// farther than `tolerance` seconds away (a skew violation). n_samples must be > 0.
void align_nearest(const double* times, std::size_t n_samples, const double* grid,
                   std::size_t n_grid, double tolerance, std::int64_t* out_index,
                   std::uint8_t* out_skew);

// For each grid instant: the latest sample at or before it, or -1 when there is none.
void align_hold(const double* times, std::size_t n_samples, const double* grid,
                std::size_t n_grid, std::int64_t* out_index);

// Linear interpolation of `values` (n_samples x dim, row-major) at every grid instant into
// `out` (n_grid x dim). Outside the sampled span the first / last sample is held.
void align_interp(const double* times, std::size_t n_samples, const double* values,
                  std::size_t dim, const double* grid, std::size_t n_grid, double* out);

}  // namespace eva
