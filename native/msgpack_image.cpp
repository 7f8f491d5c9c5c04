#include "msgpack_image.hpp"

#include <cstring>

namespace eva::msgpack_image {
namespace {

constexpr char kKeyNdarray[] = "__ndarray__";
constexpr char kKeyData[] = "data";
constexpr char kKeyDtype[] = "dtype";
constexpr char kKeyShape[] = "shape";

inline uint8_t* put_be16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
  return p + 2;
}
inline uint8_t* put_be32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  return p + 4;
}
inline uint8_t* put_be64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
  return p + 8;
}
inline uint64_t get_be(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// msgpack-python packs str with the smallest of fixstr / str8 / str16 / str32 (use_bin_type=True).
size_t str_header_size(size_t n) { return n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5; }
uint8_t* put_str_header(uint8_t* p, size_t n) {
  if (n < 32) {
    *p++ = static_cast<uint8_t>(0xa0 | n);
  } else if (n < 256) {
    *p++ = 0xd9;
    *p++ = static_cast<uint8_t>(n);
  } else if (n < 65536) {
    *p++ = 0xda;
    p = put_be16(p, static_cast<uint16_t>(n));
  } else {
    *p++ = 0xdb;
    p = put_be32(p, static_cast<uint32_t>(n));
  }
  return p;
}
uint8_t* put_str(uint8_t* p, const char* s, size_t n) {
  p = put_str_header(p, n);
  std::memcpy(p, s, n);
  return p + n;
}

size_t bin_header_size(uint64_t n) { return n < 256 ? 2 : n < 65536 ? 3 : 5; }
uint8_t* put_bin_header(uint8_t* p, uint64_t n) {
  if (n < 256) {
    *p++ = 0xc4;
    *p++ = static_cast<uint8_t>(n);
  } else if (n < 65536) {
    *p++ = 0xc5;
    p = put_be16(p, static_cast<uint16_t>(n));
  } else {
    *p++ = 0xc6;
    p = put_be32(p, static_cast<uint32_t>(n));
  }
  return p;
}

size_t array_header_size(int n) { return n < 16 ? 1 : 3; }
uint8_t* put_array_header(uint8_t* p, int n) {
  if (n < 16) {
    *p++ = static_cast<uint8_t>(0x90 | n);
  } else {
    *p++ = 0xdc;
    p = put_be16(p, static_cast<uint16_t>(n));
  }
  return p;
}

// Non-negative ints the way msgpack-python packs a Python int: positive fixint, then uint8..64.
size_t uint_size(uint64_t v) {
  return v < 128 ? 1 : v < 256 ? 2 : v < 65536 ? 3 : v <= 0xffffffffULL ? 5 : 9;
}
uint8_t* put_uint(uint8_t* p, uint64_t v) {
  if (v < 128) {
    *p++ = static_cast<uint8_t>(v);
  } else if (v < 256) {
    *p++ = 0xcc;
    *p++ = static_cast<uint8_t>(v);
  } else if (v < 65536) {
    *p++ = 0xcd;
    p = put_be16(p, static_cast<uint16_t>(v));
  } else if (v <= 0xffffffffULL) {
    *p++ = 0xce;
    p = put_be32(p, static_cast<uint32_t>(v));
  } else {
    *p++ = 0xcf;
    p = put_be64(p, v);
  }
  return p;
}

// A bounds-checked cursor for the parser.
struct Cursor {
  const uint8_t* buf;
  size_t len;
  size_t pos;
  bool need(size_t n) const { return n <= len - pos; }
};

// A str or bin value: returns its payload span.
bool read_str_or_bin(Cursor& c, uint64_t* off, uint64_t* n) {
  if (!c.need(1)) return false;
  uint8_t t = c.buf[c.pos++];
  int width;
  if ((t & 0xe0) == 0xa0) {
    *n = t & 0x1f;
    width = 0;
  } else if (t == 0xd9 || t == 0xc4) {
    width = 1;
  } else if (t == 0xda || t == 0xc5) {
    width = 2;
  } else if (t == 0xdb || t == 0xc6) {
    width = 4;
  } else {
    return false;
  }
  if (width) {
    if (!c.need(width)) return false;
    *n = get_be(c.buf + c.pos, width);
    c.pos += width;
  }
  if (!c.need(*n)) return false;
  *off = c.pos;
  c.pos += *n;
  return true;
}

bool read_uint(Cursor& c, int64_t* v) {
  if (!c.need(1)) return false;
  uint8_t t = c.buf[c.pos++];
  int width;
  if (t < 0x80) {
    *v = t;
    return true;
  }
  switch (t) {
    case 0xcc: case 0xd0: width = 1; break;
    case 0xcd: case 0xd1: width = 2; break;
    case 0xce: case 0xd2: width = 4; break;
    case 0xcf: case 0xd3: width = 8; break;
    default: return false;
  }
  if (!c.need(width)) return false;
  uint64_t raw = get_be(c.buf + c.pos, width);
  c.pos += width;
  bool is_signed = t >= 0xd0;
  if (is_signed) {
    // Signed encodings of non-negative values are fine; negative dims are not.
    int shift = 64 - 8 * width;
    int64_t s = static_cast<int64_t>(raw << shift) >> shift;
    if (s < 0) return false;
    *v = s;
  } else {
    if (raw > static_cast<uint64_t>(INT64_MAX)) return false;
    *v = static_cast<int64_t>(raw);
  }
  return true;
}

bool key_is(const Cursor& c, uint64_t off, uint64_t n, const char* key) {
  size_t k = std::strlen(key);
  return n == k && std::memcmp(c.buf + off, key, k) == 0;
}

}  // namespace

size_t prefix_size(uint64_t nbytes) {
  return 1 + (1 + sizeof(kKeyNdarray) - 1) + 1 + (1 + sizeof(kKeyData) - 1) +
         bin_header_size(nbytes);
}

size_t suffix_size(size_t dtype_len, const int64_t* shape, int ndim) {
  size_t n = (1 + sizeof(kKeyDtype) - 1) + str_header_size(dtype_len) + dtype_len;
  n += (1 + sizeof(kKeyShape) - 1) + array_header_size(ndim);
  for (int i = 0; i < ndim; ++i) n += uint_size(static_cast<uint64_t>(shape[i]));
  return n;
}

size_t encoded_size(size_t dtype_len, const int64_t* shape, int ndim, uint64_t nbytes) {
  return prefix_size(nbytes) + nbytes + suffix_size(dtype_len, shape, ndim);
}

size_t encode(uint8_t* out, const char* dtype, size_t dtype_len, const int64_t* shape, int ndim,
              const uint8_t* data, uint64_t nbytes) {
  uint8_t* p = out;
  *p++ = 0x84;  // fixmap, 4 entries
  p = put_str(p, kKeyNdarray, sizeof(kKeyNdarray) - 1);
  *p++ = 0xc3;  // true
  p = put_str(p, kKeyData, sizeof(kKeyData) - 1);
  p = put_bin_header(p, nbytes);
  if (nbytes) std::memcpy(p, data, nbytes);
  p += nbytes;
  p = put_str(p, kKeyDtype, sizeof(kKeyDtype) - 1);
  p = put_str(p, dtype, dtype_len);
  p = put_str(p, kKeyShape, sizeof(kKeyShape) - 1);
  p = put_array_header(p, ndim);
  for (int i = 0; i < ndim; ++i) p = put_uint(p, static_cast<uint64_t>(shape[i]));
  return static_cast<size_t>(p - out);
}

bool parse(const uint8_t* buf, size_t len, Parsed* out) {
  Cursor c{buf, len, 0};
  if (!c.need(1) || buf[0] != 0x84) return false;
  c.pos = 1;
  bool seen_flag = false, seen_data = false, seen_dtype = false, seen_shape = false;
  for (int entry = 0; entry < 4; ++entry) {
    uint64_t koff = 0, klen = 0;
    if (!read_str_or_bin(c, &koff, &klen)) return false;
    if (key_is(c, koff, klen, kKeyNdarray) && !seen_flag) {
      if (!c.need(1) || buf[c.pos] != 0xc3) return false;
      c.pos += 1;
      seen_flag = true;
    } else if (key_is(c, koff, klen, kKeyData) && !seen_data) {
      if (!read_str_or_bin(c, &out->data_offset, &out->data_len)) return false;
      seen_data = true;
    } else if (key_is(c, koff, klen, kKeyDtype) && !seen_dtype) {
      if (!read_str_or_bin(c, &out->dtype_offset, &out->dtype_len)) return false;
      seen_dtype = true;
    } else if (key_is(c, koff, klen, kKeyShape) && !seen_shape) {
      if (!c.need(1)) return false;
      uint8_t t = buf[c.pos++];
      int n;
      if ((t & 0xf0) == 0x90) {
        n = t & 0x0f;
      } else if (t == 0xdc) {
        if (!c.need(2)) return false;
        n = static_cast<int>(get_be(buf + c.pos, 2));
        c.pos += 2;
      } else {
        return false;
      }
      if (n > kMaxDims) return false;
      out->ndim = n;
      for (int i = 0; i < n; ++i) {
        if (!read_uint(c, &out->shape[i])) return false;
      }
      seen_shape = true;
    } else {
      return false;
    }
  }
  out->end = c.pos;
  return true;
}

}  // namespace eva::msgpack_image
