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

}  // namespace rgb
}  // namespace eva
