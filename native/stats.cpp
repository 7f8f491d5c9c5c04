#include "stats.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace eva::stats {

namespace {

// Four pixels (12 bytes) per step, each byte position counted into its own uint32 table: a run of
// equal values (flat image regions are common) would otherwise make every increment wait for the
// previous store to the same counter (store-to-load forwarding stall). Byte j of a 12-byte group is
// channel j % 3. 12 tables x 1 KiB stay in L1. uint32 tables are flushed into the uint64 histogram
// at least every kChunkPixels pixels, long before any table counter can overflow.
constexpr std::size_t kPixelsPerStep = 4;
constexpr std::size_t kTables = kPixelsPerStep * kChannels;
constexpr std::size_t kChunkPixels = std::size_t{1} << 30;  // <= 2^28 counts per table per chunk

void histogram_chunk(const std::uint8_t* p, std::size_t n_pixels, std::uint64_t* hist) noexcept {
  alignas(64) std::uint32_t tables[kTables][kBins];
  std::memset(tables, 0, sizeof(tables));
  const std::size_t steps = n_pixels / kPixelsPerStep;
  for (std::size_t i = 0; i < steps; ++i, p += kTables) {
    ++tables[0][p[0]];
    ++tables[1][p[1]];
    ++tables[2][p[2]];
    ++tables[3][p[3]];
    ++tables[4][p[4]];
    ++tables[5][p[5]];
    ++tables[6][p[6]];
    ++tables[7][p[7]];
    ++tables[8][p[8]];
    ++tables[9][p[9]];
    ++tables[10][p[10]];
    ++tables[11][p[11]];
  }
  for (std::size_t i = steps * kPixelsPerStep; i < n_pixels; ++i, p += kChannels) {
    ++tables[0][p[0]];
    ++tables[1][p[1]];
    ++tables[2][p[2]];
  }
  for (std::size_t channel = 0; channel < kChannels; ++channel) {
    std::uint64_t* out = hist + channel * kBins;
    for (std::size_t value = 0; value < kBins; ++value) {
      std::uint64_t total = 0;
      for (std::size_t table = channel; table < kTables; table += kChannels) {
        total += tables[table][value];
      }
      out[value] += total;
    }
  }
}

}  // namespace

void accumulate_rgb_histogram(const std::uint8_t* pixels, std::size_t n_pixels,
                              std::uint64_t* hist) noexcept {
  while (n_pixels > 0) {
    const std::size_t chunk = std::min(n_pixels, kChunkPixels);
    histogram_chunk(pixels, chunk, hist);
    pixels += chunk * kChannels;
    n_pixels -= chunk;
  }
}

void ImageAccumulator::update(const std::uint8_t* pixels, std::size_t n_pixels,
                              std::size_t n_frames) noexcept {
  accumulate_rgb_histogram(pixels, n_pixels, hist_);
  pixels_ += n_pixels;
  frames_ += n_frames;
}

VectorAccumulator::VectorAccumulator(std::size_t dim)
    : dim_(dim),
      min_(dim, std::numeric_limits<double>::infinity()),
      max_(dim, -std::numeric_limits<double>::infinity()),
      mean_(dim, 0.0),
      m2_(dim, 0.0),
      batch_sum_(dim),
      batch_min_(dim),
      batch_max_(dim),
      batch_m2_(dim) {}

namespace {
// NaN-propagating min/max (numpy semantics): once a NaN is seen the result stays NaN.
inline double nan_min(double current, double x) noexcept {
  return (current != current || x >= current) ? current : x;
}
inline double nan_max(double current, double x) noexcept {
  return (current != current || x <= current) ? current : x;
}
}  // namespace

template <typename T>
void VectorAccumulator::update(const T* rows, std::size_t n) noexcept {
  if (n == 0) return;
  const std::size_t dim = dim_;
  double* sum = batch_sum_.data();
  double* bmin = batch_min_.data();
  double* bmax = batch_max_.data();
  double* bm2 = batch_m2_.data();
  for (std::size_t d = 0; d < dim; ++d) {
    const double x = static_cast<double>(rows[d]);
    sum[d] = 0.0;
    bmin[d] = x;
    bmax[d] = x;
    bm2[d] = 0.0;
  }
  // Pass 1: sums, min, max (row-major, the inner loop over dims vectorises).
  for (std::size_t r = 0; r < n; ++r) {
    const T* row = rows + r * dim;
    for (std::size_t d = 0; d < dim; ++d) {
      const double x = static_cast<double>(row[d]);
      sum[d] += x;
      bmin[d] = nan_min(bmin[d], x);
      bmax[d] = nan_max(bmax[d], x);
    }
  }
  const double inv_n = 1.0 / static_cast<double>(n);
  for (std::size_t d = 0; d < dim; ++d) sum[d] *= inv_n;  // now the batch mean
  // Pass 2: squared deviations from the batch mean.
  for (std::size_t r = 0; r < n; ++r) {
    const T* row = rows + r * dim;
    for (std::size_t d = 0; d < dim; ++d) {
      const double dev = static_cast<double>(row[d]) - sum[d];
      bm2[d] += dev * dev;
    }
  }
  // Chan's parallel combination of (count_, mean_, m2_) with the batch (n, sum, bm2).
  const double n_a = static_cast<double>(count_);
  const double n_b = static_cast<double>(n);
  const double total = n_a + n_b;
  for (std::size_t d = 0; d < dim; ++d) {
    const double delta = sum[d] - mean_[d];
    mean_[d] += delta * (n_b / total);
    m2_[d] += bm2[d] + delta * delta * (n_a * n_b / total);
    min_[d] = nan_min(min_[d], bmin[d]);
    max_[d] = nan_max(max_[d], bmax[d]);
  }
  count_ += n;
}

void VectorAccumulator::update_f64(const double* rows, std::size_t n) noexcept { update(rows, n); }
void VectorAccumulator::update_f32(const float* rows, std::size_t n) noexcept { update(rows, n); }

}  // namespace eva::stats
