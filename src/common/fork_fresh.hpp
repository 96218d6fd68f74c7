// SPDX-License-Identifier: MIT
#pragma once
// fork_fresh<T>(): a process-wide T (a cache and its lock) that a fork child
// replaces with a fresh one. computed_once(): a process-wide value computed
// at its first use without a lock, which a fork child never waits for.

#include <atomic>
#include <utility>

namespace uprobe::detail {

/// One fork_fresh<T>() instance's slot on the list that the child handler
/// walks (fork_fresh.cpp): constant-initialized, so no guard.
struct ForkFreshNode {
  void (*renew)() noexcept;          ///< empties the slot (in a fork child): the next use makes a new T
  ForkFreshNode* next = nullptr;     ///< the list, newest first (pushed once, never removed)
  std::atomic<int> listed{0};        ///< 0 not yet, 1 being pushed, 2 on the list
};

/// Puts `n` on the list of slots a fork child empties, once; the first call
/// also registers the one pthread_atfork child handler (fork_fresh.cpp
/// registers it at load too). Returns whether `n` is on the list (false
/// while another thread pushes it). Lock-free; thread-safe.
bool fork_fresh_list(ForkFreshNode& n) noexcept;

/// Publishes `mine` in `slot` unless another thread published one first
/// (then deletes `mine`); returns the one published. Lock-free.
template <class T>
T& published_once(std::atomic<T*>& slot, T* mine) {
  T* expected = nullptr;
  if (slot.compare_exchange_strong(expected, mine, std::memory_order_acq_rel, std::memory_order_acquire)) return *mine;
  delete mine;
  return *expected;
}

template <class T>
T& made_once(std::atomic<T*>& slot);

template <class T, class Tag>
struct ForkFreshSlot {
  static inline std::atomic<T*> instance{nullptr};
  static void renew() noexcept { instance.store(nullptr, std::memory_order_relaxed); }
  static inline constinit ForkFreshNode node{&renew};
};

/// The process's one T, made at the first call and never destroyed (probes
/// fire and libraries load during exit, and a destructor's free() would be
/// the traced program's). A fork child makes a new, default-constructed T at
/// its first use (the child handler only empties the slot: no allocation,
/// no libc call of ours in every fork of a traced program) and leaves the
/// old one as it is: a thread that did not come along may have
/// held its lock, or been changing it, when the process forked (symbol
/// resolution and uprobe::plan_site() run beside the registry, whose mutex is
/// held across a fork), and the child's first use would wait forever. No
/// lock of its own either (not a function-local static's guard, which a
/// thread making the first T would hold across a fork): threads that make
/// the first T together each make one, the first published wins; its slot
/// is on the child handler's list before it is published. Thread-safe; the pointer changes
/// only in a fork child, where one thread runs. `Tag` tells apart two uses of one T.
template <class T, class Tag = T>
T& fork_fresh() {
  using Slot = ForkFreshSlot<T, Tag>;
  if (T* t = Slot::instance.load(std::memory_order_acquire)) return *t;
  // (While another thread puts the slot on the list, a T of this call's
  // own, never published: a fork then must not find one the child would
  // not renew. Kept, not freed: the caller may hold on to what it gave.)
  if (!fork_fresh_list(Slot::node)) return *new T;
  return made_once(Slot::instance);
}

/// The T `slot` holds, else a new default-constructed one published there,
/// never destroyed: a process-wide object made at its first use without a
/// static's guard (whose first new may wait while another thread forks:
/// glibc holds malloc's locks across fork(); that fork's child would wait on
/// the guard forever). Threads that get there together each make one, the
/// first published wins. Thread-safe; not async-signal-safe (new).
template <class T>
T& made_once(std::atomic<T*>& slot) {
  if (T* v = slot.load(std::memory_order_acquire)) return *v;
  return published_once(slot, new T);
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
  return published_once(slot, new const T(std::forward<Make>(make)()));
}

}  // namespace uprobe::detail
