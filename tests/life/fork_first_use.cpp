// SPDX-License-Identifier: MIT
// A process that has used nothing of libuprobe yet: its first thread
// (which the interposed pthread_create() makes a liburcu-bp reader at its
// start) plans a site in libc (the first use of the ELF image, IFUNC,
// debug-bounds and signal-return caches, and of the forbidden functions'
// first-use values) while the main thread forks 12 children at once. Each
// child plans the same site, attaches to a function of its own, hits it and
// exits; a child that does not exit within 5 s (a lock or a static's guard
// its parent's thread held at the fork) is killed. Exit status: the number
// of children that did not exit 0. life.ForkLocks.FirstUseInAFreshProcess
// runs it many times.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

extern "C" __attribute__((noinline)) long ffu_target(long x) {
  __asm__ volatile("" ::: "memory");
  return x * 3 + 1;
}

namespace {

struct Counter : uprobe::Consumer {
  std::atomic<long> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

std::string g_libc;

/// libc's strlen (an IFUNC) resolved and its entry planned.
void plan() {
  (void)uprobe::plan_site(g_libc, uprobe::resolve_symbol(g_libc, "strlen").offset);
}

int child() {
  try {
    plan();
    Counter c;
    {
      uprobe::Attachment a(reinterpret_cast<const void*>(&ffu_target), c);
      if (ffu_target(4) != 13) return 4;
    }
    return c.hits.load() == 1 ? 0 : 5;
  } catch (const std::exception&) {
    return 6;
  }
}

}  // namespace

/// Waits for `pid` at most 5 s, then kills it; whether it exited 0.
bool exited_0(pid_t pid) {
  int st = 0;
  for (int waited_ms = 0; ::waitpid(pid, &st, WNOHANG) == 0; ::usleep(1000))
    if (++waited_ms > 5000) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return false;
    }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main() {
  g_libc = uprobe::resolve_library("libc.so.6");  // (dl_iterate_phdr only: no cache)
  std::atomic<bool> go{false}, done{false};
  std::thread t([&] {
    while (!go.load()) {
    }
    plan();
    done.store(true);
  });
  go.store(true);
  // Bursts of back-to-back forks, reaped after each: a fork is in progress
  // most of the time while the thread makes its first uses.
  int forks = 0, bad = 0;
  while (!done.load() || forks < 48) {
    pid_t pids[16];
    for (pid_t& pid : pids) {
      pid = ::fork();
      if (pid == 0) ::_exit(child());
      ++forks;
    }
    for (const pid_t pid : pids) bad += pid < 0 || !exited_0(pid);
  }
  t.join();
  return bad > 255 ? 255 : bad;
}
