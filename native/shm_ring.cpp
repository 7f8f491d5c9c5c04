#include "shm_ring.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>

namespace eva {

// Every shared counter is a plain aligned uint64_t inside the mapping, accessed only through the
// __atomic builtins (well defined on ordinary objects, unlike a reinterpret_cast to std::atomic).
// Both must be lock-free: a lock would live in one process's memory, and on x86-64 these compile
// to single aligned movs, the same instructions the pure-Python reference ends up executing.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "64-bit atomics must be lock-free");
static_assert(__atomic_always_lock_free(sizeof(std::uint64_t), nullptr),
              "__atomic builtins on uint64_t must be lock-free");
static_assert(sizeof(double) == 8, "times are float64");

namespace {

using namespace shm_layout;

inline std::uint64_t load_acquire(const std::uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
inline std::uint64_t load_relaxed(const std::uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
inline void store_release(std::uint64_t* p, std::uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
inline void store_relaxed(std::uint64_t* p, std::uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

std::uint64_t read_u64(const unsigned char* base, std::size_t off) {
  std::uint64_t v;
  std::memcpy(&v, base + off, sizeof v);
  return v;
}

std::uint32_t read_u32(const unsigned char* base, std::size_t off) {
  std::uint32_t v;
  std::memcpy(&v, base + off, sizeof v);
  return v;
}

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("bad shm ring header: " + what);
}

}  // namespace

ShmRing::ShmRing(void* base, std::size_t size) : base_(static_cast<unsigned char*>(base)) {
  if (base_ == nullptr) bad("no mapping");
  if (reinterpret_cast<std::uintptr_t>(base_) % kAlign != 0) bad("mapping is not 64-byte aligned");
  if (size < kHeaderBytes) {
    bad("truncated: " + std::to_string(size) + " bytes, the header needs " +
        std::to_string(kHeaderBytes));
  }
  if (std::memcmp(base_ + kOffMagic, kMagic, 8) != 0) bad("magic is not EVASHMR1");
  if (read_u32(base_, kOffVersion) != kVersion) {
    bad("version " + std::to_string(read_u32(base_, kOffVersion)) + ", expected " +
        std::to_string(kVersion));
  }
  if (read_u32(base_, kOffHeaderBytes) != kHeaderBytes) bad("header_bytes");
  const std::uint64_t item = read_u64(base_, kOffItemBytes);
  const std::uint64_t slots = read_u64(base_, kOffSlots);
  const std::uint64_t stride = read_u64(base_, kOffSlotStride);
  const std::uint64_t times_off = read_u64(base_, kOffTimesOffset);
  const std::uint64_t data_off = read_u64(base_, kOffDataOffset);
  const std::uint64_t file_bytes = read_u64(base_, kOffFileBytes);
  if (item == 0 || item > size) bad("item_bytes " + std::to_string(item));
  if (slots == 0 || slots > (size - kHeaderBytes) / sizeof(double)) {
    bad("slots " + std::to_string(slots));
  }
  if (stride != (item + kAlign - 1) / kAlign * kAlign) bad("slot_stride");
  if (times_off != kHeaderBytes) bad("times_offset");
  const std::uint64_t times_end = times_off + slots * sizeof(double);  // <= size, no overflow
  if (data_off != (times_end + kAlign - 1) / kAlign * kAlign) bad("data_offset");
  if (data_off > size || slots > (size - data_off) / stride) {
    bad("truncated: the slots do not fit in " + std::to_string(size) + " bytes");
  }
  if (file_bytes != data_off + slots * stride) bad("file_bytes");
  item_bytes_ = static_cast<std::size_t>(item);
  slots_ = static_cast<std::size_t>(slots);
  stride_ = static_cast<std::size_t>(stride);
  file_bytes_ = static_cast<std::size_t>(file_bytes);
  times_ = reinterpret_cast<double*>(base_ + times_off);
  data_ = base_ + data_off;
}

std::uint64_t ShmRing::monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// head - tail, read as an occupancy: 0 when tail is ahead (only a corrupt ring), at most `slots`.
std::size_t ShmRing::available(std::uint64_t tail, std::uint64_t head) const {
  if (head <= tail) return 0;
  return static_cast<std::size_t>(std::min<std::uint64_t>(head - tail, slots_));
}

bool ShmRing::push(double t, const void* src) {
  std::uint64_t* head_p = word(kOffHead);
  const std::uint64_t head = load_relaxed(head_p);  // only this producer writes it
  const std::uint64_t tail = load_acquire(word(kOffTail));
  bool ok = false;
  if (head >= tail && head - tail < slots_) {
    const std::size_t slot = static_cast<std::size_t>(head % slots_);
    std::memcpy(data_ + slot * stride_, src, item_bytes_);
    times_[slot] = t;
    store_release(head_p, head + 1);  // publishes the slot and its time
    const std::uint64_t occupancy = head + 1 - tail;
    if (occupancy > load_relaxed(word(kOffHighWater))) {
      store_relaxed(word(kOffHighWater), occupancy);
    }
    ok = true;
  } else {
    std::uint64_t* overflow_p = word(kOffOverflow);
    store_release(overflow_p, load_relaxed(overflow_p) + 1);
  }
  store_relaxed(word(kOffHeartbeat), monotonic_ns());
  return ok;
}

void ShmRing::heartbeat(std::uint64_t now_ns) { store_relaxed(word(kOffHeartbeat), now_ns); }

void ShmRing::set_producer_pid(std::uint64_t pid) { store_release(word(kOffProducerPid), pid); }

std::size_t ShmRing::pop(void* out, double* out_times, std::size_t max_n) {
  std::uint64_t* tail_p = word(kOffTail);
  const std::uint64_t tail = load_relaxed(tail_p);  // only this consumer writes it
  const std::uint64_t head = load_acquire(word(kOffHead));
  const std::size_t n = std::min(available(tail, head), max_n);
  if (n == 0) return 0;
  unsigned char* dst = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t slot = static_cast<std::size_t>((tail + i) % slots_);
    if (dst != nullptr) std::memcpy(dst + i * item_bytes_, data_ + slot * stride_, item_bytes_);
    if (out_times != nullptr) out_times[i] = times_[slot];
  }
  store_release(tail_p, tail + n);  // hands the slots back to the producer
  return n;
}

std::size_t ShmRing::discard(std::size_t max_n) { return pop(nullptr, nullptr, max_n); }

bool ShmRing::peek_time(double* t) const {
  const std::uint64_t tail = load_relaxed(word(kOffTail));
  const std::uint64_t head = load_acquire(word(kOffHead));
  if (available(tail, head) == 0) return false;
  *t = times_[tail % slots_];
  return true;
}

void ShmRing::request_stop() { store_release(word(kOffStop), 1); }

void ShmRing::reset_high_water() { store_relaxed(word(kOffHighWater), size()); }

std::size_t ShmRing::size() const {
  // tail first: head only grows, so the later head read is never behind it.
  const std::uint64_t tail = load_acquire(word(kOffTail));
  const std::uint64_t head = load_acquire(word(kOffHead));
  return available(tail, head);
}

std::uint64_t ShmRing::pushed() const { return load_acquire(word(kOffHead)); }
std::uint64_t ShmRing::popped() const { return load_acquire(word(kOffTail)); }
std::uint64_t ShmRing::overflow_count() const { return load_acquire(word(kOffOverflow)); }
std::uint64_t ShmRing::high_water() const { return load_relaxed(word(kOffHighWater)); }
std::uint64_t ShmRing::heartbeat_ns() const { return load_relaxed(word(kOffHeartbeat)); }
std::uint64_t ShmRing::producer_pid() const { return load_acquire(word(kOffProducerPid)); }
std::uint64_t ShmRing::consumer_pid() const { return read_u64(base_, kOffConsumerPid); }
bool ShmRing::stop_requested() const { return load_acquire(word(kOffStop)) != 0; }

}  // namespace eva
