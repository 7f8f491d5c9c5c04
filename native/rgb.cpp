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

namespace {

// One pixel through the three table rows of its chroma sample.
inline void put_pixel(std::uint8_t* out, unsigned y, const std::uint8_t* r_tab,
                      const std::uint8_t* g_tab, const std::uint8_t* b_tab) {
  out[0] = r_tab[y];
  out[1] = g_tab[y];
  out[2] = b_tab[y];
}

}  // namespace

void yuv420p_to_rgb24(const std::uint8_t* y_plane, std::ptrdiff_t y_stride,
                      const std::uint8_t* u_plane, std::ptrdiff_t u_stride,
                      const std::uint8_t* v_plane, std::ptrdiff_t v_stride, std::size_t width,
                      std::size_t height, const std::uint8_t* lut_r, const std::uint8_t* lut_b,
                      const std::uint8_t* g_rows, std::size_t g_row_count,
                      const std::uint16_t* g_index, std::uint8_t* dst) {
  if (g_row_count == 0) return;
  const unsigned last_row = static_cast<unsigned>(g_row_count - 1);
  const std::size_t out_stride = width * 3;
  // Rows in pairs: the four pixels of a 2x2 block share one chroma sample, so its three table
  // rows are looked up once per block (the g_index lookup is the one that misses the L1 cache).
  // An odd last row, or an odd last column, has samples of its own.
  for (std::size_t row = 0; row < height; row += 2) {
    const bool pair = row + 1 < height;
    const std::uint8_t* y_top = y_plane + static_cast<std::ptrdiff_t>(row) * y_stride;
    const std::uint8_t* y_bottom = pair ? y_top + y_stride : y_top;
    const std::uint8_t* u_row = u_plane + static_cast<std::ptrdiff_t>(row >> 1) * u_stride;
    const std::uint8_t* v_row = v_plane + static_cast<std::ptrdiff_t>(row >> 1) * v_stride;
    std::uint8_t* top = dst + row * out_stride;
    std::uint8_t* bottom = top + out_stride;
    for (std::size_t x = 0; x < width; x += 2) {
      const unsigned u = u_row[x >> 1];
      const unsigned v = v_row[x >> 1];
      const std::uint8_t* r_tab = lut_r + v * 256u;
      const std::uint8_t* b_tab = lut_b + u * 256u;
      unsigned g_row = g_index[u * 256u + v];
      if (g_row > last_row) g_row = last_row;
      const std::uint8_t* g_tab = g_rows + static_cast<std::size_t>(g_row) * 256u;
      const bool two = x + 1 < width;
      put_pixel(top + x * 3, y_top[x], r_tab, g_tab, b_tab);
      if (two) put_pixel(top + x * 3 + 3, y_top[x + 1], r_tab, g_tab, b_tab);
      if (pair) {
        put_pixel(bottom + x * 3, y_bottom[x], r_tab, g_tab, b_tab);
        if (two) put_pixel(bottom + x * 3 + 3, y_bottom[x + 1], r_tab, g_tab, b_tab);
      }
    }
  }
}

}  // namespace rgb
}  // namespace eva
