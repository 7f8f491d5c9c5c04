// a*b+c must stay two roundings (no FMA contraction) so results match numpy exactly:
// CMakeLists.txt compiles every kernel with -ffp-contract=off.
#include "align.hpp"

namespace eva {

namespace {
// Advance j to the last sample with times[j] <= g (j == -1 when none). Grid is non-decreasing,
// so j only moves forward over the whole merge.
inline std::int64_t advance(const double* times, std::size_t n, double g, std::int64_t j) {
  while (static_cast<std::size_t>(j + 1) < n && times[j + 1] <= g) ++j;
  return j;
}
}  // namespace

void align_nearest(const double* times, std::size_t n_samples, const double* grid,
                   std::size_t n_grid, double tolerance, std::int64_t* out_index,
                   std::uint8_t* out_skew) {
  const std::int64_t last = static_cast<std::int64_t>(n_samples) - 1;
  std::int64_t j = -1;
  for (std::size_t i = 0; i < n_grid; ++i) {
    const double g = grid[i];
    j = advance(times, n_samples, g, j);
    std::int64_t pick;
    if (j < 0) {
      pick = 0;
    } else if (j == last) {
      pick = last;
    } else {
      const double before = g - times[j];
      const double after = times[j + 1] - g;
      pick = before <= after ? j : j + 1;  // earlier sample on a tie
    }
    out_index[i] = pick;
    double skew = times[pick] - g;
    if (skew < 0) skew = -skew;
    out_skew[i] = skew > tolerance ? 1 : 0;
  }
}

void align_hold(const double* times, std::size_t n_samples, const double* grid,
                std::size_t n_grid, std::int64_t* out_index) {
  std::int64_t j = -1;
  for (std::size_t i = 0; i < n_grid; ++i) {
    j = advance(times, n_samples, grid[i], j);
    out_index[i] = j;
  }
}

void align_interp(const double* times, std::size_t n_samples, const double* values,
                  std::size_t dim, const double* grid, std::size_t n_grid, double* out) {
  const std::int64_t last = static_cast<std::int64_t>(n_samples) - 1;
  std::int64_t j = -1;
  for (std::size_t i = 0; i < n_grid; ++i) {
    const double g = grid[i];
    j = advance(times, n_samples, g, j);
    double* row = out + i * dim;
    if (j < 0 || j == last) {
      const double* src = values + static_cast<std::size_t>(j < 0 ? 0 : last) * dim;
      for (std::size_t d = 0; d < dim; ++d) row[d] = src[d];
      continue;
    }
    const double t0 = times[j];
    const double w = (g - t0) / (times[j + 1] - t0);
    const double* v0 = values + static_cast<std::size_t>(j) * dim;
    const double* v1 = v0 + dim;
    for (std::size_t d = 0; d < dim; ++d) row[d] = v0[d] + (v1[d] - v0[d]) * w;
  }
}

}  // namespace eva
