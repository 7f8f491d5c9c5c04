// Thread-sanitizer stress test of the lock-free SnapshotRing (make tsan).
//
// One producer thread pushes numbered samples while one consumer thread pops, discards and
// peeks at random batch sizes. Blocks are tiny (a few slots) so that the producer keeps moving
// into the next block of the cycle and linking fresh ones, the paths where a missing
// acquire/release pair would show; the byte limit is small enough that some pushes are
// refused. Built with -fsanitize=thread and assertions on: TSan reports any data race, the
// ring's own debug assertions check the block hand-over, and this program checks that every
// sample arrives once, in order, intact, and that the refused ones are exactly the counted ones.
#include <cassert>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "ring.hpp"

namespace {

struct Sample {
  std::uint64_t seq;
  std::uint64_t check;  // ~seq: a torn or stale slot shows as a mismatch
  unsigned char fill[48];
};

int fail(const char* what, std::uint64_t a, std::uint64_t b) {
  std::fprintf(stderr, "ring_stress: %s (%" PRIu64 " vs %" PRIu64 ")\n", what, a, b);
  return 1;
}

int run(std::uint64_t total, std::size_t block_slots, std::size_t max_blocks, unsigned seed) {
  eva::SnapshotRing ring(sizeof(Sample), block_slots, 2, max_blocks * block_slots * sizeof(Sample));
  std::vector<std::uint64_t> refused;
  std::thread producer([&] {
    std::mt19937 rng(seed);
    Sample s{};
    for (std::uint64_t i = 0; i < total; ++i) {
      s.seq = i;
      s.check = ~i;
      std::memset(s.fill, static_cast<int>(i & 0xff), sizeof(s.fill));
      if (!ring.push(static_cast<double>(i), &s)) refused.push_back(i);
      if (rng() % 64 == 0) std::this_thread::yield();  // let the consumer catch up, sometimes
    }
  });
  std::uint64_t expected = 0, received = 0, discarded = 0;
  bool producer_done = false;
  std::mt19937 rng(seed + 1);
  std::vector<Sample> out(64);
  std::vector<double> times(64);
  int status = 0;
  while (status == 0) {
    const std::size_t want = 1 + rng() % 64;
    std::size_t n;
    const unsigned action = rng() % 16;
    if (action == 0) {
      n = ring.discard(want);
      discarded += n;
      // discarded samples are not checked; the sequence restarts from the next popped one
      expected = UINT64_MAX;
    } else {
      if (action == 1) {
        double t;
        if (ring.peek_time(&t) && t < 0) status = fail("negative peeked time", 0, 0);
      }
      n = ring.pop(out.data(), times.data(), want);
      for (std::size_t i = 0; i < n && status == 0; ++i) {
        const Sample& s = out[i];
        if (s.check != ~s.seq) status = fail("torn sample", s.seq, ~s.check);
        if (times[i] != static_cast<double>(s.seq)) status = fail("time of sample", s.seq, 0);
        if (expected != UINT64_MAX && s.seq < expected) status = fail("order", s.seq, expected);
        for (unsigned char c : s.fill) {
          if (c != static_cast<unsigned char>(s.seq & 0xff)) status = fail("fill", s.seq, c);
        }
        expected = s.seq + 1;
      }
      received += n;
    }
    if (n == 0) {
      if (producer_done) break;
      producer_done = ring.pushed() + ring.overflow_count() == total;
      std::this_thread::yield();
    }
  }
  producer.join();
  // Drain what is left after the producer finished.
  for (;;) {
    const std::size_t n = ring.pop(out.data(), times.data(), out.size());
    if (n == 0) break;
    received += n;
  }
  if (status != 0) return status;
  if (ring.overflow_count() != refused.size()) {
    return fail("overflow count vs refused pushes", ring.overflow_count(), refused.size());
  }
  if (received + discarded + refused.size() != total) {
    return fail("samples accounted for", received + discarded + refused.size(), total);
  }
  if (ring.size() != 0) return fail("ring not empty at the end", ring.size(), 0);
  std::printf("ring_stress: %" PRIu64 " pushes, block %zu slots: %" PRIu64 " popped, %" PRIu64
              " discarded, %zu refused, %zu slots allocated\n",
              total, block_slots, received, discarded, refused.size(), ring.capacity());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t total = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000;
  int status = 0;
  // tiny blocks (constant block hand-over), a little more room, and a generous limit
  status |= run(total, 1, 4, 1);
  status |= run(total, 3, 8, 2);
  status |= run(total, 16, 1024, 3);
  return status;
}
