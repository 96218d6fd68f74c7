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
  /// Takes a read hold; returns the epoch it belongs to, for unlock_shared().
  /// Async-signal-safe; nests.
  std::uint64_t lock_shared() noexcept {
    for (;;) {
      std::uint64_t s = word_.load(std::memory_order_relaxed);
      if (!(s & kWriter) &&
          word_.compare_exchange_weak(s, s + 1, std::memory_order_acquire, std::memory_order_relaxed))
        return s & kEpochs;
      arch::cpu_relax();
    }
  }
  /// Gives back a read hold of `epoch` (lock_shared()'s): none when the lock
  /// was reset since (a fork child: reset_in_child()). Async-signal-safe.
  void unlock_shared(std::uint64_t epoch) noexcept {
    std::uint64_t s = word_.load(std::memory_order_relaxed);
    while ((s & kEpochs) == epoch &&
           !word_.compare_exchange_weak(s, s - 1, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }
  void lock() noexcept {
    for (;;) {
      std::uint64_t s = word_.load(std::memory_order_relaxed);
      if (!(s & ~kEpochs) &&
          word_.compare_exchange_weak(s, s | kWriter, std::memory_order_acquire, std::memory_order_relaxed))
        return;
      arch::cpu_relax();
    }
  }
  void unlock() noexcept { word_.fetch_and(~kWriter, std::memory_order_release); }
  /// In a fork child (one thread): free, in a new epoch. The holds taken
  /// before belonged to threads that did not come along, or to this thread
  /// (a signal handler that forked interrupted its lookup), whose
  /// unlock_shared() of the old epoch then gives back nothing.
  void reset_in_child() noexcept {
    word_.store(((word_.load(std::memory_order_relaxed) & kEpochs) + kEpochOne) & kEpochs, std::memory_order_relaxed);
  }

 private:
  static constexpr std::uint64_t kWriter = 1ull << 63;
  static constexpr std::uint64_t kEpochOne = 1ull << 32;  ///< bits 32-62: the epoch; 0-31: the read holds
  static constexpr std::uint64_t kEpochs = kWriter - kEpochOne;
  alignas(64) std::atomic<std::uint64_t> word_{0};
};

}  // namespace uprobe::detail
