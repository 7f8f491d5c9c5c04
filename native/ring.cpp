#include "ring.hpp"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace eva {

SnapshotRing::SnapshotRing(std::size_t item_bytes, std::size_t block_slots,
                           std::size_t initial_blocks, std::size_t max_bytes)
    : item_bytes_(item_bytes), block_slots_(block_slots) {
  if (item_bytes == 0) throw std::invalid_argument("ring item size must be > 0 bytes");
  if (block_slots == 0) throw std::invalid_argument("ring block_slots must be > 0");
  if (initial_blocks == 0) initial_blocks = 1;
  const std::size_t block_bytes = item_bytes * block_slots;
  max_blocks_ = std::max(initial_blocks, max_bytes / block_bytes);
  // Build the initial cycle: b0 -> b1 -> ... -> b0.
  Block* first = new_block(true);
  Block* prev = first;
  for (std::size_t i = 1; i < initial_blocks; ++i) {
    Block* b = new_block(true);
    prev->next.store(b, std::memory_order_relaxed);
    prev = b;
  }
  prev->next.store(first, std::memory_order_relaxed);
  front_block_.store(first, std::memory_order_relaxed);
  tail_block_.store(first, std::memory_order_release);
}

SnapshotRing::~SnapshotRing() {
  Block* start = front_block_.load(std::memory_order_acquire);
  if (start == nullptr) return;
  Block* b = start;
  do {
    Block* next = b->next.load(std::memory_order_relaxed);
    std::free(b->data);
    std::free(b->times);
    delete b;
    b = next;
  } while (b != start);
}

SnapshotRing::Block* SnapshotRing::new_block(bool pre_touch) {
  Block* b = new Block();
  b->data = static_cast<unsigned char*>(std::malloc(item_bytes_ * block_slots_));
  b->times = static_cast<double*>(std::malloc(sizeof(double) * block_slots_));
  if (b->data == nullptr || b->times == nullptr) {
    std::free(b->data);
    std::free(b->times);
    delete b;
    throw std::bad_alloc();
  }
  // Touch every page now so that steady-state pushes never pay first-touch page faults.
  if (pre_touch) std::memset(b->data, 0, item_bytes_ * block_slots_);
  b->front.store(0, std::memory_order_relaxed);
  b->tail.store(0, std::memory_order_relaxed);
  b->next.store(nullptr, std::memory_order_relaxed);
  blocks_.fetch_add(1, std::memory_order_release);
  return b;
}

void SnapshotRing::write_slot(Block* b, std::size_t pos, double t, const void* src) {
  const std::size_t slot = pos % block_slots_;
  std::memcpy(b->data + slot * item_bytes_, src, item_bytes_);
  b->times[slot] = t;
}

void SnapshotRing::read_slot(const Block* b, std::size_t pos, unsigned char* out,
                             double* out_t) const {
  const std::size_t slot = pos % block_slots_;
  if (out != nullptr) std::memcpy(out, b->data + slot * item_bytes_, item_bytes_);
  if (out_t != nullptr) *out_t = b->times[slot];
}

bool SnapshotRing::push(double t, const void* src) {
  Block* tb = tail_block_.load(std::memory_order_relaxed);
  std::size_t tail = tb->tail.load(std::memory_order_relaxed);
  const std::size_t front = tb->front.load(std::memory_order_acquire);
  if (tail - front < block_slots_) {
    write_slot(tb, tail, t, src);
    tb->tail.store(tail + 1, std::memory_order_release);
  } else {
    // The current block is full. Move into the next block of the cycle when the consumer is not
    // in it (then it has been fully read), otherwise link a new block in right after this one.
    Block* next = tb->next.load(std::memory_order_relaxed);
    if (next != front_block_.load(std::memory_order_acquire)) {
      tail = next->tail.load(std::memory_order_relaxed);
      // The consumer is not in `next`, so it left it after reading every sample there: the
      // block must be empty, or this push would overwrite unread samples.
      assert(next->front.load(std::memory_order_acquire) == tail);
      write_slot(next, tail, t, src);
      next->tail.store(tail + 1, std::memory_order_release);
      tail_block_.store(next, std::memory_order_release);
    } else {
      if (blocks_.load(std::memory_order_relaxed) >= max_blocks_) {
        overflow_.fetch_add(1, std::memory_order_release);
        return false;
      }
      Block* fresh;
      try {
        fresh = new_block(false);
      } catch (const std::bad_alloc&) {
        overflow_.fetch_add(1, std::memory_order_release);
        return false;
      }
      write_slot(fresh, 0, t, src);
      fresh->tail.store(1, std::memory_order_relaxed);
      fresh->next.store(next, std::memory_order_relaxed);
      tb->next.store(fresh, std::memory_order_release);
      tail_block_.store(fresh, std::memory_order_release);
    }
  }
  const std::uint64_t pushed = pushed_.fetch_add(1, std::memory_order_acq_rel) + 1;
  const std::size_t occupancy =
      static_cast<std::size_t>(pushed - popped_.load(std::memory_order_acquire));
  if (occupancy > high_water_.load(std::memory_order_relaxed)) {
    high_water_.store(occupancy, std::memory_order_relaxed);
  }
  return true;
}

std::size_t SnapshotRing::pop(void* out, double* out_times, std::size_t max_n) {
  unsigned char* dst = static_cast<unsigned char*>(out);
  std::size_t n = 0;
  Block* fb = front_block_.load(std::memory_order_relaxed);
  while (n < max_n) {
    const std::size_t front = fb->front.load(std::memory_order_relaxed);
    std::size_t tail = fb->tail.load(std::memory_order_acquire);
    if (front == tail) {
      // This block looks empty. Only move on when the producer has left it; re-read the tail
      // after seeing that, since the producer may have filled it up before moving on.
      Block* tb = tail_block_.load(std::memory_order_acquire);
      if (tb == fb) break;
      tail = fb->tail.load(std::memory_order_acquire);
      if (front == tail) {
        fb = fb->next.load(std::memory_order_acquire);
        front_block_.store(fb, std::memory_order_release);
        continue;
      }
    }
    const std::size_t take = std::min(tail - front, max_n - n);
    for (std::size_t i = 0; i < take; ++i) {
      read_slot(fb, front + i, dst == nullptr ? nullptr : dst + (n + i) * item_bytes_,
                out_times == nullptr ? nullptr : out_times + n + i);
    }
    fb->front.store(front + take, std::memory_order_release);
    n += take;
  }
  if (n > 0) popped_.fetch_add(n, std::memory_order_acq_rel);
  return n;
}

std::size_t SnapshotRing::discard(std::size_t max_n) { return pop(nullptr, nullptr, max_n); }

bool SnapshotRing::peek_time(double* t) const {
  Block* fb = front_block_.load(std::memory_order_relaxed);
  for (;;) {
    const std::size_t front = fb->front.load(std::memory_order_relaxed);
    std::size_t tail = fb->tail.load(std::memory_order_acquire);
    if (front != tail) {
      read_slot(fb, front, nullptr, t);
      return true;
    }
    Block* tb = tail_block_.load(std::memory_order_acquire);
    if (tb == fb) return false;
    tail = fb->tail.load(std::memory_order_acquire);
    if (front != tail) {
      read_slot(fb, front, nullptr, t);
      return true;
    }
    fb = fb->next.load(std::memory_order_acquire);
  }
}

std::size_t SnapshotRing::size() const {
  const std::uint64_t popped = popped_.load(std::memory_order_acquire);
  const std::uint64_t pushed = pushed_.load(std::memory_order_acquire);
  return pushed >= popped ? static_cast<std::size_t>(pushed - popped) : 0;
}

}  // namespace eva
