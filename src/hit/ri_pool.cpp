// SPDX-License-Identifier: MIT
#include "ri_pool.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cerrno>

#include "arch.hpp"
#include "sanitize.hpp"

namespace uprobe::detail {

__thread RiThreadCache t_ri_cache[kRiCacheSlots] __attribute__((tls_model("initial-exec"))) = {};
// One more than the caches: the last block counts for pools without a slot.
__thread RiThreadStats t_ri_stats[kRiCacheSlots + 1] __attribute__((tls_model("initial-exec"))) = {};
__thread std::uint32_t t_ri_bk_held __attribute__((tls_model("initial-exec"))) = 0;

#ifdef UPROBE_RI_POOL_TEST_HOOKS
void (*ri_pool_test_hook)(RiHook) noexcept = nullptr;
#endif

namespace {

constexpr std::size_t kLine = 64;
constexpr std::size_t kMinRing = 4096;                  // cells per CPU ring, at least (one growth chunk)
constexpr std::size_t kMaxRing = std::size_t{1} << 16;  // and at most (16 bytes each)
constexpr std::size_t kMaxChunkBytes = std::size_t{4} << 20;
constexpr std::size_t kPage = 4096;  // x86-64 (a constant: no sysconf() and no guarded static on the grow path)
constexpr unsigned kGrowRetries = 64;  // shared-level retries while another thread grows

// Seed 004's one process-wide lock, alone in its cache line.
alignas(64) std::atomic<std::uint32_t> g_bk_lock{0};
std::atomic<std::uint64_t> g_next_gen{0};
std::atomic<std::uint32_t> g_slot_mask{0};  // cache slots owned by live pools

inline void bump(std::uint64_t& c) noexcept {
  __atomic_store_n(&c, __atomic_load_n(&c, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

// The free-object link lives in the first word of an object (the stack only;
// rings hold pointers in their cells and never write objects). Always an
// atomic access, and the word is the pool's while the object is in use too
// (see the header): a stack_pop() that loses the race for the head may still
// load the link of an object another thread has just taken.
inline std::uint64_t load_next(void* obj) noexcept {
  return __atomic_load_n(static_cast<std::uint64_t*>(obj), __ATOMIC_RELAXED);
}
inline void store_next(void* obj, std::uint64_t next) noexcept {
  __atomic_store_n(static_cast<std::uint64_t*>(obj), next, __ATOMIC_RELAXED);
}

// 128-bit CAS (pointer + ABA tag). cmpxchg16b is a full barrier. On failure
// `expected` receives the current value (one atomic 16-byte read).
template <class Head>
inline bool cas16(Head* addr, Head& expected, std::uint64_t ptr, std::uint64_t tag) noexcept {
  bool ok;
#if UPROBE_TSAN
  // ThreadSanitizer does not see inline asm: model the CAS as the acq_rel
  // read-modify-write of the head it is (failed ones too: an over-approximation).
  __tsan_release(addr);
#endif
  ok = arch::compare_exchange_16(addr, expected.ptr, expected.tag, ptr, tag);
#if UPROBE_TSAN
  __tsan_acquire(addr);
#endif
  return ok;
}

std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

void* map_anon(std::size_t bytes, bool noreserve) noexcept {
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0), -1, 0);
  return m == MAP_FAILED ? nullptr : m;
}


}  // namespace

// A per-CPU ring: a bounded MPMC ring (Vyukov's, with the "turn" encoding so
// that zero-filled memory is the empty state). Cell i at position p (lap
// p >> shift) is free for the push of lap L when turn == 2L and holds the
// object of lap L when turn == 2L + 1. A push reserves its position with a CAS
// on tail, writes the object, then publishes the turn; a pop likewise on head.
// Nothing ever waits: a cell reserved by an interrupted or preempted operation
// makes pops report "empty" and pushes "full" until it completes.
struct RiPool::Ring {
  alignas(64) std::uint64_t tail;  // next push position
  alignas(64) std::uint64_t head;  // next pop position
  struct Cell {
    std::uint64_t turn;
    std::uint64_t obj;
  };
  Cell* cells() noexcept { return reinterpret_cast<Cell*>(reinterpret_cast<char*>(this) + sizeof(Ring)); }
};

struct RiPool::ChunkHeader {
  ChunkHeader* next;
  std::size_t bytes;
  std::size_t objects;
  char* first() noexcept { return reinterpret_cast<char*>(this) + kLine; }
};

// ---------------------------------------------------------------------------
// Construction

RiPool::RiPool(std::size_t object_size, std::size_t initial_capacity, std::size_t max_capacity,
               std::size_t ring_cells) noexcept {
  object_size_ = round_up(std::max<std::size_t>(object_size, 1), kLine);
  max_capacity_.store(max_capacity, std::memory_order_relaxed);
  gen_ = g_next_gen.fetch_add(1, std::memory_order_relaxed) + 1;
  chunk_objects_ = std::clamp<std::size_t>(kMaxChunkBytes / object_size_, 1, kGrowObjects);

  std::uint32_t mask = g_slot_mask.load(std::memory_order_relaxed);
  for (;;) {
    unsigned s = 0;
    while (s < kRiCacheSlots && (mask & (1u << s))) ++s;
    if (s == kRiCacheSlots) break;  // no cache for this pool: rings only
    if (g_slot_mask.compare_exchange_weak(mask, mask | (1u << s), std::memory_order_acq_rel)) {
      slot_ = static_cast<int>(s);
      break;
    }
  }

  long ncpu = ::get_nprocs_conf();
  std::size_t cells = std::clamp(ring_cells != 0 ? ring_cells : initial_capacity, kMinRing, kMaxRing);
  std::size_t r = kMinRing;
  while (r < cells) r <<= 1;
  ring_shift_ = static_cast<unsigned>(__builtin_ctzll(r));
  ring_mask_ = r - 1;
  ring_bytes_ = sizeof(Ring) + r * sizeof(Ring::Cell);
  const std::size_t want_rings = ncpu > 0 ? static_cast<std::size_t>(ncpu) : 1;
  if (void* m = map_anon(want_rings * ring_bytes_, true)) {
    rings_ = static_cast<char*>(m);
    nrings_ = want_rings;
  }

  if (initial_capacity != 0) {
    const std::size_t bytes = round_up(kLine + initial_capacity * object_size_, kPage);
    if (void* m = map_anon(bytes, false)) {
      auto* h = static_cast<ChunkHeader*>(m);
      h->next = nullptr;
      h->bytes = bytes;
      h->objects = initial_capacity;
      chunks_.store(h, std::memory_order_release);
      capacity_.store(initial_capacity, std::memory_order_relaxed);
      distribute(h->first(), initial_capacity, true);
    }
  }
}

RiPool::~RiPool() {
  for (ChunkHeader* h = chunks_.load(std::memory_order_acquire); h != nullptr;) {
    ChunkHeader* next = h->next;
    ::munmap(h, h->bytes);
    h = next;
  }
  if (rings_ != nullptr) ::munmap(rings_, nrings_ * ring_bytes_);
  // Other threads' caches still carry this pool's generation: the next pool
  // that gets the slot sees a stale generation and discards them.
  if (slot_ >= 0) g_slot_mask.fetch_and(~(1u << slot_), std::memory_order_acq_rel);
}

// ---------------------------------------------------------------------------
// Per-thread cache and counters

RiThreadCache* RiPool::claim_cache() noexcept {
  if (slot_ < 0) return nullptr;
  RiThreadCache* c = &t_ri_cache[slot_];
  if (__atomic_load_n(&c->busy, __ATOMIC_RELAXED) != 0) return nullptr;  // interrupted a cache operation
  __atomic_store_n(&c->busy, 1u, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  UPROBE_RI_HOOK(RiHook::cache_claimed);
  if (__atomic_load_n(&c->gen, __ATOMIC_RELAXED) != gen_) {  // left over from a destroyed pool
    __atomic_store_n(&c->count, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&c->gen, gen_, __ATOMIC_RELAXED);
  }
  return c;
}

void RiPool::release_cache(RiThreadCache* c) noexcept {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&c->busy, 0u, __ATOMIC_RELAXED);
}

RiPoolStats* RiPool::stats() noexcept {
  RiThreadStats& t = t_ri_stats[slot_ >= 0 ? static_cast<unsigned>(slot_) : kRiCacheSlots];
  if (__atomic_load_n(&t.gen, __ATOMIC_RELAXED) != gen_) {
    t.s = RiPoolStats{};
    __atomic_store_n(&t.gen, gen_, __ATOMIC_RELAXED);
  }
  return &t.s;
}

RiPoolStats RiPool::thread_stats() const noexcept {
  const RiThreadStats& t = t_ri_stats[slot_ >= 0 ? static_cast<unsigned>(slot_) : kRiCacheSlots];
  if (__atomic_load_n(&t.gen, __ATOMIC_RELAXED) != gen_) return RiPoolStats{};
  return t.s;
}

std::uint32_t RiPool::thread_cached() const noexcept {
  if (slot_ < 0) return 0;
  const RiThreadCache& c = t_ri_cache[slot_];
  if (__atomic_load_n(&c.gen, __ATOMIC_RELAXED) != gen_) return 0;
  return __atomic_load_n(&c.count, __ATOMIC_RELAXED);
}

// Moves all of a claimed cache to the shared level.
void RiPool::flush_cache(RiThreadCache* c, bool to_stack) noexcept {
  const std::uint32_t n = c->count;
  if (n == 0) return;
  if (to_stack || nrings_ == 0) {
    for (std::uint32_t i = 0; i + 1 < n; ++i) store_next(c->objs[i], reinterpret_cast<std::uint64_t>(c->objs[i + 1]));
    stack_push_list(c->objs[0], c->objs[n - 1]);
  } else {
    Ring* r = ring(current_ring());
    for (std::uint32_t i = 0; i < n; ++i)
      if (!ring_push(r, c->objs[i])) stack_push(c->objs[i]);
  }
  c->count = 0;
}

void RiPool::thread_exit() noexcept {
  if (RiThreadCache* c = claim_cache()) {
    flush_cache(c, mode_.load(std::memory_order_relaxed) == RiPoolMode::freelist);
    release_cache(c);
  }
}

// ---------------------------------------------------------------------------
// Per-CPU rings

RiPool::Ring* RiPool::ring(std::size_t i) const noexcept {
  return reinterpret_cast<Ring*>(rings_ + i * ring_bytes_);
}

std::size_t RiPool::current_ring() const noexcept {
  // glibc reads the rseq area (or calls the vDSO): no syscall.
  const int cpu = ::sched_getcpu();
  std::size_t i = cpu > 0 ? static_cast<std::size_t>(cpu) : 0;
  if (__builtin_expect(i >= nrings_, 0)) i %= nrings_;
  return i;
}

bool RiPool::ring_push(Ring* r, void* obj) noexcept {
  Ring::Cell* cells = r->cells();
  std::uint64_t pos = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);
  for (;;) {
    Ring::Cell& cell = cells[pos & ring_mask_];
    const std::uint64_t turn = __atomic_load_n(&cell.turn, __ATOMIC_ACQUIRE);
    const std::uint64_t want = (pos >> ring_shift_) * 2;
    if (turn == want) {
      if (__atomic_compare_exchange_n(&r->tail, &pos, pos + 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        UPROBE_RI_HOOK(RiHook::ring_push_reserved);
        __atomic_store_n(&cell.obj, reinterpret_cast<std::uint64_t>(obj), __ATOMIC_RELAXED);
        __atomic_store_n(&cell.turn, want + 1, __ATOMIC_RELEASE);
        bump(stats()->ring_pushes);
        return true;
      }
    } else if (static_cast<std::int64_t>(turn - want) < 0) {
      // The cell still holds (or is releasing) the previous lap's object: full.
      const std::uint64_t now = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);
      if (now == pos) return false;
      pos = now;
    } else {
      pos = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);  // another push took pos
    }
  }
}

void* RiPool::ring_pop(Ring* r) noexcept {
  Ring::Cell* cells = r->cells();
  std::uint64_t pos = __atomic_load_n(&r->head, __ATOMIC_RELAXED);
  for (;;) {
    Ring::Cell& cell = cells[pos & ring_mask_];
    const std::uint64_t turn = __atomic_load_n(&cell.turn, __ATOMIC_ACQUIRE);
    const std::uint64_t want = (pos >> ring_shift_) * 2 + 1;
    if (turn == want) {
      if (__atomic_compare_exchange_n(&r->head, &pos, pos + 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        UPROBE_RI_HOOK(RiHook::ring_pop_reserved);
        void* obj = reinterpret_cast<void*>(__atomic_load_n(&cell.obj, __ATOMIC_RELAXED));
        __atomic_store_n(&cell.turn, want + 1, __ATOMIC_RELEASE);
        bump(stats()->ring_pops);
        return obj;
      }
    } else if (static_cast<std::int64_t>(turn - want) < 0) {
      // Not pushed yet (or its push is still in flight): empty.
      const std::uint64_t now = __atomic_load_n(&r->head, __ATOMIC_RELAXED);
      if (now == pos) return nullptr;
      pos = now;
    } else {
      pos = __atomic_load_n(&r->head, __ATOMIC_RELAXED);  // another pop took pos
    }
  }
}

// ---------------------------------------------------------------------------
// The global stack (Treiber, pointer + tag; the tag changes on every update)

void* RiPool::stack_pop() noexcept {
  StackHead cur;
  cur.tag = __atomic_load_n(&head_.tag, __ATOMIC_ACQUIRE);  // tag first: see the header of cas16
  cur.ptr = __atomic_load_n(&head_.ptr, __ATOMIC_ACQUIRE);
  for (;;) {
    if (cur.ptr == 0) return nullptr;
    // The object may already be someone else's (then the CAS fails); its
    // memory stays mapped for the pool's lifetime, so the read is harmless.
    const std::uint64_t next = load_next(reinterpret_cast<void*>(cur.ptr));
    UPROBE_RI_HOOK(RiHook::stack_pop_loaded);
    if (cas16(&head_, cur, next, cur.tag + 1)) {
      bump(stats()->stack_pops);
      return reinterpret_cast<void*>(cur.ptr);
    }
  }
}

void RiPool::stack_push_list(void* first, void* last) noexcept {
  StackHead cur;
  cur.tag = __atomic_load_n(&head_.tag, __ATOMIC_ACQUIRE);
  cur.ptr = __atomic_load_n(&head_.ptr, __ATOMIC_ACQUIRE);
  for (;;) {
    store_next(last, cur.ptr);
    UPROBE_RI_HOOK(RiHook::stack_push_linked);
    if (cas16(&head_, cur, reinterpret_cast<std::uint64_t>(first), cur.tag + 1)) {
      bump(stats()->stack_pushes);
      return;
    }
  }
}

void RiPool::stack_push(void* obj) noexcept { stack_push_list(obj, obj); }

// ---------------------------------------------------------------------------
// Shared level

void* RiPool::shared_pop() noexcept {
  const bool objpool = mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool;
  if (!objpool)
    if (void* obj = stack_pop()) return obj;
  if (nrings_ != 0) {
    const std::size_t start = current_ring();
    for (std::size_t k = 0; k < nrings_; ++k) {
      std::size_t i = start + k;
      if (i >= nrings_) i -= nrings_;
      if (void* obj = ring_pop(ring(i))) return obj;
    }
  }
  return objpool ? stack_pop() : nullptr;
}

std::uint32_t RiPool::shared_pop_batch(void** out, std::uint32_t want) noexcept {
  std::uint32_t got = 0;
  if (nrings_ != 0) {
    const std::size_t start = current_ring();
    for (std::size_t k = 0; k < nrings_ && got == 0; ++k) {  // own CPU first, then steal
      std::size_t i = start + k;
      if (i >= nrings_) i -= nrings_;
      Ring* r = ring(i);
      while (got < want) {
        void* obj = ring_pop(r);
        if (obj == nullptr) break;
        out[got++] = obj;
      }
    }
  }
  while (got < want) {
    void* obj = stack_pop();
    if (obj == nullptr) break;
    out[got++] = obj;
  }
  return got;
}

void RiPool::shared_push(void* obj) noexcept {
  if (mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool && nrings_ != 0 &&
      ring_push(ring(current_ring()), obj))
    return;
  stack_push(obj);
}

// Hands n fresh objects at `first` to the shared level: the rings (objpool
// mode; spread over all CPUs or on the current one) with the overflow, or all
// of them (freelist mode), spliced onto the stack with one CAS.
void RiPool::distribute(char* first, std::size_t n, bool spread) noexcept {
  std::size_t i = 0;
  if (mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool && nrings_ != 0) {
    if (spread) {
      for (std::size_t k = 0; k < nrings_; ++k) {  // an even share per CPU, as objpool_init_percpu_slots()
        const std::size_t end = n * (k + 1) / nrings_;
        Ring* r = ring(k);
        std::size_t j = i;
        while (j < end && ring_push(r, first + j * object_size_)) ++j;
        for (; j < end; ++j) stack_push(first + j * object_size_);  // ring full
        i = end;
      }
    } else {
      Ring* r = ring(current_ring());
      while (i < n && ring_push(r, first + i * object_size_)) ++i;
    }
  }
  if (i == n) return;
  for (std::size_t j = i; j + 1 < n; ++j)
    store_next(first + j * object_size_, reinterpret_cast<std::uint64_t>(first + (j + 1) * object_size_));
  stack_push_list(first + i * object_size_, first + (n - 1) * object_size_);
}

RiPool::GrowResult RiPool::grow(void** out, std::uint32_t want, std::uint32_t* got, bool spread) noexcept {
  if (growing_.exchange(1, std::memory_order_acquire) != 0) return GrowResult::busy;
  UPROBE_RI_HOOK(RiHook::grow_locked);
  const std::size_t cap = capacity_.load(std::memory_order_relaxed);
  const std::size_t max = max_capacity_.load(std::memory_order_relaxed);
  if (cap >= max) {
    growing_.store(0, std::memory_order_release);
    return GrowResult::no_room;
  }
  const std::size_t n = std::min(chunk_objects_, max - cap);
  const std::size_t bytes = round_up(kLine + n * object_size_, kPage);
  const int saved_errno = errno;  // we may be in a signal handler
  void* m = map_anon(bytes, false);  // mmap: async-signal-safe
  errno = saved_errno;
  if (m == nullptr) {
    growing_.store(0, std::memory_order_release);
    return GrowResult::no_room;
  }
  auto* h = static_cast<ChunkHeader*>(m);
  h->bytes = bytes;
  h->objects = n;
  h->next = chunks_.load(std::memory_order_relaxed);  // only the grower writes chunks_
  chunks_.store(h, std::memory_order_release);
  capacity_.store(cap + n, std::memory_order_relaxed);
  growing_.store(0, std::memory_order_release);
  bump(stats()->grows);

  const std::size_t give = std::min<std::size_t>(want, n);
  for (std::size_t i = 0; i < give; ++i) out[i] = h->first() + i * object_size_;
  distribute(h->first() + give * object_size_, n - give, spread);
  *got = static_cast<std::uint32_t>(give);
  return GrowResult::grown;
}

std::size_t RiPool::reserve(std::size_t n) noexcept {
  while (capacity_.load(std::memory_order_relaxed) < n) {
    std::uint32_t got = 0;
    const GrowResult r = grow(nullptr, 0, &got, true);
    if (r == GrowResult::no_room) break;
    if (r == GrowResult::busy) arch::cpu_relax();
  }
  return capacity_.load(std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------
// get / put slow paths

void* RiPool::get_slow() noexcept {
  const bool objpool = mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool;
  RiThreadCache* c = objpool ? claim_cache() : nullptr;  // nullptr: no slot, or we interrupted it
  void* obj = nullptr;
  for (unsigned attempt = 0;; ++attempt) {
    if (c != nullptr) {
      std::uint32_t n = c->count;
      if (n == 0) n = shared_pop_batch(c->objs, kBatch);
      if (n != 0) {
        obj = c->objs[n - 1];
        c->count = n - 1;
        break;
      }
    } else {
      if ((obj = shared_pop()) != nullptr) break;
      if (!objpool) {  // freelist: before growing, use what this thread cached in objpool mode
        if (RiThreadCache* own = claim_cache()) {
          if (own->count != 0) obj = own->objs[--own->count];
          release_cache(own);
          if (obj != nullptr) break;
        }
      }
    }
    std::uint32_t got = 0;
    if (!grow_on_get_.load(std::memory_order_relaxed)) break;
    const GrowResult r = grow(c != nullptr ? c->objs : &obj, c != nullptr ? kBatch : 1, &got);
    if (r == GrowResult::grown) {
      if (c != nullptr) {
        obj = c->objs[got - 1];
        c->count = got - 1;
      }
      break;
    }
    if (r == GrowResult::no_room || attempt >= kGrowRetries) break;
    arch::cpu_relax();  // another thread (or the code we interrupted) is growing
  }
  if (c != nullptr) release_cache(c);
  if (obj == nullptr) bump(stats()->misses);
  return obj;
}

void RiPool::put_slow(void* obj) noexcept {
  if (mode_.load(std::memory_order_relaxed) == RiPoolMode::objpool) {
    if (RiThreadCache* c = claim_cache()) {
      if (c->count >= kCacheSize) {  // full: the coldest half goes to this CPU's ring
        if (nrings_ != 0) {
          Ring* r = ring(current_ring());
          for (std::uint32_t i = 0; i < kBatch; ++i)
            if (!ring_push(r, c->objs[i])) stack_push(c->objs[i]);
        } else {
          for (std::uint32_t i = 0; i < kBatch; ++i) stack_push(c->objs[i]);
        }
        for (std::uint32_t i = kBatch; i < c->count; ++i) c->objs[i - kBatch] = c->objs[i];
        c->count -= kBatch;
      }
      c->objs[c->count++] = obj;
      release_cache(c);
      return;
    }
  }
  shared_push(obj);
}

// ---------------------------------------------------------------------------
// Modes, fork, lock

void RiPool::set_modes(RiPoolMode pool, RiLockMode lock) noexcept {
  lock_mode_.store(lock, std::memory_order_relaxed);
  const RiPoolMode old = mode_.exchange(pool, std::memory_order_acq_rel);
  if (old == pool) return;
  if (pool == RiPoolMode::freelist) {
    // Everything shared goes onto the stack, so that freelist runs start from it.
    if (RiThreadCache* c = claim_cache()) {
      flush_cache(c, true);
      release_cache(c);
    }
    for (std::size_t k = 0; k < nrings_; ++k) {
      void* first = nullptr;
      void* last = nullptr;
      while (void* obj = ring_pop(ring(k))) {
        store_next(obj, reinterpret_cast<std::uint64_t>(first));
        first = obj;
        if (last == nullptr) last = obj;
      }
      if (first != nullptr) stack_push_list(first, last);
    }
  } else if (nrings_ != 0) {
    // Take the whole stack with one CAS and spread it over the rings.
    StackHead cur;
    cur.tag = __atomic_load_n(&head_.tag, __ATOMIC_ACQUIRE);
    cur.ptr = __atomic_load_n(&head_.ptr, __ATOMIC_ACQUIRE);
    while (cur.ptr != 0 && !cas16(&head_, cur, 0, cur.tag + 1)) {
    }
    std::uint64_t p = cur.ptr;
    for (std::size_t k = 0; p != 0; ++k) {
      void* obj = reinterpret_cast<void*>(p);
      const std::uint64_t next = load_next(obj);
      if (!ring_push(ring(k % nrings_), obj)) {  // rings full: the rest goes back
        void* last = obj;
        while (load_next(last) != 0) last = reinterpret_cast<void*>(load_next(last));
        stack_push_list(obj, last);
        break;
      }
      p = next;
    }
  }
}

void RiPool::after_fork_child() noexcept {
  growing_.store(0, std::memory_order_release);
  if (__atomic_load_n(&t_ri_bk_held, __ATOMIC_RELAXED) == 0) g_bk_lock.store(0, std::memory_order_release);
}

bool RiPool::contains(const void* obj) const noexcept {
  const char* p = static_cast<const char*>(obj);
  for (ChunkHeader* h = chunks_.load(std::memory_order_acquire); h != nullptr; h = h->next) {
    const char* first = h->first();
    if (p >= first && p < first + h->objects * object_size_)
      return static_cast<std::size_t>(p - first) % object_size_ == 0;
  }
  return false;
}

void RiPool::bookkeeping_lock_slow() noexcept {
  // Mark first: a handler that interrupts the spin or the critical section
  // sees the mark (bookkeeping_held_by_this_thread()) and must not lock.
  __atomic_store_n(&t_ri_bk_held, 1u, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  for (;;) {
    if (g_bk_lock.exchange(1, std::memory_order_acquire) == 0) return;
    while (g_bk_lock.load(std::memory_order_relaxed) != 0) arch::cpu_relax();
  }
}

void RiPool::bookkeeping_unlock_slow() noexcept {
  g_bk_lock.store(0, std::memory_order_release);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&t_ri_bk_held, 0u, __ATOMIC_RELAXED);
}

}  // namespace uprobe::detail
