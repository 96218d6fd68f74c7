// SPDX-License-Identifier: MIT
// The C API across fork(): a child forked while another thread of the parent
// is inside a C API call (holding the C layer's lock on its consumers) must
// be able to use the C API itself, and to unregister the registrations it
// inherited. (Before: the child's first uprobe_register() waited forever for
// a lock that a thread it does not have held.)

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include <gtest/gtest.h>

#include <uprobe/uprobe.h>

extern "C" __attribute__((noipa)) long capi_fork_target(long x) {
  __asm__ volatile("");  // a real call each time (noipa: no clone for a constant argument)
  return x + 1;
}

namespace {

struct Count {
  std::atomic<long> hits{0};
};

int count_hit(uprobe_consumer* self, uprobe_regs*, std::uint64_t*) {
  static_cast<Count*>(self->user_data)->hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

/// What the child checks; its exit status says which check failed (0: none).
int child_checks(Count& inherited, uprobe_probe* inherited_probe, uprobe_consumer* inherited_uc) {
  const long before = inherited.hits.load();
  if (capi_fork_target(1) != 2 || inherited.hits.load() != before + 1) return 10;  // the inherited probe fires
  Count mine;
  uprobe_consumer uc{};
  uc.handler = count_hit;
  uc.user_data = &mine;
  uprobe_probe* p = nullptr;
  if (uprobe_register_addr(reinterpret_cast<const void*>(&capi_fork_target), &uc, &p) != 0) return 11;
  if (capi_fork_target(2) != 3 || mine.hits.load() != 1 || inherited.hits.load() != before + 2) return 12;
  if (uprobe_unregister(p, &uc) != 0) return 13;
  if (uprobe_unregister(inherited_probe, inherited_uc) != 0) return 14;  // the parent's adapter came along
  if (capi_fork_target(3) != 4 || mine.hits.load() != 1 || inherited.hits.load() != before + 2) return 15;
  return 0;
}

/// The child's status, or -1 when it did not end within `ms` (killed then).
int wait_child(pid_t pid, int ms) {
  for (int waited = 0; waited < ms; ++waited) {
    int status = 0;
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) return status;
    if (w < 0 && errno != EINTR) return -2;
    const timespec one_ms{0, 1000000};
    nanosleep(&one_ms, nullptr);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

TEST(CApiFork, ChildForkedDuringAnotherThreadsCallUsesTheCApi) {
  Count inherited;
  uprobe_consumer kept{};
  kept.handler = count_hit;
  kept.user_data = &inherited;
  uprobe_probe* kept_probe = nullptr;
  ASSERT_EQ(uprobe_register_addr(reinterpret_cast<const void*>(&capi_fork_target), &kept, &kept_probe), 0)
      << uprobe_last_error();
  // Another thread in the C layer all the time: uprobe_unregister() of a
  // consumer it does not know takes the C layer's lock, looks, and fails
  // (-ENOENT), allocating nothing.
  std::atomic<bool> stop{false};
  std::atomic<long> calls{0};
  std::thread churn([&] {
    uprobe_consumer stranger{};
    stranger.handler = count_hit;
    auto* bogus = reinterpret_cast<uprobe_probe*>(&stranger);
    while (!stop.load(std::memory_order_relaxed)) {
      if (uprobe_unregister(bogus, &stranger) == -ENOENT) calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (calls.load() < 1000) std::this_thread::yield();
  for (int i = 0; i < 40; ++i) {
    const long hits_before = inherited.hits.load();
    const pid_t pid = fork();
    if (pid == 0) _exit(child_checks(inherited, kept_probe, &kept));
    ASSERT_GT(pid, 0);
    const int status = wait_child(pid, 10000);
    ASSERT_NE(status, -1) << "fork " << i << ": the child hung in the C API (a lock held by a thread it does not have)";
    ASSERT_TRUE(WIFEXITED(status)) << "fork " << i << ": status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "fork " << i << ": check " << WEXITSTATUS(status) << " failed in the child";
    EXPECT_EQ(inherited.hits.load(), hits_before) << "the child's hits are its own";
  }
  stop = true;
  churn.join();
  EXPECT_GT(calls.load(), 1000);
  const long before = inherited.hits.load();
  EXPECT_EQ(capi_fork_target(5), 6);
  EXPECT_EQ(inherited.hits.load(), before + 1) << "the parent's registration is still in";
  EXPECT_EQ(uprobe_unregister(kept_probe, &kept), 0) << uprobe_last_error();
  EXPECT_EQ(capi_fork_target(6), 7);
  EXPECT_EQ(inherited.hits.load(), before + 1);
}

}  // namespace
