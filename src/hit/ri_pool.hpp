// SPDX-License-Identifier: MIT
#pragma once
// The object pool of return instances (uretprobes). A function-entry hit takes
// one object (in the SIGTRAP handler, or in an optimized site's trampoline);
// the return trampoline gives it back. Both ends are on the hot path, so get()
// and put() are async-signal-safe and reentrant: no malloc, no lock, no
// syscall in the steady state (growth calls mmap, which is; with
// set_grow_on_get(false) an exhausted get() returns nullptr instead, and
// reserve() grows the pool off the hot path: the return-instance pool).
//
// Two designs behind a switch, so that the bench can show the curve of seed 002:
//
//  - RiPoolMode::objpool (seed 002, "after"; the kernel's lib/objpool.c):
//    a per-thread cache of up to kCacheSize objects in initial-exec TLS, backed
//    by per-CPU rings (a bounded MPMC ring per CPU, head and tail in their own
//    cache lines), then by the shared stack below, then by growth. A thread
//    that gets and puts in balance touches only its own cache: no write to a
//    shared cache line. An object may be put on another CPU's ring than the
//    one it came from (threads migrate, objects cross threads); a get on an
//    empty local ring steals from the other CPUs' rings, as objpool_pop() does.
//
//  - RiPoolMode::freelist (seed 002, "before"; the kernel's old freelist.h):
//    one global lock-free LIFO (Treiber stack, 128-bit CAS of pointer + ABA
//    tag). Every get and every put is a CAS on the one shared head.
//
// And the lock of seed 004's "before": RiLockMode::global makes
// bookkeeping_lock()/bookkeeping_unlock() take ONE process-wide spinlock that
// the caller holds around its return-stack push/pop. HAZARD: that spinlock is
// the one lock on this path that a thread can hold when a signal arrives; a
// handler that interrupts the holder and calls bookkeeping_lock() on the same
// thread spins forever. The caller must not re-enter (check
// bookkeeping_held_by_this_thread() first and count a miss; the per-thread
// recursion guard t_state.depth does this for probe hits). RiLockMode::none
// makes both calls no-ops (one predictable branch).
//
// Reentrancy protocol of the per-thread cache: every operation on it first
// sets the cache's `busy` word (a plain store: only the owning thread and its
// signal handlers touch it, and a handler runs to completion before the code
// it interrupted resumes), then re-reads count/objects after a signal fence.
// A handler that finds `busy` set bypasses the cache and goes to the rings /
// stack / growth (or returns nullptr). The rings never block either: a cell
// reserved by an interrupted (or preempted) push reads as "empty" to pops and
// "full" to pushes, which then fall through to the next level. The stack is a
// lock-free CAS loop. Growth is a try-lock: a get that cannot take it retries
// the shared levels a bounded number of times, then returns nullptr.
//
// The link word: the first 8 bytes of every object belong to the pool, free
// or in use. The stack keeps its link there, and a stack_pop() that read the
// head just before another thread popped the same object loads that word
// while the new owner already uses the object (its CAS then fails and the
// value is ignored). The pool reads and writes the word only with atomic
// operations; a user must never write it (ReturnInstance::pool_link reserves
// it), else that stale load races with a plain store (harmless on x86, a data
// race in C++ terms, and ThreadSanitizer reports it).
//
// Memory: objects live in mmap'ed chunks that are unmapped only by ~RiPool;
// rings are one mmap'ed array whose zero-filled pages are a valid empty state,
// so only cells that are used get touched. Everything is plain memory: a fork
// child keeps a working pool (call after_fork_child() in the child to release
// the growth try-lock and the bookkeeping lock if a vanished thread held them;
// objects cached by the parent's other threads are lost to the child).
//
// Per-thread caches are indexed by a pool slot: at most kRiCacheSlots pools
// alive at a time have a cache; further pools work without one (rings only).
// Initial-exec TLS cost: 4 * 256 (caches) + 5 * 56 (counters) + 4 = 1308
// bytes. A thread's cached objects go back to the rings in thread_exit(); a
// thread that exits without calling it leaks up to kCacheSize objects per pool
// (capacity() still counts them) -- this includes a thread on which only a
// signal handler ever used the pool.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace uprobe::detail {

enum class RiPoolMode : std::uint8_t { objpool, freelist };  // seed 002 after / before
enum class RiLockMode : std::uint8_t { none, global };      // seed 004 after / before

/// Per-thread, per-pool operation counters (tests and diagnostics). Only the
/// owning thread writes them, with plain increments: a signal handler that
/// interrupts an increment may lose one count. The moves done by the
/// constructor and set_modes() count for the thread that called them.
struct RiPoolStats {
  std::uint64_t ring_pushes;   ///< objects pushed onto a per-CPU ring
  std::uint64_t ring_pops;     ///< objects popped from a per-CPU ring (own or stolen)
  std::uint64_t stack_pushes;  ///< CASes that pushed onto the global stack (one per object or spliced batch)
  std::uint64_t stack_pops;    ///< objects popped from the global stack
  std::uint64_t grows;         ///< chunks mapped by this thread
  std::uint64_t misses;        ///< get() calls that returned nullptr
};

/// One thread's cache for one pool slot: 256 bytes of initial-exec TLS.
struct RiThreadCache {
  static constexpr std::uint32_t kSize = 30;
  std::uint64_t gen;    ///< generation of the pool the objects belong to (stale -> discarded)
  std::uint32_t count;  ///< objs[0..count) are cached, objs[count-1] is the hottest
  std::uint32_t busy;   ///< nonzero while an operation of this thread is on the cache
  void* objs[kSize];
};
static_assert(sizeof(RiThreadCache) == 256);

struct RiThreadStats {
  std::uint64_t gen;
  RiPoolStats s;
};

inline constexpr unsigned kRiCacheSlots = 4;
extern __thread RiThreadCache t_ri_cache[kRiCacheSlots] __attribute__((tls_model("initial-exec")));
extern __thread RiThreadStats t_ri_stats[kRiCacheSlots + 1] __attribute__((tls_model("initial-exec")));
extern __thread std::uint32_t t_ri_bk_held __attribute__((tls_model("initial-exec")));

#ifdef UPROBE_RI_POOL_TEST_HOOKS
/// Points where a test can run nested get()/put() as a signal handler would.
enum class RiHook : std::uint8_t {
  cache_claimed,       ///< the cache's busy word is set (fast and slow paths)
  ring_push_reserved,  ///< a ring cell is reserved but not yet published
  ring_pop_reserved,   ///< a ring cell is claimed but not yet released
  stack_pop_loaded,    ///< head and head->next read, CAS not yet done
  stack_push_linked,   ///< obj->next written, CAS not yet done
  grow_locked,         ///< growth try-lock held, chunk not yet published
};
extern void (*ri_pool_test_hook)(RiHook) noexcept;
#define UPROBE_RI_HOOK(p)                                                          \
  do {                                                                             \
    if (auto uprobe_ri_hook_ = ::uprobe::detail::ri_pool_test_hook) uprobe_ri_hook_(p); \
  } while (0)
#else
#define UPROBE_RI_HOOK(p) \
  do {                    \
  } while (0)
#endif

class RiPool {
 public:
  static constexpr std::size_t kUnlimited = ~std::size_t{0};
  static constexpr std::uint32_t kCacheSize = RiThreadCache::kSize;
  static constexpr std::uint32_t kBatch = kCacheSize / 2;  ///< refill / flush size of a cache
  static constexpr std::size_t kGrowObjects = 4096;         ///< objects per growth chunk (at most 4 MiB)

  /// object_size bytes (rounded up to a multiple of 64; objects are 64-byte
  /// aligned), initial_capacity objects mapped now and spread over the per-CPU
  /// rings. get() grows the pool by chunks until max_capacity objects.
  /// ring_cells: the cells of each per-CPU ring, as for that many objects (0:
  /// initial_capacity's), for a pool whose objects come later (reserve():
  /// the return-instance pool maps none before a return consumer is attached,
  /// so a process with entry probes only never faults its megabyte in).
  /// Not async-signal-safe (mmap, sysconf); never throws: if the initial
  /// mapping fails the pool starts empty.
  RiPool(std::size_t object_size, std::size_t initial_capacity, std::size_t max_capacity = kUnlimited,
         std::size_t ring_cells = 0) noexcept;
  ~RiPool();
  RiPool(const RiPool&) = delete;
  RiPool& operator=(const RiPool&) = delete;

  /// Switches the designs between runs. Safe under concurrent use: an object
  /// from either mode may go back in either; the shared level is migrated
  /// (rings -> stack for freelist, stack -> rings for objpool) and the calling
  /// thread's cache is flushed when leaving objpool.
  void set_modes(RiPoolMode pool, RiLockMode lock) noexcept;

  /// An object of object_size() bytes, 64-byte aligned; nullptr when the pool
  /// is exhausted and cannot grow now (the caller counts a miss).
  /// Async-signal-safe, reentrant.
  void* get() noexcept;
  /// Gives back an object of this pool (from any thread, in any mode).
  /// Async-signal-safe, reentrant.
  void put(void* obj) noexcept;
  /// Returns the calling thread's cached objects to the rings. Async-signal-safe.
  void thread_exit() noexcept;

  /// Whether get() may grow the pool (mmap) when it finds no object: true by
  /// default; false makes an exhausted pool's get() return nullptr, with no
  /// system call (the return-instance pool: hits never map memory).
  void set_grow_on_get(bool grow) noexcept { grow_on_get_.store(grow, std::memory_order_relaxed); }
  /// Grows the pool by chunks until capacity() >= n (or max_capacity() is
  /// reached, or mmap fails), handing the new objects to the shared level,
  /// spread over the per-CPU rings. Returns capacity(). Not for a hot path
  /// (mmap; spins while another thread grows). Thread-safe.
  std::size_t reserve(std::size_t n) noexcept;

  std::size_t capacity() const noexcept { return capacity_.load(std::memory_order_relaxed); }
  std::size_t max_capacity() const noexcept { return max_capacity_.load(std::memory_order_relaxed); }
  void set_max_capacity(std::size_t n) noexcept { max_capacity_.store(n, std::memory_order_relaxed); }
  std::size_t object_size() const noexcept { return object_size_; }
  std::size_t ring_count() const noexcept { return nrings_; }
  std::size_t ring_capacity() const noexcept { return ring_mask_ + 1; }
  /// Whether obj points at an object of this pool (walks the chunks; not for the hot path).
  bool contains(const void* obj) const noexcept;

  /// Tests / diagnostics: the calling thread's counters for this pool, the
  /// number of objects in its cache, and whether this pool has a cache slot.
  RiPoolStats thread_stats() const noexcept;
  std::uint32_t thread_cached() const noexcept;
  bool has_thread_cache() const noexcept { return slot_ >= 0; }

  /// In a fork child: releases the growth try-lock, and the global bookkeeping
  /// lock unless the calling thread holds it (locks held by threads that do not
  /// exist in the child). Objects cached by those threads are lost.
  void after_fork_child() noexcept;

  /// Seed 004's global lock (see the hazard above). No-ops in RiLockMode::none.
  void bookkeeping_lock() noexcept {
    if (__builtin_expect(lock_mode_.load(std::memory_order_relaxed) == RiLockMode::global, 0))
      bookkeeping_lock_slow();
  }
  /// Releases the lock if this thread took it (whatever the mode is now, so
  /// that a mode switch between lock and unlock is harmless).
  void bookkeeping_unlock() noexcept {
    if (__builtin_expect(__atomic_load_n(&t_ri_bk_held, __ATOMIC_RELAXED) != 0, 0)) bookkeeping_unlock_slow();
  }
  /// True while the calling thread holds (or is spinning for) the bookkeeping
  /// lock: a signal handler must then not call bookkeeping_lock().
  static bool bookkeeping_held_by_this_thread() noexcept {
    return __atomic_load_n(&t_ri_bk_held, __ATOMIC_RELAXED) != 0;
  }

 private:
  struct Ring;
  struct alignas(16) StackHead {
    std::uint64_t ptr;
    std::uint64_t tag;
  };
  struct ChunkHeader;
  enum class GrowResult : std::uint8_t { grown, busy, no_room };

  void* get_slow() noexcept;
  void put_slow(void* obj) noexcept;
  static void bookkeeping_lock_slow() noexcept;
  static void bookkeeping_unlock_slow() noexcept;

  RiThreadCache* claim_cache() noexcept;  // nullptr if no slot or busy
  static void release_cache(RiThreadCache* c) noexcept;
  void flush_cache(RiThreadCache* c, bool to_stack) noexcept;
  RiPoolStats* stats() noexcept;

  Ring* ring(std::size_t i) const noexcept;
  std::size_t current_ring() const noexcept;
  bool ring_push(Ring* r, void* obj) noexcept;
  void* ring_pop(Ring* r) noexcept;

  void* stack_pop() noexcept;
  void stack_push(void* obj) noexcept;
  void stack_push_list(void* first, void* last) noexcept;

  void* shared_pop() noexcept;                                // one object, per mode order
  std::uint32_t shared_pop_batch(void** out, std::uint32_t want) noexcept;
  void shared_push(void* obj) noexcept;
  GrowResult grow(void** out, std::uint32_t want, std::uint32_t* got, bool spread = false) noexcept;
  void distribute(char* first, std::size_t n, bool spread) noexcept;

  // Read-mostly: the only line the steady-state fast path reads.
  alignas(64) std::atomic<RiPoolMode> mode_{RiPoolMode::objpool};
  std::atomic<RiLockMode> lock_mode_{RiLockMode::none};
  int slot_ = -1;          // index in t_ri_cache, -1 = no cache
  std::uint64_t gen_ = 0;  // unique per pool, nonzero
  std::size_t object_size_ = 64;
  char* rings_ = nullptr;
  std::size_t nrings_ = 0;
  std::size_t ring_bytes_ = 0;  // bytes per ring (header + cells)
  std::uint64_t ring_mask_ = 0;
  unsigned ring_shift_ = 0;     // log2(ring capacity)
  std::size_t chunk_objects_ = kGrowObjects;
  std::atomic<std::size_t> max_capacity_{kUnlimited};
  std::atomic<bool> grow_on_get_{true};

  // The freelist head: written by every get/put in freelist mode.
  alignas(64) StackHead head_{0, 0};

  // Growth: written once per chunk.
  alignas(64) std::atomic<std::uint32_t> growing_{0};
  std::atomic<std::size_t> capacity_{0};
  std::atomic<ChunkHeader*> chunks_{nullptr};
};

inline void* RiPool::get() noexcept {
  if (__builtin_expect(mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool && slot_ >= 0, 1)) {
    RiThreadCache& c = t_ri_cache[slot_];
    if (__builtin_expect(__atomic_load_n(&c.busy, __ATOMIC_RELAXED) == 0, 1)) {
      __atomic_store_n(&c.busy, 1u, __ATOMIC_RELAXED);
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      UPROBE_RI_HOOK(RiHook::cache_claimed);
      const std::uint32_t n = __atomic_load_n(&c.count, __ATOMIC_RELAXED);
      if (__builtin_expect(n != 0 && __atomic_load_n(&c.gen, __ATOMIC_RELAXED) == gen_, 1)) {
        void* obj = c.objs[n - 1];
        __atomic_store_n(&c.count, n - 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n(&c.busy, 0u, __ATOMIC_RELAXED);
        return obj;
      }
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      __atomic_store_n(&c.busy, 0u, __ATOMIC_RELAXED);
    }
  }
  return get_slow();
}

inline void RiPool::put(void* obj) noexcept {
  if (__builtin_expect(mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool && slot_ >= 0, 1)) {
    RiThreadCache& c = t_ri_cache[slot_];
    if (__builtin_expect(__atomic_load_n(&c.busy, __ATOMIC_RELAXED) == 0, 1)) {
      __atomic_store_n(&c.busy, 1u, __ATOMIC_RELAXED);
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      UPROBE_RI_HOOK(RiHook::cache_claimed);
      const std::uint32_t n = __atomic_load_n(&c.count, __ATOMIC_RELAXED);
      if (__builtin_expect(n < kCacheSize && __atomic_load_n(&c.gen, __ATOMIC_RELAXED) == gen_, 1)) {
        c.objs[n] = obj;
        __atomic_store_n(&c.count, n + 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n(&c.busy, 0u, __ATOMIC_RELAXED);
        return;
      }
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      __atomic_store_n(&c.busy, 0u, __ATOMIC_RELAXED);
    }
  }
  put_slow(obj);
}

}  // namespace uprobe::detail
