// SPDX-License-Identifier: MIT
// Per-producer hit counters: each in its own cache line, written only by its
// thread (the producer loop, or a handler running on that thread), summed by
// the sampling thread.

#include "bench.hpp"

namespace bench {

Counter counters[max_producers];
constinit thread_local Counter* my_counter = nullptr;

// The stop flag is read on every iteration by every producer and written once:
// keep it out of the counters' lines.
alignas(64) std::atomic<bool> stop_flag{false};

std::uint64_t sum_counters(int producers) noexcept {
  std::uint64_t sum = 0;
  for (int i = 0; i < producers; ++i) sum += counters[i].value.load(std::memory_order_relaxed);
  return sum;
}

namespace {
FILE* g_text_out = nullptr;
}

FILE* text_out() noexcept { return g_text_out ? g_text_out : stdout; }
void set_text_out(FILE* f) noexcept { g_text_out = f; }

}  // namespace bench
