// SPDX-License-Identifier: MIT
// fork(): the pool is plain memory, so the child keeps a working pool: the
// objects the parent held stay held, the rest are handed out exactly once,
// threads of the child can use it; and the parent is unaffected. A fork taken
// while other threads hammer the pool leaves a child that still works (after
// after_fork_child()), never handing out an object a vanished thread held.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "pool_common.hpp"

using namespace pooltest;

namespace {

// Child exit codes.
enum : int { kOk = 0, kBadDrain = 10, kBadDrainCount, kStormError, kBadFinalDrain, kBadHeldHandedOut };

int child_storm(RiPool& p, std::uint64_t tag, long pairs) {
  Rng rng{tag * 0x9E3779B97F4A7C15ull};
  void* held[20];
  int n = 0, errors = 0;
  long gets = 0;
  while (gets < pairs || n > 0) {
    if (gets < pairs && (n == 0 || (n < 20 && (rng.next() & 1)))) {
      ++gets;
      void* obj = p.get();
      if (obj == nullptr) continue;
      if (claim(obj, tag) != 0) ++errors;
      held[n++] = obj;
    } else {
      const int i = static_cast<int>(rng.next() % static_cast<std::uint64_t>(n));
      void* obj = held[i];
      held[i] = held[--n];
      if (release(obj) != tag) ++errors;
      p.put(obj);
    }
  }
  p.thread_exit();
  return errors;
}

class PoolFork : public ::testing::TestWithParam<RiPoolMode> {};
INSTANTIATE_TEST_SUITE_P(Modes, PoolFork, ::testing::Values(RiPoolMode::objpool, RiPoolMode::freelist),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

TEST_P(PoolFork, ChildKeepsAWorkingPool) {
  RiPool p(128, 2048);
  p.set_modes(GetParam(), RiLockMode::none);
  std::vector<void*> held;
  for (int i = 0; i < 100; ++i) held.push_back(p.get());
  for (int i = 0; i < 50; ++i) p.put(held[i]);  // the parent's cache is warm at fork time
  held.erase(held.begin(), held.begin() + 50);
  for (void* obj : held) claim(obj, 0xFA);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = kOk;
    std::vector<void*> all = drain(p);
    if (!check_objects(p, all).empty()) code = kBadDrain;
    else if (all.size() != 2048 - 50) code = kBadDrainCount;
    for (void* obj : all) p.put(obj);
    std::atomic<int> errors{0};
    std::thread t1([&] { errors += child_storm(p, 0xC1, 200000); });
    std::thread t2([&] { errors += child_storm(p, 0xC2, 200000); });
    t1.join();
    t2.join();
    if (code == kOk && errors.load() != 0) code = kStormError;
    std::vector<void*> again = drain(p);
    if (code == kOk && (again.size() != p.capacity() - 50 || !check_objects(p, again).empty())) code = kBadFinalDrain;
    for (void* obj : again)
      for (void* h : held)
        if (obj == h) code = kBadHeldHandedOut;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kOk);

  // The parent is unaffected.
  for (void* obj : held) {
    release(obj);
    p.put(obj);
  }
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), 2048u) << why;
}

TEST(PoolFork, ForkWhileOtherThreadsHammer) {
  RiPool p(64, 4096);
  std::atomic<bool> stop{false};
  std::atomic<long> errors{0};
  auto hammer = [&](std::uint64_t tag) {
    Rng rng{tag};
    void* held[40];
    int n = 0;
    while (!stop.load(std::memory_order_relaxed) || n > 0) {
      if (!stop.load(std::memory_order_relaxed) && (n == 0 || (n < 40 && (rng.next() & 1)))) {
        void* obj = p.get();
        if (obj == nullptr) continue;
        if (claim(obj, tag) != 0) ++errors;
        held[n++] = obj;
      } else {
        void* obj = held[--n];
        if (release(obj) != tag) ++errors;
        p.put(obj);
      }
    }
    p.thread_exit();
  };
  std::thread a(hammer, 0xAA), b(hammer, 0xBB);
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      p.after_fork_child();
      // Objects the vanished threads held keep their tags: a get that hands one
      // out fails the claim.
      const int e = child_storm(p, 0xCC, 100000);
      _exit(e == 0 ? kOk : kStormError);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child died: status " << status;
    EXPECT_EQ(WEXITSTATUS(status), kOk) << "round " << round;
  }
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(errors.load(), 0);
  std::string why;
  EXPECT_EQ(drain_check_refill(p, &why), p.capacity()) << why;
}

}  // namespace
