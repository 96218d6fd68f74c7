// SPDX-License-Identifier: MIT
#pragma once
// The global reader-writer lock of the locked lookup path: the analog of the
// mmap_lock that seed 000 took off the kernel's uprobe hit path. Readers may
// run in signal context and may nest (a probe hit in a handler), so it is a
// reader-preferring spin lock on one atomic word: a reader waits only while a
// writer holds it, never while a writer merely waits. Writers hold it only
// for the few stores that publish a new snapshot (no syscall, no allocation).

#include <atomic>
#include <cstdint>

#include "arch.hpp"

namespace uprobe::detail {

class SpinRwLock {
 public:
  /// Async-signal-safe; nests.
  void lock_shared() noexcept {
    for (;;) {
      std::uint64_t s = word_.load(std::memory_order_relaxed);
      if (!(s & kWriter) &&
          word_.compare_exchange_weak(s, s + 1, std::memory_order_acquire, std::memory_order_relaxed))
        return;
      arch::cpu_relax();
    }
  }
  void unlock_shared() noexcept { word_.fetch_sub(1, std::memory_order_release); }
  void lock() noexcept {
    for (;;) {
      std::uint64_t expected = 0;
      if (word_.compare_exchange_weak(expected, kWriter, std::memory_order_acquire, std::memory_order_relaxed))
        return;
      arch::cpu_relax();
    }
  }
  void unlock() noexcept { word_.store(0, std::memory_order_release); }
  /// In a fork child: the lock as the one thread there holds it, `readers`
  /// read holds and no writer (the other threads' holds went with them).
  void reset_in_child(std::uint32_t readers) noexcept { word_.store(readers, std::memory_order_relaxed); }

 private:
  static constexpr std::uint64_t kWriter = 1ull << 63;
  alignas(64) std::atomic<std::uint64_t> word_{0};
};

}  // namespace uprobe::detail
