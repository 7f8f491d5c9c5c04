#include "mcap_chunk.hpp"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EVA_CRC_FOLD 1
#include <immintrin.h>
#endif

namespace eva {

namespace {

// --- CRC-32 -------------------------------------------------------------------------------------

constexpr std::uint32_t CRC_POLY = 0xEDB88320u;  // reflected 0x04C11DB7

struct CrcTables {
    std::uint32_t t[8][256];
    CrcTables() {
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1u)));
            t[0][i] = c;
        }
        for (int s = 1; s < 8; ++s)
            for (std::uint32_t i = 0; i < 256; ++i)
                t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
};

const CrcTables& crc_tables() {
    static const CrcTables tables;
    return tables;
}

// The running (inverted) register over `size` bytes, eight at a time.
std::uint32_t crc_slices(std::uint32_t crc, const std::uint8_t* p, std::size_t size) {
    const auto& t = crc_tables().t;
    while (size >= 8) {
        std::uint32_t lo = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 |
                                  std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24);
        std::uint32_t hi = std::uint32_t(p[4]) | std::uint32_t(p[5]) << 8 |
                           std::uint32_t(p[6]) << 16 | std::uint32_t(p[7]) << 24;
        crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
              t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        size -= 8;
    }
    while (size--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if EVA_CRC_FOLD
#define EVA_FOLD_TARGET __attribute__((target("pclmul,sse4.1")))

EVA_FOLD_TARGET inline __m128i load(const std::uint8_t* at) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
}

// x's two halves multiplied by k's, added to the next 16 bytes.
EVA_FOLD_TARGET inline __m128i fold(__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(
        _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// The running register over `size` bytes (>= 64, a multiple of 16) by carry-less multiply
// folding: V. Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
// Instruction" (Intel, 2009), with its bit-reflected constants for this polynomial: four
// 128-bit lanes folded 64 bytes at a time (k1, k2), folded into one (k3, k4), then 128 -> 64
// bits (k4, k5) and a Barrett reduction to 32 bits (P', mu).
EVA_FOLD_TARGET std::uint32_t crc_fold(std::uint32_t crc, const std::uint8_t* p, std::size_t size) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
    __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
    p += 64;
    size -= 64;
    for (; size >= 64; p += 64, size -= 64) {
        x1 = fold(x1, k1k2, load(p));
        x2 = fold(x2, k1k2, load(p + 16));
        x3 = fold(x3, k1k2, load(p + 32));
        x4 = fold(x4, k1k2, load(p + 48));
    }
    x1 = fold(x1, k3k4, x2);
    x1 = fold(x1, k3k4, x3);
    x1 = fold(x1, k3k4, x4);
    for (; size >= 16; p += 16, size -= 16) x1 = fold(x1, k3k4, load(p));
    // 128 -> 64 bits, then 64 -> 32 bits of remainder
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k3k4, 0x10));
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4),
                       _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00));
    // Barrett reduction
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    return static_cast<std::uint32_t>(_mm_extract_epi32(_mm_xor_si128(x1, t), 1));
}

bool cpu_folds() {
    static const bool folds = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return folds;
}
#endif

// --- message records -----------------------------------------------------------------------------

constexpr std::uint8_t OPCODE_MESSAGE = 0x05;
// opcode u8, length u64, channel u16, sequence u32, log_time u64, publish_time u64
constexpr std::size_t MESSAGE_HEADER = 31;
// Protobuf keys (field number << 3 | wire type) of foxglove.CompressedVideo and
// google.protobuf.Timestamp: timestamp = 1 (bytes), seconds = 1 and nanos = 2 (varints),
// data = 3 (bytes).
constexpr std::uint8_t KEY_TIMESTAMP = 0x0A;
constexpr std::uint8_t KEY_SECONDS = 0x08;
constexpr std::uint8_t KEY_NANOS = 0x10;
constexpr std::uint8_t KEY_DATA = 0x1A;

inline std::size_t varint_size(std::uint64_t v) {
    std::size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        ++n;
    }
    return n;
}

inline std::uint8_t* put_varint(std::uint8_t* out, std::uint64_t v) {
    while (v >= 0x80) {
        *out++ = static_cast<std::uint8_t>(v | 0x80);
        v >>= 7;
    }
    *out++ = static_cast<std::uint8_t>(v);
    return out;
}

template <typename T>
inline std::uint8_t* put_le(std::uint8_t* out, T value) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
    return out + sizeof(T);
}

inline std::uint8_t* put_bytes(std::uint8_t* out, const std::uint8_t* data, std::size_t size) {
    if (size) std::memcpy(out, data, size);
    return out + size;
}

// A frame's CompressedVideo fields before its unit's bytes, as protobuf's serializer writes them
// (fields in number order, zero values and empty bytes left out; the timestamp always present).
struct VideoHead {
    std::uint64_t seconds;  // int64 as its two's complement (10 varint bytes when negative)
    std::uint64_t nanos;
    std::size_t stamp_size;
    std::size_t data_size;  // prefix + unit
    bool prefixed;
    std::size_t size;  // every byte before the unit
};

inline VideoHead video_head(const RecordSource& s, std::size_t f, std::int64_t time) {
    VideoHead h;
    std::int64_t seconds = time / 1000000000, nanos = time % 1000000000;
    if (nanos < 0) {  // floor division, as Python's divmod
        nanos += 1000000000;
        seconds -= 1;
    }
    h.seconds = static_cast<std::uint64_t>(seconds);
    h.nanos = static_cast<std::uint64_t>(nanos);
    h.stamp_size = (h.seconds ? 1 + varint_size(h.seconds) : 0) + (h.nanos ? 1 + varint_size(h.nanos) : 0);
    h.prefixed = s.prefixed[f] != 0;
    h.data_size = static_cast<std::size_t>(s.sizes[f]) + (h.prefixed ? s.prefix_size : 0);
    h.size = 2 + h.stamp_size + s.frame_id_size +
             (h.data_size ? 1 + varint_size(h.data_size) + (h.prefixed ? s.prefix_size : 0) : 0);
    return h;
}

}  // namespace

std::uint32_t crc32_update(std::uint32_t crc, const std::uint8_t* data, std::size_t size) {
    crc = ~crc;
#if EVA_CRC_FOLD
    if (size >= 64 && cpu_folds()) {
        std::size_t whole = size & ~std::size_t(15);
        crc = crc_fold(crc, data, whole);
        data += whole;
        size -= whole;
    }
#endif
    return ~crc_slices(crc, data, size);
}

bool crc32_folds() {
#if EVA_CRC_FOLD
    return cpu_folds();
#else
    return false;
#endif
}

std::int64_t annexb_in_place(std::uint8_t* window, std::size_t window_size,
                             const std::int64_t* starts, const std::int64_t* ends, std::size_t n,
                             std::uint8_t* has_sps) {
    for (std::size_t i = 0; i < n; ++i) {
        std::size_t pos = static_cast<std::size_t>(starts[i]);
        const std::size_t end = static_cast<std::size_t>(ends[i]);
        bool sps = false;
        while (pos < end) {
            if (end - pos < 4 || end > window_size) return static_cast<std::int64_t>(i);
            std::size_t size = std::size_t(window[pos]) << 24 | std::size_t(window[pos + 1]) << 16 |
                               std::size_t(window[pos + 2]) << 8 | std::size_t(window[pos + 3]);
            if (size == 0 || pos + 4 + size > end) return static_cast<std::int64_t>(i);
            sps = sps || (window[pos + 4] & 0x1F) == 7;  // nal_unit_type 7: SPS
            window[pos] = window[pos + 1] = window[pos + 2] = 0;
            window[pos + 3] = 1;
            pos += 4 + size;
        }
        has_sps[i] = sps;
    }
    return -1;
}

RecordFill frame_records(const RecordSource* sources, std::size_t source_count,
                         std::size_t frames, std::int64_t frame_base, const std::int64_t* times,
                         std::size_t first, std::uint8_t* buffer, std::size_t capacity,
                         std::size_t used, std::size_t chunk_size, std::int64_t* offsets) {
    const std::size_t count = frames * source_count;
    for (std::size_t m = first; m < count; ++m) {
        const std::size_t f = m / source_count;
        const RecordSource& s = sources[m % source_count];
        const std::int64_t time = times[f];
        std::size_t payload;
        VideoHead head{};
        if (s.video) {
            head = video_head(s, f, time);
            payload = head.size + static_cast<std::size_t>(s.sizes[f]) + s.tail_size;
        } else {
            const std::size_t row = static_cast<std::size_t>(frame_base) + f;
            payload = static_cast<std::size_t>(s.starts[row + 1] - s.starts[row]);
        }
        const std::size_t record = MESSAGE_HEADER + payload;
        if ((used && used + record > chunk_size) || used + record > capacity) return {m, used, record};
        std::uint8_t* out = buffer + used;
        offsets[m] = static_cast<std::int64_t>(used);
        *out++ = OPCODE_MESSAGE;
        out = put_le<std::uint64_t>(out, record - 9);  // the bytes after opcode and length
        out = put_le<std::uint16_t>(out, s.channel);
        out = put_le<std::uint32_t>(out, static_cast<std::uint32_t>(frame_base + static_cast<std::int64_t>(f)));
        out = put_le<std::uint64_t>(out, static_cast<std::uint64_t>(time));
        out = put_le<std::uint64_t>(out, static_cast<std::uint64_t>(time));
        if (s.video) {
            *out++ = KEY_TIMESTAMP;
            *out++ = static_cast<std::uint8_t>(head.stamp_size);  // at most 17: one byte
            if (head.seconds) {
                *out++ = KEY_SECONDS;
                out = put_varint(out, head.seconds);
            }
            if (head.nanos) {
                *out++ = KEY_NANOS;
                out = put_varint(out, head.nanos);
            }
            out = put_bytes(out, s.frame_id, s.frame_id_size);
            if (head.data_size) {
                *out++ = KEY_DATA;
                out = put_varint(out, head.data_size);
                if (head.prefixed) out = put_bytes(out, s.prefix, s.prefix_size);
            }
            out = put_bytes(out, s.data + s.starts[f], static_cast<std::size_t>(s.sizes[f]));
            out = put_bytes(out, s.tail, s.tail_size);
        } else {
            const std::size_t row = static_cast<std::size_t>(frame_base) + f;
            out = put_bytes(out, s.data + s.starts[row], payload);
        }
        used += record;
        if (used >= chunk_size) return {m + 1, used, 0};
    }
    return {count, used, 0};
}

}  // namespace eva
