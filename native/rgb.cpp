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

void yuv420p_to_rgb24(const std::uint8_t* y_plane, std::ptrdiff_t y_stride,
                      const std::uint8_t* u_plane, std::ptrdiff_t u_stride,
                      const std::uint8_t* v_plane, std::ptrdiff_t v_stride, std::size_t width,
                      std::size_t height, const std::uint8_t* lut_r, const std::uint8_t* lut_b,
                      const std::uint8_t* g_rows, std::size_t g_row_count,
                      const std::uint16_t* g_index, std::uint8_t* dst) {
  if (g_row_count == 0) return;
  const unsigned last_row = static_cast<unsigned>(g_row_count - 1);
  for (std::size_t row = 0; row < height; ++row) {
    const std::uint8_t* y_row = y_plane + static_cast<std::ptrdiff_t>(row) * y_stride;
    const std::uint8_t* u_row = u_plane + static_cast<std::ptrdiff_t>(row >> 1) * u_stride;
    const std::uint8_t* v_row = v_plane + static_cast<std::ptrdiff_t>(row >> 1) * v_stride;
    std::uint8_t* out = dst + row * width * 3;
    // Two pixels share one chroma sample: look the three table rows up once per pair (the last
    // pixel of an odd width has a sample of its own).
    for (std::size_t x = 0; x < width; x += 2) {
      const unsigned u = u_row[x >> 1];
      const unsigned v = v_row[x >> 1];
      const std::uint8_t* r_tab = lut_r + v * 256u;
      const std::uint8_t* b_tab = lut_b + u * 256u;
      unsigned g_row = g_index[u * 256u + v];
      if (g_row > last_row) g_row = last_row;
      const std::uint8_t* g_tab = g_rows + static_cast<std::size_t>(g_row) * 256u;
      const unsigned y0 = y_row[x];
      out[0] = r_tab[y0];
      out[1] = g_tab[y0];
      out[2] = b_tab[y0];
      if (x + 1 < width) {
        const unsigned y1 = y_row[x + 1];
        out[3] = r_tab[y1];
        out[4] = g_tab[y1];
        out[5] = b_tab[y1];
      }
      out += 6;
    }
  }
}

}  // namespace rgb
}  // namespace eva
