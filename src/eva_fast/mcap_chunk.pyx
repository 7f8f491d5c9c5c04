# cython: language_level=3, boundscheck=False, wraparound=False
"""The MCAP writer's chunk work (native/mcap_chunk.hpp): the chunk CRC, the Annex B conversion of
a read window, and the message records of a batch of foxglove frames. References:
eva/formats/mcap/records.py (zlib.crc32), h264.py (annexb_in_place_batch), frame_records.py."""

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t
from libcpp cimport bool as cbool
from libcpp.vector cimport vector

cdef extern from "mcap_chunk.hpp" namespace "eva":
    uint32_t crc32_update(uint32_t, const uint8_t*, size_t) nogil
    cbool c_crc32_folds "eva::crc32_folds"() nogil
    int64_t c_annexb_in_place "eva::annexb_in_place"(
        uint8_t*, size_t, const int64_t*, const int64_t*, size_t, uint8_t*) nogil
    cdef cppclass RecordSource:
        uint16_t channel
        cbool video
        const uint8_t* data
        const int64_t* starts
        const int64_t* sizes
        const uint8_t* prefixed
        const uint8_t* prefix
        size_t prefix_size
        const uint8_t* frame_id
        size_t frame_id_size
        const uint8_t* tail
        size_t tail_size
    cdef cppclass RecordFill:
        size_t next
        size_t used
        size_t needed
    RecordFill c_frame_records "eva::frame_records"(
        const RecordSource*, size_t, size_t, int64_t, const int64_t*, size_t, uint8_t*, size_t,
        size_t, size_t, int64_t*) nogil

# Below this size the GIL round trip costs more than the CRC it frees the other threads for.
cdef size_t NOGIL_MIN_BYTES = 65536


cdef const uint8_t* _bytes_at(const uint8_t[::1] view):
    return &view[0] if view.shape[0] else <const uint8_t*>NULL


def crc32(const uint8_t[::1] data not None, uint32_t value=0):
    """``zlib.crc32(data, value)``."""
    cdef size_t size = data.shape[0]
    cdef const uint8_t* at = _bytes_at(data)
    if size < NOGIL_MIN_BYTES:
        return crc32_update(value, at, size)
    with nogil:
        value = crc32_update(value, at, size)
    return value


def crc32_folds():
    """Whether ``crc32`` runs the carry-less multiply folding (else a table walk)."""
    return c_crc32_folds()


def annexb_in_place(uint8_t[::1] window not None, const int64_t[::1] starts not None,
                    const int64_t[::1] ends not None, uint8_t[::1] has_sps not None):
    """4-byte NAL lengths -> start codes in every sample ``window[starts[i]:ends[i]]``, SPS flags
    into ``has_sps``; -1, or the first sample whose lengths do not add up."""
    cdef Py_ssize_t n = starts.shape[0], i
    if ends.shape[0] != n or has_sps.shape[0] != n:
        raise ValueError("annexb_in_place: starts, ends and has_sps differ in length")
    for i in range(n):
        if starts[i] < 0 or ends[i] < starts[i] or ends[i] > window.shape[0]:
            raise ValueError(f"annexb_in_place: sample {i} outside the window")
    if n == 0:
        return -1
    cdef int64_t bad
    with nogil:
        bad = c_annexb_in_place(&window[0], window.shape[0], &starts[0], &ends[0], n, &has_sps[0])
    return bad


def frame_records(list sources not None, const int64_t[::1] times not None, int64_t frame_base,
                  Py_ssize_t first, uint8_t[::1] buffer not None, Py_ssize_t used,
                  Py_ssize_t chunk_size, int64_t[::1] offsets not None):
    """Message records of ``len(times)`` frames x ``len(sources)`` into ``buffer`` from message
    ``first`` at ``used``, while the chunk takes them; ``(next message, used, size of the record
    that did not fit or 0)``. A source is ``(channel, data, starts)`` (JSON rows of the
    episode, row r = data[starts[r]:starts[r + 1]]) or ``(channel, data, starts, sizes,
    prefixed, prefix, frame_id, tail)`` (a camera's units of these frames)."""
    cdef Py_ssize_t frames = times.shape[0]
    cdef Py_ssize_t count = frames * len(sources)
    if frame_base < 0 or not 0 <= first <= count or not 0 <= used <= buffer.shape[0]:
        raise ValueError("frame_records: frame_base, first or used out of range")
    if chunk_size < 1:
        raise ValueError("frame_records: chunk_size must be positive")
    if offsets.shape[0] < count:
        raise ValueError("frame_records: offsets shorter than the messages")
    cdef vector[RecordSource] slots = vector[RecordSource](len(sources))
    cdef list keep = []  # the buffers stay exported (unmoved) while the kernel reads them
    cdef const uint8_t[::1] data, prefixed, prefix, frame_id, tail
    cdef const int64_t[::1] starts, sizes
    cdef Py_ssize_t k, f
    for k, source in enumerate(sources):
        channel = source[0]
        if not 0 <= channel <= 0xFFFF:
            raise ValueError(f"frame_records: channel {channel} is not a uint16")
        slots[k].channel = channel
        data = source[1]
        starts = source[2]
        keep += [data, starts]
        slots[k].data = _bytes_at(data)
        if len(source) == 3:
            slots[k].video = False
            if starts.shape[0] < frame_base + frames + 1:
                raise ValueError(f"frame_records: source {k} has fewer rows than the frames")
            for f in range(frame_base, frame_base + frames):
                if starts[f] < 0 or starts[f + 1] < starts[f] or starts[f + 1] > data.shape[0]:
                    raise ValueError(f"frame_records: source {k} row {f} outside its data")
            slots[k].starts = &starts[0]
            continue
        sizes, prefixed, prefix, frame_id, tail = source[3:8]
        keep += [sizes, prefixed, prefix, frame_id, tail]
        if starts.shape[0] < frames or sizes.shape[0] < frames or prefixed.shape[0] < frames:
            raise ValueError(f"frame_records: source {k} has fewer units than the frames")
        for f in range(frames):
            if starts[f] < 0 or sizes[f] < 0 or starts[f] + sizes[f] > data.shape[0]:
                raise ValueError(f"frame_records: source {k} unit {f} outside its data")
        slots[k].video = True
        slots[k].starts = &starts[0] if frames else <const int64_t*>NULL
        slots[k].sizes = &sizes[0] if frames else <const int64_t*>NULL
        slots[k].prefixed = _bytes_at(prefixed)
        slots[k].prefix = _bytes_at(prefix)
        slots[k].prefix_size = prefix.shape[0]
        slots[k].frame_id = _bytes_at(frame_id)
        slots[k].frame_id_size = frame_id.shape[0]
        slots[k].tail = _bytes_at(tail)
        slots[k].tail_size = tail.shape[0]
    if count == first:
        return first, used, 0
    cdef RecordFill fill
    cdef uint8_t* out = &buffer[0] if buffer.shape[0] else <uint8_t*>NULL
    with nogil:
        fill = c_frame_records(slots.data(), slots.size(), frames, frame_base, &times[0], first,
                               out, buffer.shape[0], used, chunk_size, &offsets[0])
    return fill.next, fill.used, fill.needed
