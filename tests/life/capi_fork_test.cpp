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

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include <gtest/gtest.h>

#include <uprobe/uprobe.h>
#include <uprobe/uprobe.hpp>

extern "C" __attribute__((noipa)) long capi_fork_other(long x) {
  __asm__ volatile("");
  return x + 2;
}

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

/// A C consumer that counts its hits in `c`.
uprobe_consumer counting(Count& c) {
  uprobe_consumer uc{};
  uc.handler = count_hit;
  uc.user_data = &c;
  return uc;
}

/// What the child checks; its exit status says which check failed (0: none).
int child_checks(Count& inherited, uprobe_probe* inherited_probe, uprobe_consumer* inherited_uc) {
  const long before = inherited.hits.load();
  if (capi_fork_target(1) != 2 || inherited.hits.load() != before + 1) return 10;  // the inherited probe fires
  Count mine;
  uprobe_consumer uc = counting(mine);
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

// ---- A consumer's handler that forks while its own thread holds a lock the
// atfork handlers take (the C layer's, the registry's): fork() must not
// wait for that thread, which is itself.

std::atomic<int> g_fork_armed{0}, g_forked{0};

/// Forks once when armed (the child exits at once), from inside a hit.
void fork_once_if_armed() {
  if (g_fork_armed.exchange(0) == 0) return;
  const pid_t p = fork();
  if (p == 0) _exit(0);
  if (p > 0 && waitpid(p, nullptr, 0) == p) g_forked.fetch_add(1);
}

int c_fork_on_hit(uprobe_consumer*, uprobe_regs*, std::uint64_t*) {
  fork_once_if_armed();
  return 0;
}

struct ForkOnHit : uprobe::Consumer {
  uprobe::Action handler(uprobe::Regs&) override {
    fork_once_if_armed();
    return uprobe::Action::keep;
  }
};

/// Where libc's malloc is: (path, offset), what both scenarios probe.
bool libc_malloc(std::string& path, std::uint64_t& offset) {
  char buf[4096];
  if (uprobe_resolve_address(dlsym(RTLD_NEXT, "malloc"), buf, sizeof buf, &offset) != 0) return false;
  path = buf;
  return true;
}

/// Runs `scenario` in a child process of its own (a hang there is a
/// timeout here, not a hung test): its exit status, -1 for a hang.
template <class F>
int in_child(F scenario) {
  const pid_t pid = fork();
  if (pid == 0) _exit(scenario());
  return pid > 0 ? wait_child(pid, 20000) : -2;
}

// The C layer: uprobe_register_addr() allocates the consumer's adapter while
// it holds the C layer's lock; a probe on malloc whose handler forks then
// forks with that lock held by its own thread.
TEST(CApiFork, AHandlerThatForksInsideACApiCallDoesNotHang) {
  std::string path;
  std::uint64_t offset = 0;
  ASSERT_TRUE(libc_malloc(path, offset));
  const int status = in_child([&] {
    uprobe_consumer on_malloc{};
    on_malloc.handler = c_fork_on_hit;
    uprobe_probe* pm = nullptr;
    if (uprobe_register(path.c_str(), offset, &on_malloc, &pm) != 0) return 10;
    Count mine;
    uprobe_consumer uc = counting(mine);
    uprobe_probe* p = nullptr;
    g_fork_armed = 1;
    if (uprobe_register_addr(reinterpret_cast<const void*>(&capi_fork_target), &uc, &p) != 0) return 11;
    if (g_forked.load() != 1 || g_fork_armed.load() != 0) return 12;  // the handler forked, inside the call
    if (capi_fork_target(1) != 2 || mine.hits.load() != 1) return 13;
    if (uprobe_unregister(p, &uc) != 0 || uprobe_unregister(pm, &on_malloc) != 0) return 14;
    return 0;
  });
  ASSERT_NE(status, -1) << "hung: the fork waited for the C layer's lock its own thread held";
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check " << WEXITSTATUS(status) << " failed";
}

// The registry: a registration allocates while it holds the registry's lock;
// the same handler forks then, with the registry's lock held by its thread.
TEST(CApiFork, AHandlerThatForksDuringARegistrationDoesNotHang) {
  std::string path;
  std::uint64_t offset = 0;
  ASSERT_TRUE(libc_malloc(path, offset));
  const int status = in_child([&] {
    ForkOnHit on_malloc;
    uprobe::Uprobe* pm = nullptr;
    try {
      pm = uprobe::register_uprobe(path, offset, on_malloc);
    } catch (const std::exception&) {
      return 10;
    }
    Count mine;
    uprobe_consumer uc = counting(mine);
    uprobe_probe* p = nullptr;
    // (The adapter first, so that the fork happens inside the registry's
    // section rather than the C layer's: a registration of it elsewhere.)
    if (uprobe_register_addr(reinterpret_cast<const void*>(&capi_fork_other), &uc, &p) != 0) return 11;
    uprobe_probe* p2 = nullptr;
    g_fork_armed = 1;
    if (uprobe_register_addr(reinterpret_cast<const void*>(&capi_fork_target), &uc, &p2) != 0) return 12;
    if (g_forked.load() != 1 || g_fork_armed.load() != 0) return 13;
    if (capi_fork_target(1) != 2 || capi_fork_other(1) != 3 || mine.hits.load() != 2) return 14;
    if (uprobe_unregister(p, &uc) != 0 || uprobe_unregister(p2, &uc) != 0) return 15;
    try {
      uprobe::unregister_uprobe(pm, on_malloc);
    } catch (const std::exception&) {
      return 16;
    }
    return 0;
  });
  ASSERT_NE(status, -1) << "hung: the fork waited for the registry's lock its own thread held";
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check " << WEXITSTATUS(status) << " failed";
}

// A program whose own pthread_atfork handlers, registered before libuprobe's,
// call the C and the C++ API: inside its fork() libuprobe's prepare handlers
// hold its locks; each call returns EDEADLK / Errc::in_handler with why
// (before: the program hung for good, every signal but SIGTRAP blocked), and
// after the fork the API works again.
TEST(CApiFork, ApiCallsFromAtforkHandlersReturnAnError) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(LIFE_ATFORK_CHILD, LIFE_ATFORK_CHILD, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  ASSERT_GT(pid, 0);
  const int status = wait_child(pid, 20000);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  close(out[0]);
  ASSERT_NE(status, -1) << "hung: an API call from an atfork handler waited for its own fork's locks";
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_EQ(text,
            "prepare: C EDEADLK, C++ in_handler\n"
            "parent: C EDEADLK, C++ in_handler\n"
            "child: exit 0\n"
            "after: C 0, C++ registered\n");
}

}  // namespace
