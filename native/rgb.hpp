// Decoded video frames -> RGB in a reused batch buffer (every exporter and reader that decodes,
// and the camera source workers).
//
// A batch is a preallocated (n, H, W, 3) buffer; the HDF5 exporter's frames [c*fpc, (c+1)*fpc)
// form its chunk c, written with one direct chunk write. These loops fill that buffer without
// allocating and are called with the GIL released.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eva {
namespace rgb {

// Copy `height` rows of `row_bytes` bytes from a strided source (row stride `src_stride`, e.g. a
// decoder plane with line padding) into the contiguous destination `dst`.
void copy_rows(const std::uint8_t* src, std::ptrdiff_t src_stride, std::size_t height,
               std::size_t row_bytes, std::uint8_t* dst);

// yuv420p -> packed rgb24 through lookup tables calibrated from the reference converter, so the
// result equals it bit for bit (chroma is nearest-neighbour: pixel (x, y) uses sample (x/2, y/2)).
//   red   = lut_r[v * 256 + y]
//   blue  = lut_b[u * 256 + y]
//   green = g_rows[g_index[u * 256 + v] * 256 + y]   (g_index values are clamped to g_row_count-1)
// Green depends on all three samples, but only a few hundred distinct 256-entry rows occur, so the
// tables stay cache-resident (~340 KB) instead of a 16 MB cube.
// `dst` receives height * width * 3 bytes, row-major, no padding.
void yuv420p_to_rgb24(const std::uint8_t* y_plane, std::ptrdiff_t y_stride,
                      const std::uint8_t* u_plane, std::ptrdiff_t u_stride,
                      const std::uint8_t* v_plane, std::ptrdiff_t v_stride, std::size_t width,
                      std::size_t height, const std::uint8_t* lut_r, const std::uint8_t* lut_b,
                      const std::uint8_t* g_rows, std::size_t g_row_count,
                      const std::uint16_t* g_index, std::uint8_t* dst);

}  // namespace rgb
}  // namespace eva
