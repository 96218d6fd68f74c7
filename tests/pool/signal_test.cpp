// SPDX-License-Identifier: MIT
// Signal reentrancy of the return-instance pool: the main thread runs a
// get/put storm while SIGUSR1 (sent by a second thread) and SIGALRM (an
// interval timer) interrupt it at random points, and each other, and their
// handlers run get/put storms of their own on the same thread. Every object
// is claimed with an owner tag; at the end the pool hands out exactly
// capacity() distinct objects.

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>

#include <cerrno>
#include <thread>

#include "pool_common.hpp"

using namespace pooltest;

namespace {

RiPool* g_pool = nullptr;
std::atomic<long> g_errors{0}, g_nulls{0}, g_usr1{0}, g_alrm{0}, g_handler_gets{0}, g_in_busy{0};
static_assert(std::atomic<long>::is_always_lock_free);

void storm(std::uint64_t tag, unsigned n) {  // async-signal-safe
  void* held[48];
  unsigned k = 0;
  for (unsigned i = 0; i < n; ++i) {
    void* obj = g_pool->get();
    if (obj == nullptr) {
      g_nulls.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (claim(obj, tag) != 0) g_errors.fetch_add(1, std::memory_order_relaxed);
    held[k++] = obj;
  }
  g_handler_gets.fetch_add(k, std::memory_order_relaxed);
  for (unsigned j = k; j-- > 0;) {
    if (release(held[j]) != tag) g_errors.fetch_add(1, std::memory_order_relaxed);
    g_pool->put(held[j]);
  }
}

// Did this handler interrupt a cache operation (the only live pool's slot is busy)?
void note_busy() {
  for (const auto& c : uprobe::detail::t_ri_cache)
    if (__atomic_load_n(&c.busy, __ATOMIC_RELAXED) != 0) g_in_busy.fetch_add(1, std::memory_order_relaxed);
}

void on_usr1(int) {
  const int saved = errno;
  note_busy();
  const long c = g_usr1.fetch_add(1, std::memory_order_relaxed);
  storm(0x5151, 1 + static_cast<unsigned>(c % 48));
  errno = saved;
}

void on_alrm(int) {
  const int saved = errno;
  note_busy();
  const long c = g_alrm.fetch_add(1, std::memory_order_relaxed);
  storm(0xA1A1, 1 + static_cast<unsigned>((c * 7) % 48));
  errno = saved;
}

class PoolSignals : public ::testing::TestWithParam<RiPoolMode> {};
INSTANTIATE_TEST_SUITE_P(Modes, PoolSignals, ::testing::Values(RiPoolMode::objpool, RiPoolMode::freelist),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

TEST_P(PoolSignals, HandlersStormWhileMainThreadStorms) {
  RiPool pool(64, 4096);
  pool.set_modes(GetParam(), RiLockMode::none);
  g_pool = &pool;
  g_errors = g_nulls = g_usr1 = g_alrm = g_handler_gets = g_in_busy = 0;

  struct sigaction sa = {}, old_usr1 = {}, old_alrm = {};
  sigemptyset(&sa.sa_mask);  // the two handlers may interrupt each other
  sa.sa_flags = SA_RESTART;
  sa.sa_handler = on_usr1;
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old_usr1), 0);
  sa.sa_handler = on_alrm;
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old_alrm), 0);

  const pthread_t main_thread = pthread_self();
  std::atomic<bool> stop{false};
  // The killer thread is born with both signals blocked: SIGALRM must go to
  // the main thread (a handler run on the killer would fill the killer's
  // cache, and the killer never calls thread_exit()).
  sigset_t both, saved_mask;
  sigemptyset(&both);
  sigaddset(&both, SIGUSR1);
  sigaddset(&both, SIGALRM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &both, &saved_mask), 0);
  std::thread killer([&] {
    const timespec nap = {0, 20000};
    while (!stop.load(std::memory_order_relaxed)) {
      pthread_kill(main_thread, SIGUSR1);
      nanosleep(&nap, nullptr);
    }
  });
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &saved_mask, nullptr), 0);
  itimerval timer = {{0, 37}, {0, 37}};
  ASSERT_EQ(setitimer(ITIMER_REAL, &timer, nullptr), 0);

  Rng rng{0x1234567};
  constexpr int kMaxHeld = 40;
  constexpr long kPairs = 1000000;
  void* held[kMaxHeld];
  int n = 0;
  long gets = 0, errors = 0, nulls = 0;
  while (gets < kPairs || n > 0) {
    if (gets < kPairs && (n == 0 || (n < kMaxHeld && (rng.next() & 1)))) {
      ++gets;
      void* obj = pool.get();
      if (obj == nullptr) {
        ++nulls;
        continue;
      }
      if (claim(obj, 0x3A1) != 0) ++errors;
      held[n++] = obj;
    } else {
      const int i = static_cast<int>(rng.next() % static_cast<std::uint64_t>(n));
      void* obj = held[i];
      held[i] = held[--n];
      if (release(obj) != 0x3A1) ++errors;
      pool.put(obj);
    }
  }

  itimerval off = {};
  setitimer(ITIMER_REAL, &off, nullptr);
  stop = true;
  killer.join();
  struct sigaction ign = {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGALRM, &ign, nullptr);  // drop a pending one
  sigaction(SIGUSR1, &ign, nullptr);
  sigaction(SIGALRM, &old_alrm, nullptr);
  sigaction(SIGUSR1, &old_usr1, nullptr);

  EXPECT_EQ(errors, 0);
  EXPECT_EQ(g_errors.load(), 0);
  EXPECT_GT(g_usr1.load(), 200);
  EXPECT_GT(g_alrm.load(), 100);
  if (GetParam() == RiPoolMode::objpool) {
    EXPECT_GT(g_in_busy.load(), 10);  // really nested in cache operations
  }
  RecordProperty("usr1", static_cast<int>(g_usr1.load()));
  RecordProperty("alrm", static_cast<int>(g_alrm.load()));
  RecordProperty("handler_gets", static_cast<int>(g_handler_gets.load()));
  RecordProperty("nulls", static_cast<int>(nulls + g_nulls.load()));
  RecordProperty("in_busy_cache", static_cast<int>(g_in_busy.load()));
  std::printf(
      "[ info     ] %s: %ld SIGUSR1 + %ld SIGALRM handlers (%ld inside a claimed cache), %ld handler gets, %ld nulls, "
      "capacity %zu\n",
      mode_name(GetParam()), g_usr1.load(), g_alrm.load(), g_in_busy.load(), g_handler_gets.load(),
      nulls + g_nulls.load(), pool.capacity());
  std::string why;
  EXPECT_EQ(drain_check_refill(pool, &why), pool.capacity()) << why;
  g_pool = nullptr;
}

}  // namespace
