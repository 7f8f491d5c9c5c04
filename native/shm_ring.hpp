// Cross-process single-producer / single-consumer snapshot ring in a shared file mapping.
//
// A camera or robot source runs in its own process (no recorder-side Python thread can stall it on
// the GIL) and pushes fixed-size samples plus their float64 capture times into a MAP_SHARED mapping
// of a file (normally under /dev/shm); the recorder's consumer thread pops them exactly as it pops
// the in-process SnapshotRing (ring.hpp). The slot count is fixed: a mapping shared by two processes
// cannot be re-linked like the in-process ring's blocks. A push into a full ring is refused and
// counted (overflow), never waits.
//
// The CONSUMER creates the file and writes the header (eva/capture/shm_ring.py: exclusive create,
// O_NOFOLLOW, mode 0600, fallocate, magic written last); the PRODUCER attaches by path and checks
// the header. This class only views an existing mapping (it does not own or unmap it): the
// constructor checks the fixed fields and that the times and slots fit in the mapping, and copies
// the geometry, so nothing the other process writes later can make it touch memory outside it.
//
// Byte layout (little-endian, x86-64; every offset from the page-aligned start of the mapping).
// The pure-Python reference (ReferenceShmRing) uses the very same bytes, so a native producer can
// feed a reference consumer and vice versa.
//
//   identity line, written once by the creator before the magic, read-only afterwards
//     0   char[8]   magic "EVASHMR1" (written last: a reader that sees it sees the whole header)
//     8   u32       version (1)
//     12  u32       header_bytes (320 = offset of the times array)
//     16  u64       item_bytes  (bytes of one sample = prod(shape) * itemsize)
//     24  u64       slots       (fixed capacity)
//     32  u64       slot_stride (item_bytes rounded up to 64: every slot starts on its own line)
//     40  u64       times_offset (= header_bytes)
//     48  u64       data_offset (times_offset + 8 * slots, rounded up to 64)
//     56  u64       file_bytes  (data_offset + slots * slot_stride)
//   descriptor line(s), written once by the creator
//     64  u32       ndim (1..8)
//     68  u32       reserved (0)
//     72  u64       consumer_pid (the creating process)
//     80  char[16]  numpy dtype.str, ASCII, NUL padded ("|u1", "<f8"...; native byte order only)
//     96  u64[8]    shape (unused dims 0)
//     160..191      reserved (0)
//   producer line (written only by the producer, except reset_high_water)
//     192 u64       head: samples published so far (= pushed); release-stored after the slot
//     200 u64       overflow: pushes refused because the ring was full
//     208 u64       heartbeat_ns: CLOCK_MONOTONIC ns of the producer's last push/heartbeat (0 never)
//     216 u64       producer_pid (set by attach; 0 before)
//     224 u64       high_water: highest occupancy seen by a push since the last reset
//     232..255      reserved (0)
//   consumer line (written only by the consumer)
//     256 u64       tail: samples freed so far (= popped); release-stored after the copy out
//     264 u64       stop_requested (0/1): the consumer asks the producer to finish
//     272..319      reserved (0)
//   320             f64[slots]  capture time of each slot
//   data_offset     slots x slot_stride bytes of sample data, slot i at data_offset + i*slot_stride
//
// Protocol: head and tail are free-running 64-bit counters (slot = counter % slots, occupancy =
// head - tail). The producer acquire-loads tail (full when head - tail >= slots), copies the sample
// and its time into slot head % slots, then release-stores head + 1. The consumer acquire-loads
// head, copies slots tail..head-1 out, then release-stores the new tail, which hands the slots back.
// Every shared word is an aligned 8-byte location accessed with __atomic builtins (lock-free, one
// instruction on x86-64, so a producer killed at any point leaves either the old or the new value).
// A sample whose copy was interrupted by a crash was never published: the consumer can pop every
// sample published before a producer died, and nothing else.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace eva {

namespace shm_layout {
inline constexpr char kMagic[9] = "EVASHMR1";
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kAlign = 64;
inline constexpr std::size_t kHeaderBytes = 320;
inline constexpr std::size_t kMaxDims = 8;
inline constexpr std::size_t kDtypeBytes = 16;
// identity line
inline constexpr std::size_t kOffMagic = 0;
inline constexpr std::size_t kOffVersion = 8;
inline constexpr std::size_t kOffHeaderBytes = 12;
inline constexpr std::size_t kOffItemBytes = 16;
inline constexpr std::size_t kOffSlots = 24;
inline constexpr std::size_t kOffSlotStride = 32;
inline constexpr std::size_t kOffTimesOffset = 40;
inline constexpr std::size_t kOffDataOffset = 48;
inline constexpr std::size_t kOffFileBytes = 56;
// descriptor
inline constexpr std::size_t kOffNdim = 64;
inline constexpr std::size_t kOffConsumerPid = 72;
inline constexpr std::size_t kOffDtype = 80;
inline constexpr std::size_t kOffShape = 96;
// producer line
inline constexpr std::size_t kOffHead = 192;
inline constexpr std::size_t kOffOverflow = 200;
inline constexpr std::size_t kOffHeartbeat = 208;
inline constexpr std::size_t kOffProducerPid = 216;
inline constexpr std::size_t kOffHighWater = 224;
// consumer line
inline constexpr std::size_t kOffTail = 256;
inline constexpr std::size_t kOffStop = 264;

static_assert(kOffShape + 8 * kMaxDims <= kOffHead, "descriptor overlaps the producer line");
static_assert(kOffHead % kAlign == 0 && kOffTail % kAlign == 0, "counters on their own lines");
static_assert(kOffTail - kOffHead == kAlign, "producer and consumer lines are adjacent lines");
static_assert(kHeaderBytes % kAlign == 0 && kHeaderBytes >= kOffTail + kAlign, "header size");
}  // namespace shm_layout

class ShmRing {
 public:
  // Views `size` bytes at `base` (a MAP_SHARED mapping whose header the creator wrote). Throws
  // std::invalid_argument naming the field when the header is not a valid version-1 ring header
  // or the slots do not fit in `size`.
  ShmRing(void* base, std::size_t size);
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Producer side (one thread of one process at a time). Returns false when the ring is full: the
  // sample is not stored and overflow_count() goes up by one. Also stamps the heartbeat.
  bool push(double t, const void* src);
  void heartbeat(std::uint64_t now_ns);
  void set_producer_pid(std::uint64_t pid);

  // Consumer side (one thread of one process at a time). Copies up to max_n samples (oldest
  // first) into `out` (max_n * item_bytes bytes) and `out_times`; returns how many were copied.
  std::size_t pop(void* out, double* out_times, std::size_t max_n);
  // Frees up to max_n samples without copying them; returns how many were freed.
  std::size_t discard(std::size_t max_n);
  // Capture time of the oldest unread sample, or false when the ring is empty.
  bool peek_time(double* t) const;
  void request_stop();
  void reset_high_water();

  // Readable from either side.
  std::size_t size() const;
  std::uint64_t pushed() const;
  std::uint64_t popped() const;
  std::uint64_t overflow_count() const;
  std::uint64_t high_water() const;
  std::uint64_t heartbeat_ns() const;
  std::uint64_t producer_pid() const;
  std::uint64_t consumer_pid() const;
  bool stop_requested() const;
  std::size_t slots() const { return slots_; }
  std::size_t item_bytes() const { return item_bytes_; }
  std::size_t slot_stride() const { return stride_; }
  std::size_t file_bytes() const { return file_bytes_; }

  // CLOCK_MONOTONIC in ns (the clock of Python's time.monotonic_ns on Linux).
  static std::uint64_t monotonic_ns();

 private:
  std::uint64_t* word(std::size_t off) const {
    return reinterpret_cast<std::uint64_t*>(base_ + off);
  }
  std::size_t available(std::uint64_t tail, std::uint64_t head) const;

  unsigned char* base_;
  std::size_t item_bytes_ = 0;
  std::size_t slots_ = 0;
  std::size_t stride_ = 0;
  std::size_t file_bytes_ = 0;
  double* times_ = nullptr;
  unsigned char* data_ = nullptr;
};

}  // namespace eva
