// SPDX-License-Identifier: MIT
// Single-thread behaviour of the return-instance pool: sizes, alignment,
// exhaustion and growth, the cache / ring / stack traffic of each mode (exact
// counts), thread_exit(), mode switches, pool slots; and deterministic
// reentrancy: a test hook runs nested get()/put() at each point where a signal
// handler could interrupt the pool.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "pool_common.hpp"

using namespace pooltest;
using uprobe::detail::RiHook;
using uprobe::detail::RiPoolStats;

namespace {

class PoolMode : public ::testing::TestWithParam<RiPoolMode> {};
INSTANTIATE_TEST_SUITE_P(Modes, PoolMode, ::testing::Values(RiPoolMode::objpool, RiPoolMode::freelist),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

TEST(Pool, ObjectSizeRoundsUpTo64) {
  EXPECT_EQ(RiPool(1, 1).object_size(), 64u);
  EXPECT_EQ(RiPool(40, 1).object_size(), 64u);
  EXPECT_EQ(RiPool(64, 1).object_size(), 64u);
  EXPECT_EQ(RiPool(128, 1).object_size(), 128u);
  EXPECT_EQ(RiPool(200, 1).object_size(), 256u);
}

TEST(Pool, RingsCoverEveryCpuAndAGrowthChunk) {
  RiPool p(64, 10);
  EXPECT_GE(p.ring_count(), static_cast<std::size_t>(std::thread::hardware_concurrency()));
  EXPECT_EQ(p.ring_capacity(), 4096u);
  EXPECT_EQ(RiPool(64, 5000).ring_capacity(), 8192u);
  EXPECT_EQ(RiPool(64, 1u << 20).ring_capacity(), 65536u);
}

TEST_P(PoolMode, GetAllCapacityThenExhaustedThenGrowth) {
  RiPool p(192, 1000, 1000);
  p.set_modes(GetParam(), RiLockMode::none);
  EXPECT_EQ(p.object_size(), 192u);
  EXPECT_EQ(p.capacity(), 1000u);

  std::vector<void*> got;
  for (int i = 0; i < 1000; ++i) {
    void* obj = p.get();
    ASSERT_NE(obj, nullptr) << "at " << i;
    std::fill_n(static_cast<char*>(obj), 192, static_cast<char>(i));  // the whole object is ours
    got.push_back(obj);
  }
  for (void* obj : got) words(obj)[1] = 0;
  EXPECT_EQ(check_objects(p, got), "");
  const std::uint64_t misses0 = p.thread_stats().misses;
  EXPECT_EQ(p.get(), nullptr);  // exhausted, cannot grow
  EXPECT_EQ(p.get(), nullptr);
  EXPECT_EQ(p.thread_stats().misses, misses0 + 2);
  EXPECT_EQ(p.thread_stats().grows, 0u);
  EXPECT_EQ(p.capacity(), 1000u);

  p.set_max_capacity(1010);  // growth is capped by the maximum
  void* more = p.get();
  ASSERT_NE(more, nullptr);
  EXPECT_EQ(p.capacity(), 1010u);
  EXPECT_EQ(p.thread_stats().grows, 1u);
  got.push_back(more);
  for (int i = 0; i < 9; ++i) {
    void* obj = p.get();
    ASSERT_NE(obj, nullptr);
    got.push_back(obj);
  }
  EXPECT_EQ(p.get(), nullptr);

  p.set_max_capacity(RiPool::kUnlimited);  // a full chunk of 4096
  void* chunk_obj = p.get();
  ASSERT_NE(chunk_obj, nullptr);
  EXPECT_EQ(p.capacity(), 1010u + 4096u);
  EXPECT_EQ(p.thread_stats().grows, 2u);
  got.push_back(chunk_obj);
  for (void* obj : got) words(obj)[1] = 0;
  EXPECT_EQ(check_objects(p, got), "");

  for (void* obj : got) p.put(obj);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 5106u) << why;
  EXPECT_EQ(p.capacity(), 5106u);
}

TEST_P(PoolMode, EmptyPoolGrowsOnFirstGet) {
  RiPool p(64, 0);
  p.set_modes(GetParam(), RiLockMode::none);
  EXPECT_EQ(p.capacity(), 0u);
  void* obj = p.get();
  ASSERT_NE(obj, nullptr);
  EXPECT_EQ(p.capacity(), 4096u);
  p.put(obj);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 4096u) << why;
}

// set_grow_on_get(false): an exhausted get() returns nullptr and maps
// nothing (the return-instance pool on the hit path); reserve() grows it by
// whole chunks, off the hot path, and the objects it adds are all there.
TEST_P(PoolMode, NoGrowthOnGetThenReserve) {
  RiPool p(128, 100);
  p.set_modes(GetParam(), RiLockMode::none);
  p.set_grow_on_get(false);
  std::vector<void*> got;
  for (int i = 0; i < 100; ++i) {
    void* obj = p.get();
    ASSERT_NE(obj, nullptr) << "at " << i;
    got.push_back(obj);
  }
  const std::uint64_t misses0 = p.thread_stats().misses;
  EXPECT_EQ(p.get(), nullptr);
  EXPECT_EQ(p.thread_stats().misses, misses0 + 1);
  EXPECT_EQ(p.thread_stats().grows, 0u);
  EXPECT_EQ(p.capacity(), 100u);
  EXPECT_EQ(p.reserve(50), 100u) << "already that big: nothing mapped";
  EXPECT_EQ(p.thread_stats().grows, 0u);
  EXPECT_EQ(p.reserve(5000), 100u + 2 * 4096u) << "two chunks of 4096";
  EXPECT_EQ(p.thread_stats().grows, 2u);
  for (int i = 0; i < 2 * 4096; ++i) {
    void* obj = p.get();
    ASSERT_NE(obj, nullptr) << "reserved object " << i;
    got.push_back(obj);
  }
  EXPECT_EQ(p.get(), nullptr);
  EXPECT_EQ(p.thread_stats().grows, 2u) << "get() never grew it";
  for (void* obj : got) words(obj)[1] = 0;
  EXPECT_EQ(check_objects(p, got), "");
  for (void* obj : got) p.put(obj);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 100u + 2 * 4096u) << why;
}

TEST(Pool, GrowthChunkIsAtMost4MiB) {
  RiPool p(64 * 1024, 0);  // 64 KiB objects: 64 per chunk
  void* obj = p.get();
  ASSERT_NE(obj, nullptr);
  EXPECT_EQ(p.capacity(), 64u);
  p.put(obj);
}

// objpool: a thread that gets and puts in balance touches only its cache.
TEST(Pool, ObjpoolBalancedLoopTouchesNoSharedLevel) {
  RiPool p(128, 1024);
  ASSERT_TRUE(p.has_thread_cache());
  const RiPoolStats b = p.thread_stats();
  EXPECT_EQ(b.ring_pushes, 1024u);  // the constructor spread the objects over the rings
  EXPECT_EQ(b.ring_pops, 0u);
  void* first = p.get();  // first get: one refill of kBatch from the rings
  ASSERT_NE(first, nullptr);
  p.put(first);
  const RiPoolStats s0 = p.thread_stats();
  EXPECT_EQ(s0.ring_pops, RiPool::kBatch);
  EXPECT_EQ(s0.ring_pushes, 1024u);
  EXPECT_EQ(s0.stack_pops + s0.stack_pushes + s0.grows + s0.misses, 0u);

  for (int i = 0; i < 1000000; ++i) {
    void* obj = p.get();
    words(obj)[2] = static_cast<std::uint64_t>(i);
    p.put(obj);
  }
  // Nested gets up to the cache's slack (a return stack of depth 14) too.
  void* held[RiPool::kBatch - 1];
  for (int round = 0; round < 100000; ++round) {
    for (void*& obj : held) obj = p.get();
    for (void* obj : held) p.put(obj);
  }
  const RiPoolStats s1 = p.thread_stats();
  EXPECT_EQ(s1.ring_pops, s0.ring_pops);
  EXPECT_EQ(s1.ring_pushes, s0.ring_pushes);
  EXPECT_EQ(s1.stack_pops, 0u);
  EXPECT_EQ(s1.stack_pushes, 0u);
  EXPECT_EQ(s1.grows, 0u);
  EXPECT_EQ(s1.misses, 0u);
  EXPECT_EQ(p.thread_cached(), RiPool::kBatch);
}

// freelist: the same loop is one CAS on the shared head per get and per put.
TEST(Pool, FreelistEveryGetAndPutIsAStackCas) {
  RiPool p(128, 1024);
  p.set_modes(RiPoolMode::freelist, RiLockMode::none);
  const RiPoolStats s0 = p.thread_stats();
  for (int i = 0; i < 100000; ++i) p.put(p.get());
  const RiPoolStats s1 = p.thread_stats();
  EXPECT_EQ(s1.stack_pops - s0.stack_pops, 100000u);
  EXPECT_EQ(s1.stack_pushes - s0.stack_pushes, 100000u);
  EXPECT_EQ(s1.ring_pops, s0.ring_pops);
  EXPECT_EQ(s1.ring_pushes, s0.ring_pushes);
  EXPECT_EQ(p.thread_cached(), 0u);
}

// Cache refills and flushes move kBatch objects at a time, exactly.
TEST(Pool, ObjpoolCacheRefillAndFlushCounts) {
  RiPool p(128, 1024);
  const RiPoolStats b = p.thread_stats();
  std::vector<void*> held;
  for (int i = 0; i < 100; ++i) held.push_back(p.get());
  RiPoolStats s = p.thread_stats();
  EXPECT_EQ(s.ring_pops - b.ring_pops, 105u);  // 7 refills of 15
  EXPECT_EQ(p.thread_cached(), 5u);
  for (void* obj : held) p.put(obj);
  s = p.thread_stats();
  EXPECT_EQ(s.ring_pushes - b.ring_pushes, 75u);  // 5 flushes of the coldest 15
  EXPECT_EQ(p.thread_cached(), 30u);
  EXPECT_EQ(s.stack_pops + s.stack_pushes, 0u);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 1024u) << why;
}

TEST(Pool, ThreadExitReturnsTheCache) {
  RiPool p(128, 1024);
  std::atomic<int> phase{0};
  std::size_t cached_by_t = 0;
  RiPoolStats t_stats{};
  std::thread t([&] {
    std::vector<void*> held;
    for (int i = 0; i < 20; ++i) held.push_back(p.get());
    for (void* obj : held) p.put(obj);
    cached_by_t = p.thread_cached();
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    p.thread_exit();
    t_stats = p.thread_stats();
    cached_by_t = p.thread_cached();
  });
  while (phase.load() != 1) std::this_thread::yield();
  EXPECT_EQ(cached_by_t, 30u);  // 2 refills of 15, all 20 put back
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 1024u - 30u) << why;
  phase = 2;
  t.join();
  EXPECT_EQ(cached_by_t, 0u);
  EXPECT_EQ(t_stats.ring_pushes, 30u);
  EXPECT_EQ(drain_check_refill(p, &why), 1024u) << why;
}

TEST(Pool, CrossThreadPut) {
  for (RiPoolMode mode : {RiPoolMode::objpool, RiPoolMode::freelist}) {
    RiPool p(64, 2000);
    p.set_modes(mode, RiLockMode::none);
    std::vector<void*> objs;
    std::thread a([&] {
      for (int i = 0; i < 1500; ++i) objs.push_back(p.get());
      p.thread_exit();
    });
    a.join();
    for (void* obj : objs) ASSERT_EQ(claim(obj, 0xA), 0u);
    std::thread b([&] {
      for (void* obj : objs) {
        release(obj);
        p.put(obj);
      }
      p.thread_exit();
    });
    b.join();
    std::string why;
    EXPECT_EQ(drain_check_refill(p, &why), 2000u) << mode_name(mode) << ": " << why;
  }
}

TEST(Pool, ModeSwitchKeepsEveryObject) {
  RiPool p(64, 3000);
  std::vector<void*> a, b;
  for (int i = 0; i < 500; ++i) a.push_back(p.get());
  p.set_modes(RiPoolMode::freelist, RiLockMode::none);
  EXPECT_EQ(p.thread_cached(), 0u);  // flushed when leaving objpool
  for (int i = 0; i < 250; ++i) p.put(a[i]);
  for (int i = 0; i < 700; ++i) b.push_back(p.get());
  p.set_modes(RiPoolMode::objpool, RiLockMode::global);
  for (int i = 250; i < 500; ++i) p.put(a[i]);
  for (int i = 0; i < 300; ++i) p.put(b[i]);
  p.set_modes(RiPoolMode::freelist, RiLockMode::none);
  for (int i = 300; i < 700; ++i) p.put(b[i]);
  p.set_modes(RiPoolMode::objpool, RiLockMode::none);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 3000u) << why;
  p.set_modes(RiPoolMode::freelist, RiLockMode::none);
  EXPECT_EQ(drain_check_refill(p, &why), 3000u) << why;
  EXPECT_EQ(p.capacity(), 3000u);
}

TEST(Pool, MorePoolsThanCacheSlotsStillWork) {
  std::vector<std::unique_ptr<RiPool>> pools;
  for (int i = 0; i < 6; ++i) pools.push_back(std::make_unique<RiPool>(64 * (i + 1), 100));
  for (unsigned i = 0; i < 6; ++i) EXPECT_EQ(pools[i]->has_thread_cache(), i < uprobe::detail::kRiCacheSlots);
  for (int round = 0; round < 3; ++round)
    for (auto& p : pools) {
      std::vector<void*> held;
      for (int i = 0; i < 60; ++i) held.push_back(p->get());
      for (void* obj : held) p->put(obj);
    }
  for (auto& p : pools) {
    std::string why;
    EXPECT_EQ(drain_check_refill(*p, &why), 100u) << why;
  }
}

TEST(Pool, StaleCacheOfADestroyedPoolIsDiscarded) {
  auto a = std::make_unique<RiPool>(64, 100);
  for (int i = 0; i < 5; ++i) a->put(a->get());
  EXPECT_GT(a->thread_cached(), 0u);
  a.reset();
  RiPool b(64, 100);  // takes the freed slot
  ASSERT_TRUE(b.has_thread_cache());
  EXPECT_EQ(b.thread_cached(), 0u);
  void* obj = b.get();
  EXPECT_TRUE(b.contains(obj));
  b.put(obj);
  std::string why;
  EXPECT_EQ(drain_check_refill(b, &why), 100u) << why;
}

TEST(Pool, BookkeepingLockNoneIsANoOp) {
  RiPool p(64, 1);
  p.bookkeeping_lock();
  p.bookkeeping_lock();  // would deadlock if it locked
  EXPECT_FALSE(RiPool::bookkeeping_held_by_this_thread());
  p.bookkeeping_unlock();
  p.bookkeeping_unlock();
}

TEST(Pool, BookkeepingLockGlobalExcludes) {
  RiPool p(64, 1);
  RiPool q(64, 1);  // a different pool: the same process-wide lock
  p.set_modes(RiPoolMode::objpool, RiLockMode::global);
  q.set_modes(RiPoolMode::freelist, RiLockMode::global);
  long counter = 0;
  auto body = [&](RiPool& pool) {
    for (int i = 0; i < 1000000; ++i) {
      pool.bookkeeping_lock();
      counter = counter + 1;
      pool.bookkeeping_unlock();
    }
  };
  std::thread t1(body, std::ref(p)), t2(body, std::ref(q));
  body(p);
  t1.join();
  t2.join();
  EXPECT_EQ(counter, 3000000);

  p.bookkeeping_lock();
  EXPECT_TRUE(RiPool::bookkeeping_held_by_this_thread());
  p.set_modes(RiPoolMode::objpool, RiLockMode::none);  // switched while held
  p.bookkeeping_unlock();                              // still releases
  EXPECT_FALSE(RiPool::bookkeeping_held_by_this_thread());
  std::thread t3([&] {
    q.bookkeeping_lock();
    q.bookkeeping_unlock();
  });  // would hang if still held
  t3.join();
}

// ---------------------------------------------------------------------------
// Deterministic reentrancy: the hook plays a signal handler arriving at a
// given point of an outer get()/put() on the same thread.

struct HookState {
  RiPool* pool = nullptr;
  RiHook at = RiHook::cache_claimed;
  int fire_after = 0;  // skip this many hits of `at`
  int fired = 0;
  bool inside = false;
  void (*nested)(HookState&) = nullptr;
  std::vector<void*> kept;  // objects the nested code still holds
  std::vector<void*> seen;  // objects the nested code got
  int nested_nulls = 0;
};
HookState g_hook;

void hook(RiHook at) noexcept {
  HookState& h = g_hook;
  if (h.inside || at != h.at) return;
  if (h.fired != 0) return;
  if (h.fire_after-- > 0) return;
  h.fired = 1;
  h.inside = true;
  h.nested(h);
  h.inside = false;
}

struct HookGuard {
  explicit HookGuard(RiPool& p, RiHook at, void (*nested)(HookState&), int fire_after = 0) {
    g_hook = HookState{};
    g_hook.pool = &p;
    g_hook.at = at;
    g_hook.fire_after = fire_after;
    g_hook.nested = nested;
    uprobe::detail::ri_pool_test_hook = hook;
  }
  ~HookGuard() { uprobe::detail::ri_pool_test_hook = nullptr; }
};

// Nested: take n objects and keep them.
template <int N>
void nested_get_keep(HookState& h) {
  for (int i = 0; i < N; ++i) {
    void* obj = h.pool->get();
    if (obj == nullptr) {
      ++h.nested_nulls;
      continue;
    }
    h.kept.push_back(obj);
    h.seen.push_back(obj);
  }
}
// Nested: take n objects and give them back (a get/put storm).
template <int N>
void nested_storm(HookState& h) {
  std::vector<void*> tmp;
  for (int i = 0; i < N; ++i)
    if (void* obj = h.pool->get()) tmp.push_back(obj), h.seen.push_back(obj);
    else ++h.nested_nulls;
  for (void* obj : tmp) h.pool->put(obj);
}

void expect_disjoint(const std::vector<void*>& a, const std::vector<void*>& b) {
  std::set<void*> s(a.begin(), a.end());
  for (void* obj : b) EXPECT_EQ(s.count(obj), 0u) << obj << " handed out twice";
}

TEST(PoolReentry, GetInterruptedWithCacheClaimed) {
  RiPool p(64, 1000);
  p.put(p.get());  // fill the cache
  const std::uint32_t cached = p.thread_cached();
  HookGuard g(p, RiHook::cache_claimed, nested_get_keep<40>);
  void* outer = p.get();
  ASSERT_EQ(g_hook.fired, 1);
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(g_hook.kept.size(), 40u);  // from the rings: the cache was busy
  expect_disjoint(g_hook.kept, {outer});
  EXPECT_EQ(p.thread_cached(), cached - 1);  // the nested calls did not touch it
  std::vector<void*> all = g_hook.kept;
  all.push_back(outer);
  EXPECT_EQ(check_objects(p, all), "");
  for (void* obj : all) p.put(obj);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 1000u) << why;
}

TEST(PoolReentry, PutInterruptedWithCacheClaimed) {
  RiPool p(64, 1000);
  void* outer = p.get();
  HookGuard g(p, RiHook::cache_claimed, nested_storm<50>);
  p.put(outer);
  ASSERT_EQ(g_hook.fired, 1);
  EXPECT_EQ(g_hook.seen.size(), 50u);
  expect_disjoint(g_hook.seen, {outer});
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 1000u) << why;
}

TEST(PoolReentry, RefillInterruptedInsideRingPop) {
  RiPool p(64, 1000);
  HookGuard g(p, RiHook::ring_pop_reserved, nested_get_keep<40>, /*fire_after=*/3);
  void* outer = p.get();  // refill: the 4th ring pop is interrupted
  ASSERT_EQ(g_hook.fired, 1);
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(g_hook.kept.size(), 40u);
  std::vector<void*> all = g_hook.kept;
  all.push_back(outer);
  while (p.thread_cached() != 0) all.push_back(p.get());
  EXPECT_EQ(check_objects(p, all), "");
  for (void* obj : all) p.put(obj);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 1000u) << why;
}

TEST(PoolReentry, FlushInterruptedInsideRingPush) {
  RiPool p(64, 1000);
  std::vector<void*> held;
  for (int i = 0; i < 45; ++i) held.push_back(p.get());  // 3 refills: the cache is empty
  ASSERT_EQ(p.thread_cached(), 0u);
  for (int i = 0; i < 30; ++i) p.put(held[i]);
  ASSERT_EQ(p.thread_cached(), 30u);
  {
    HookGuard g(p, RiHook::ring_push_reserved, nested_storm<64>, /*fire_after=*/5);
    p.put(held[30]);  // the flush's 6th ring push is interrupted
    ASSERT_EQ(g_hook.fired, 1);
    EXPECT_EQ(g_hook.seen.size(), 64u);
    EXPECT_EQ(p.thread_cached(), 16u);
  }
  for (int i = 31; i < 45; ++i) p.put(held[i]);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 1000u) << why;
}

// The ABA case of a Treiber stack: between the outer pop's read of head (P)
// and P->next (N) and its CAS, the nested code pops P and N and pushes P back.
// The head is P again, but with a new tag: the outer CAS must fail, or N
// (still held by the nested code) would become the head.
TEST(PoolReentry, FreelistPopAbaIsCaughtByTheTag) {
  RiPool p(64, 100);
  p.set_modes(RiPoolMode::freelist, RiLockMode::none);
  HookGuard g(p, RiHook::stack_pop_loaded, [](HookState& h) {
    void* a = h.pool->get();  // P
    void* b = h.pool->get();  // N (nested pop: the hook does not fire again)
    h.pool->put(a);           // P is the head again, P->next = N->next
    h.kept.push_back(b);
    h.seen = {a, b};
  });
  void* outer = p.get();
  ASSERT_EQ(g_hook.fired, 1);
  ASSERT_EQ(g_hook.seen.size(), 2u);
  EXPECT_EQ(outer, g_hook.seen[0]);  // the retry pops P
  EXPECT_NE(outer, g_hook.kept[0]);
  std::vector<void*> rest = drain(p);
  EXPECT_EQ(rest.size(), 98u);
  expect_disjoint(rest, {outer, g_hook.kept[0]});
  for (void* obj : rest) p.put(obj);
  p.put(outer);
  p.put(g_hook.kept[0]);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 100u) << why;
}

TEST(PoolReentry, FreelistPushInterruptedAfterLinking) {
  RiPool p(64, 100);
  p.set_modes(RiPoolMode::freelist, RiLockMode::none);
  void* outer = p.get();
  HookGuard g(p, RiHook::stack_push_linked, nested_storm<10>);
  p.put(outer);
  ASSERT_EQ(g_hook.fired, 1);
  EXPECT_EQ(g_hook.seen.size(), 10u);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 100u) << why;
}

TEST_P(PoolMode, GetInterruptedWhileGrowing) {
  RiPool p(64, 0);
  p.set_modes(GetParam(), RiLockMode::none);
  HookGuard g(p, RiHook::grow_locked, nested_get_keep<3>);
  void* outer = p.get();
  ASSERT_EQ(g_hook.fired, 1);
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(g_hook.kept.size(), 0u);  // the nested gets cannot grow: bounded retries, then a miss
  EXPECT_EQ(g_hook.nested_nulls, 3);
  EXPECT_EQ(p.thread_stats().misses, 3u);
  EXPECT_EQ(p.capacity(), 4096u);
  p.put(outer);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 4096u) << why;
}

}  // namespace
