// SPDX-License-Identifier: MIT
// fork() while another thread holds one of libuprobe's locks outside the
// registry mutex (which the runtime's pthread_atfork handlers hold across a
// fork): the lock of the program's SIGTRAP action (the sigaction()
// interposer), the lookup lock of the trap path (LookupMode::locked), a
// probe's patch lock (taken by a hit whose consumers all said
// Action::remove). (The analysis caches' locks, which uprobe::plan_site()
// takes beside the registry: opt.Window.ForkWhileAnotherThreadPlansLeaves-
// TheChildFree.) That thread does not come along into the child: a child
// that waited for its lock would hang for ever. Each child here takes the
// lock the other thread was hammering (killed after 10 s), 200 forks per
// case (at most 3 stuck children); its exit status says what it got
// (exact hit counts).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "life_common.hpp"
#include "uprobe/lab.hpp"
#include "uprobe/symbols.hpp"

using namespace lifetest;

namespace {

constexpr int kForks = 200;

/// Forks kForks times while `hammer` runs on another thread (started
/// first, until it has run 10 rounds); each child runs `child` and _exits
/// with what it returns (0: as expected), or is killed after 10 s. Returns
/// the number of children that did not exit 0, and in `first` what the
/// first of them did.
template <typename Hammer, typename Child>
int fork_beside(Hammer hammer, Child child, std::string& first) {
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> rounds{0};
  std::thread t([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      hammer();
      rounds.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (rounds.load() < 10) std::this_thread::yield();
  int bad = 0;
  for (int i = 0; i < kForks && bad < 3; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      ++bad;
      continue;
    }
    if (pid == 0) ::_exit(child());
    // (A child stuck on a lock its parent's other thread held: SIGKILL after
    // 10 s. Not its own alarm(): a registration spins on some with every
    // signal blocked.)
    const int st = wait_child(pid, 10);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && bad++ == 0) first = status_str(st);
  }
  stop.store(true);
  t.join();
  return bad;
}

void on_trap(int) {}

/// The program sets its SIGTRAP action from one thread (libuprobe's
/// interposer keeps it in a table, behind a small lock of its own) while
/// another forks; each child sets its own, then takes a probe.
TEST(ForkLocks, ProgramSettingItsSigtrapActionInAnotherThread) {
  ConfigGuard guard;
  use_kind(Kind::int3);
  Counter on_add;
  uprobe::Attachment a(vaddr(lf_add), on_add);  // (the runtime and its SIGTRAP handler installed)
  struct sigaction act {};
  act.sa_handler = on_trap;
  sigemptyset(&act.sa_mask);
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGTRAP, nullptr, &before), 0);
  std::string first;
  const int bad = fork_beside([&] { (void)::sigaction(SIGTRAP, &act, nullptr); },
                              [&]() -> int {
                                struct sigaction got {};
                                if (::sigaction(SIGTRAP, &before, &got) != 0) return 3;
                                if (got.sa_handler != on_trap) return 4;
                                const std::uint64_t h0 = on_add.hits.load();
                                if (lf_add(2, 3) != 5 || on_add.hits.load() != h0 + 1) return 5;
                                Counter on_mul;
                                uprobe::Attachment b(vaddr(lf_mul), on_mul);
                                if (lf_mul(6, 7) != 42 || on_mul.hits.load() != 1) return 6;
                                return 0;
                              },
                              first);
  EXPECT_EQ(bad, 0) << "first: " << first;
  ASSERT_EQ(::sigaction(SIGTRAP, &before, nullptr), 0);
}

/// Every hit of another thread takes the trap path's lookup lock for
/// reading (LookupMode::locked, seed 000's "before"); each child publishes
/// a new probe, which takes it for writing.
TEST(ForkLocks, LockedLookupWhileAnotherThreadHits) {
  ConfigGuard guard;
  uprobe::Config c = uprobe::configuration();
  c.optimize = false;
  c.lookup = uprobe::LookupMode::locked;
  uprobe::configure(c);
  Counter on_add;
  uprobe::Attachment a(vaddr(lf_add), on_add);
  std::uint64_t i = 0;
  std::string first;
  const int bad = fork_beside([&] { (void)lf_add(i++, 1); },
                              [&]() -> int {
                                Counter on_mul;
                                uprobe::Attachment b(vaddr(lf_mul), on_mul);
                                if (lf_mul(6, 7) != 42 || on_mul.hits.load() != 1) return 3;
                                const std::uint64_t h0 = on_add.hits.load();
                                for (int k = 0; k < 10; ++k)
                                  if (lf_add(k, 1) != static_cast<std::uint64_t>(k) + 1) return 4;
                                return on_add.hits.load() == h0 + 10 ? 0 : 5;
                              },
                              first);
  EXPECT_EQ(bad, 0) << "first: " << first;
  EXPECT_GT(on_add.hits.load(), 10u);
}

/// Takes its breakpoint out at its first hit.
struct RemoveAtFirstHit : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::remove;
  }
};

/// Another thread attaches a consumer that says Action::remove, hits it
/// (the hit takes the probe's patch lock to write the original bytes back)
/// and detaches, over and over; each child attaches to the same function,
/// which joins the parent's probe when the fork came while it was attached.
TEST(ForkLocks, ActionRemoveInAnotherThread) {
  ConfigGuard guard;
  use_kind(Kind::int3);
  std::atomic<std::uint64_t> rounds{0}, wrong{0};
  std::string first;
  const int bad = fork_beside(
      [&] {
        RemoveAtFirstHit r;
        uprobe::Attachment a(vaddr(lf_add), r);
        (void)lf_add(1, 2);
        (void)lf_add(1, 2);  // (removed: not hit)
        rounds.fetch_add(1, std::memory_order_relaxed);
        if (r.hits.load() != 1) wrong.fetch_add(1, std::memory_order_relaxed);
      },
      [&]() -> int {
        Counter on_add;
        uprobe::Attachment b(vaddr(lf_add), on_add);
        for (int k = 0; k < 10; ++k)
          if (lf_add(k, 1) != static_cast<std::uint64_t>(k) + 1) return 3;
        return on_add.hits.load() == 10 ? 0 : 4;
      },
      first);
  EXPECT_EQ(bad, 0) << "first: " << first;
  EXPECT_GT(rounds.load(), 10u);
  EXPECT_EQ(wrong.load(), 0u) << "rounds whose consumer was not hit exactly once";
}

/// A fresh process's first uses of libuprobe (its first thread, which
/// becomes an RCU reader at its start; the analysis caches and first-use
/// values of a plan_site()) while its main thread forks: 40 runs of
/// life_fork_first_use (fork_first_use.cpp), each of 48 or more children
/// that plan, attach and hit within 5 s. (Before liburcu-bp's fork handlers came with
/// the first thread, and the caches' first use held a static's guard across
/// pthread_atfork(), 16 of 60 runs had a stuck child.)
TEST(ForkLocks, FirstUseInAFreshProcess) {
  int failed_runs = 0;
  std::string first;
  for (int run = 0; run < 40; ++run) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl(LIFE_FORK_FIRST_USE, LIFE_FORK_FIRST_USE, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const int st = wait_child(pid, 60);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && failed_runs++ == 0)
      first = "run " + std::to_string(run) + ": " +
              (WIFEXITED(st) ? std::to_string(WEXITSTATUS(st)) + " children failed" : status_str(st));
  }
  EXPECT_EQ(failed_runs, 0) << "first: " << first;
}

}  // namespace
