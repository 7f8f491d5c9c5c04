// MessagePack ndarray maps (docs/formats.md, "MessagePack") written straight into a caller's buffer.
//
// The map is {"__ndarray__": true, "data": <bin>, "dtype": <str>, "shape": [..]} with the keys in
// exactly that order, so the bytes equal msgpack.packb() of the same Python dict. The encoded form
// is: prefix (map header .. bin header) | raw C-order bytes | suffix ("dtype", "shape" entries).
// Splitting it that way lets the caller size a buffer once and copy the pixels exactly once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eva::msgpack_image {

constexpr int kMaxDims = 32;

// Bytes before the raw data: fixmap, "__ndarray__", true, "data", bin header.
size_t prefix_size(uint64_t nbytes);
// Bytes after the raw data: "dtype" + its str, "shape" + the int array.
size_t suffix_size(size_t dtype_len, const int64_t* shape, int ndim);
// prefix + nbytes + suffix.
size_t encoded_size(size_t dtype_len, const int64_t* shape, int ndim, uint64_t nbytes);

// Write the whole map at `out` (which must hold encoded_size(...) bytes); returns bytes written.
// Safe to call without the GIL: it touches only the given memory.
size_t encode(uint8_t* out, const char* dtype, size_t dtype_len, const int64_t* shape, int ndim,
              const uint8_t* data, uint64_t nbytes);

// Where the parts of an encoded ndarray map sit inside a buffer.
struct Parsed {
  uint64_t data_offset = 0;
  uint64_t data_len = 0;
  uint64_t dtype_offset = 0;
  uint64_t dtype_len = 0;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  uint64_t end = 0;  // offset just past the map
};

// Parse an ndarray map (the four keys in any order, keys as str or bin, nothing else).
// Returns true on success; false means "not this strict form" and the caller falls back to a
// general MessagePack decoder.
bool parse(const uint8_t* buf, size_t len, Parsed* out);

}  // namespace eva::msgpack_image
