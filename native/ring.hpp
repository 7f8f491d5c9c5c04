// Lock-free single-producer / single-consumer snapshot ring for live capture.
//
// One ring per stream. A slot holds one fixed-size sample (a camera frame or a vector) plus its
// float64 capture time. The producer (the rig's thread calling push_image / push_vector) copies a
// sample into the next free slot and publishes it with a release store; the consumer (the
// recorder's aligner thread) acquires it, copies it out and frees the slot.
//
// Storage is a cycle of equally sized blocks (the scheme of moodycamel's ReaderWriterQueue). The
// first `initial_blocks` are allocated and pre-touched up front, so in steady state a push is a
// memcpy and two atomic operations. When the consumer falls behind and every block is full, the
// producer links a fresh block into the cycle (growth happens only under backlog), up to
// `max_bytes` of slot storage. Past that hard limit a push is refused and counted in
// `overflow_count()`: the recorder turns a non-zero count into the red quality issue
// `capture_backlog_overflow`. Nothing is ever dropped without being counted, and the producer
// never waits for the consumer, the disk or the encoder.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace eva {

class SnapshotRing {
 public:
  SnapshotRing(std::size_t item_bytes, std::size_t block_slots, std::size_t initial_blocks,
               std::size_t max_bytes);
  ~SnapshotRing();
  SnapshotRing(const SnapshotRing&) = delete;
  SnapshotRing& operator=(const SnapshotRing&) = delete;

  // Producer side (one thread at a time). Returns false when the hard limit is reached: the
  // sample is not stored and overflow_count() goes up by one.
  bool push(double t, const void* src);

  // Consumer side (one thread at a time). Copies up to max_n samples (oldest first) into `out`
  // (max_n * item_bytes bytes) and `out_times`; returns how many were copied.
  std::size_t pop(void* out, double* out_times, std::size_t max_n);
  // Frees up to max_n samples without copying them (CANCEL); returns how many were freed.
  std::size_t discard(std::size_t max_n);
  // Capture time of the oldest unread sample, or false when the ring is empty.
  bool peek_time(double* t) const;

  // Statistics, readable from any thread.
  std::size_t size() const;  // samples pushed and not yet popped
  std::uint64_t pushed() const { return pushed_.load(std::memory_order_acquire); }
  std::uint64_t popped() const { return popped_.load(std::memory_order_acquire); }
  std::uint64_t overflow_count() const { return overflow_.load(std::memory_order_acquire); }
  std::size_t high_water() const { return high_water_.load(std::memory_order_relaxed); }
  void reset_high_water() { high_water_.store(size(), std::memory_order_relaxed); }
  std::size_t capacity() const {  // slots allocated so far
    return blocks_.load(std::memory_order_acquire) * block_slots_;
  }
  std::size_t max_capacity() const { return max_blocks_ * block_slots_; }
  std::size_t item_bytes() const { return item_bytes_; }
  std::size_t allocated_bytes() const { return capacity() * item_bytes_; }

 private:
  struct Block {
    unsigned char* data;
    double* times;
    std::atomic<std::size_t> front;  // consumer's free-running counter within this block
    std::atomic<std::size_t> tail;   // producer's free-running counter within this block
    std::atomic<Block*> next;
  };
  Block* new_block(bool pre_touch);
  void write_slot(Block* b, std::size_t pos, double t, const void* src);
  void read_slot(const Block* b, std::size_t pos, unsigned char* out, double* out_t) const;

  const std::size_t item_bytes_;
  const std::size_t block_slots_;
  std::size_t max_blocks_;
  std::atomic<std::size_t> blocks_{0};
  alignas(64) std::atomic<Block*> front_block_{nullptr};  // owned by the consumer
  alignas(64) std::atomic<Block*> tail_block_{nullptr};   // owned by the producer
  alignas(64) std::atomic<std::uint64_t> pushed_{0};
  std::atomic<std::size_t> high_water_{0};
  std::atomic<std::uint64_t> overflow_{0};
  alignas(64) std::atomic<std::uint64_t> popped_{0};
};

}  // namespace eva
