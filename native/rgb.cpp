#include "rgb.hpp"

#include <cstring>

namespace eva {
namespace rgb {

void copy_rows(const std::uint8_t* src, std::ptrdiff_t src_stride, std::size_t height,
               std::size_t row_bytes, std::uint8_t* dst) {
  if (src_stride == static_cast<std::ptrdiff_t>(row_bytes)) {
    std::memcpy(dst, src, height * row_bytes);
    return;
  }
  for (std::size_t r = 0; r < height; ++r) {
    std::memcpy(dst + r * row_bytes, src + static_cast<std::ptrdiff_t>(r) * src_stride, row_bytes);
  }
}

}  // namespace rgb
}  // namespace eva
