// SPDX-License-Identifier: MIT
#pragma once
// fork_fresh<T>(): a process-wide T (a cache and its lock) that a fork child
// replaces with a fresh one. computed_once(): a process-wide value computed
// at its first use without a lock, which a fork child never waits for.

#include <pthread.h>

#include <atomic>
#include <utility>

namespace uprobe::detail {

/// The process's one T, made at the first call and never destroyed (probes
/// fire and libraries load during exit, and a destructor's free() would be
/// the traced program's). A fork child gets a new, default-constructed T and
/// leaves the old one as it is: a thread that did not come along may have
/// held its lock, or been changing it, when the process forked (symbol
/// resolution and uprobe::plan_site() run beside the registry, whose mutex is
/// held across a fork), and the child's first use would wait forever.
/// Thread-safe (the first call's static initialization); the pointer changes
/// only in a fork child, where one thread runs. `Tag` tells apart two uses of one T.
template <class T, class Tag = T>
T& fork_fresh() {
  static T* instance = [] {
    ::pthread_atfork(nullptr, nullptr, [] { instance = new T; });
    return new T;
  }();
  return *instance;
}

/// The value `slot` holds, else `make()`'s, kept there for the process's
/// life (never destroyed: probes fire during exit). Not a function-local
/// static's guarded initialization: that is a lock, which a thread computing
/// it holds while it reads files and maps, and a fork child whose other
/// thread was there would wait on it forever. Here no lock is held: threads
/// that get there together each compute (the same value: `make` depends only
/// on the process), the first to publish wins, the others' are deleted.
/// Thread-safe; not async-signal-safe (new).
template <class T, class Make>
const T& computed_once(std::atomic<const T*>& slot, Make&& make) {
  if (const T* v = slot.load(std::memory_order_acquire)) return *v;
  const T* mine = new const T(std::forward<Make>(make)());
  const T* expected = nullptr;
  if (slot.compare_exchange_strong(expected, mine, std::memory_order_acq_rel, std::memory_order_acquire)) return *mine;
  delete mine;
  return *expected;
}

}  // namespace uprobe::detail
