// SPDX-License-Identifier: MIT
#pragma once
// ForkHeldMutex: a mutex held across fork() by pthread_atfork handlers,
// which does not make a thread that forks while holding it wait for itself.

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace uprobe::detail {

/// A std::mutex (BasicLockable: std::lock_guard<ForkHeldMutex> and
/// std::unique_lock work) that knows the thread holding it, for the
/// pthread_atfork handlers that hold it across a fork() so that the child
/// never finds it held by a thread it does not have (registry, C API). A
/// fork() from the thread that holds it, a consumer's handler run on a probe
/// hit inside the locked section (malloc() called there), must not wait for
/// itself: fork_prepare() then leaves it as it is, that thread goes on with
/// its section in parent and child alike, and fork_parent()/fork_child()
/// give back only what fork_prepare() took. Not async-signal-safe (a mutex),
/// but fork_*() are called only by fork().
class ForkHeldMutex {
 public:
  void lock() {
    m_.lock();
    owner_.store(::pthread_self(), std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!m_.try_lock()) return false;
    owner_.store(::pthread_self(), std::memory_order_relaxed);
    return true;
  }
  void unlock() {
    owner_.store(pthread_t{}, std::memory_order_relaxed);
    m_.unlock();
  }
  /// Whether the calling thread holds it (only that thread stores its own id).
  bool held_by_this_thread() const noexcept {
    return ::pthread_equal(owner_.load(std::memory_order_relaxed), ::pthread_self()) != 0;
  }

  /// pthread_atfork's prepare: takes it, unless this thread holds it already.
  void fork_prepare() {
    if (held_by_this_thread()) {
      fork_skipped_by_.store(::pthread_self(), std::memory_order_relaxed);
      return;
    }
    lock();
  }
  /// pthread_atfork's parent and child: gives back what fork_prepare() took.
  void fork_after() {
    if (::pthread_equal(fork_skipped_by_.load(std::memory_order_relaxed), ::pthread_self())) {
      fork_skipped_by_.store(pthread_t{}, std::memory_order_relaxed);
      return;
    }
    unlock();
  }

 private:
  std::mutex m_;
  std::atomic<pthread_t> owner_{};
  std::atomic<pthread_t> fork_skipped_by_{};  // the forking thread that held it, between prepare and after
};

}  // namespace uprobe::detail
