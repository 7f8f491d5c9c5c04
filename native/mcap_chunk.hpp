// The chunk work of eva's MCAP writer (docs/formats.md, the MCAP layouts): the chunk CRC, and for
// the foxglove profile the Annex B conversion of an MP4 read window and the message records of a
// batch of frames. The Python references are in eva/formats/mcap/records.py (zlib.crc32),
// h264.py (annexb_in_place_batch) and frame_records.py (numpy framing of the same records); the
// tests compare them byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eva {

// zlib's crc32(crc, data, size): the CRC-32 of ISO 3309 / ITU-T V.42 (reflected polynomial
// 0xEDB88320), as MCAP's chunk and summary CRCs use it, continued from `crc`.
std::uint32_t crc32_update(std::uint32_t crc, const std::uint8_t* data, std::size_t size);

// Whether crc32_update folds with carry-less multiplies (x86-64 with PCLMULQDQ and SSE4.1);
// otherwise it runs slicing-by-8 tables, slower than zlib's own code.
bool crc32_folds();

// Each sample window[starts[i]:ends[i]] holds NAL units after 4-byte big-endian lengths: write a
// start code (00 00 00 01) over each length and set has_sps[i] when a unit is a sequence
// parameter set. Return -1, or the first sample whose lengths do not add up (a zero length or
// one past the sample's end); that sample and the later ones are then left partly converted.
std::int64_t annexb_in_place(std::uint8_t* window, std::size_t window_size,
                             const std::int64_t* starts, const std::int64_t* ends, std::size_t n,
                             std::uint8_t* has_sps);

// One per-frame message source of a batch: a JSON topic (the payload of frame f is
// data[starts[f]:starts[f + 1]], f counted from the episode's first frame) or a camera (a
// foxglove.CompressedVideo around unit f of the batch, data[starts[f]:starts[f] + sizes[f]],
// with `prefix` in front of it where prefixed[f]; `frame_id` is the encoded frame_id field or
// empty, `tail` the encoded fields after the data).
struct RecordSource {
    std::uint16_t channel;
    bool video;
    const std::uint8_t* data;
    const std::int64_t* starts;
    const std::int64_t* sizes;        // video
    const std::uint8_t* prefixed;     // video
    const std::uint8_t* prefix;       // video
    std::size_t prefix_size;
    const std::uint8_t* frame_id;     // video
    std::size_t frame_id_size;
    const std::uint8_t* tail;         // video
    std::size_t tail_size;
};

struct RecordFill {
    std::size_t next;    // the first message not written
    std::size_t used;    // the chunk buffer's bytes in use after them
    std::size_t needed;  // the record size of message `next` (0 when every message is written)
};

// Message records (MCAP Message: opcode, length, channel, sequence, log time, publish time =
// log time, payload) of `frames` frames x `source_count` sources, frame by frame, each frame's
// sources in order: message m is frame m / source_count (sequence frame_base + that frame, log
// time times[that frame]), source m % source_count. Writes from message `first` at buffer[used]
// while the chunk takes them: a record goes in when the chunk is empty (and the buffer holds it)
// or when used + its size <= chunk_size; stops after the record that brings used to chunk_size
// or more. offsets[m] gets each written record's offset in the buffer.
RecordFill frame_records(const RecordSource* sources, std::size_t source_count,
                         std::size_t frames, std::int64_t frame_base, const std::int64_t* times,
                         std::size_t first, std::uint8_t* buffer, std::size_t capacity,
                         std::size_t used, std::size_t chunk_size, std::int64_t* offsets);

}  // namespace eva
