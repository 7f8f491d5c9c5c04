// Per-episode feature statistics: the hot loops behind eva.dataset.stats.
//
// Images: the only state is an exact per-channel 256-bin histogram (uint64). Sum, sum of squares,
// min, max and every quantile of a uint8 channel follow exactly from it, so one histogram pass is
// the whole per-pixel cost; the O(256) finalisation happens in Python (eva.dataset.stats).
//
// Vectors: running per-dimension count, min, max, mean and M2 (sum of squared deviations) in
// float64. Each batch is reduced two-pass (mean, then squared deviations from it) and folded into
// the running state with Chan et al.'s parallel update, which keeps std accurate for signals with a
// large offset (no E[x^2] - E[x]^2 cancellation). NaN propagates into min/max/mean/std, like numpy.
//
// Accumulators are not synchronised: one instance must be fed from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace eva::stats {

constexpr std::size_t kChannels = 3;
constexpr std::size_t kBins = 256;

// Adds the per-channel value counts of n_pixels interleaved 3-channel uint8 pixels to
// hist[channel * 256 + value].
void accumulate_rgb_histogram(const std::uint8_t* pixels, std::size_t n_pixels,
                              std::uint64_t* hist) noexcept;

class ImageAccumulator {
 public:
  // pixels: n_frames frames of interleaved RGB, n_pixels pixels in total (3 * n_pixels bytes).
  void update(const std::uint8_t* pixels, std::size_t n_pixels, std::size_t n_frames) noexcept;
  const std::uint64_t* histogram() const noexcept { return hist_; }
  std::uint64_t frame_count() const noexcept { return frames_; }
  std::uint64_t pixel_count() const noexcept { return pixels_; }

 private:
  std::uint64_t hist_[kChannels * kBins] = {};
  std::uint64_t frames_ = 0;
  std::uint64_t pixels_ = 0;
};

class VectorAccumulator {
 public:
  explicit VectorAccumulator(std::size_t dim);
  // rows: n C-contiguous rows of dim values.
  void update_f64(const double* rows, std::size_t n) noexcept;
  void update_f32(const float* rows, std::size_t n) noexcept;

  std::size_t dim() const noexcept { return dim_; }
  std::uint64_t count() const noexcept { return count_; }
  const double* min() const noexcept { return min_.data(); }
  const double* max() const noexcept { return max_.data(); }
  const double* mean() const noexcept { return mean_.data(); }
  const double* m2() const noexcept { return m2_.data(); }

 private:
  template <typename T>
  void update(const T* rows, std::size_t n) noexcept;

  std::size_t dim_;
  std::uint64_t count_ = 0;
  std::vector<double> min_, max_, mean_, m2_;
  // Per-batch scratch, allocated once.
  std::vector<double> batch_sum_, batch_min_, batch_max_, batch_m2_;
};

}  // namespace eva::stats
