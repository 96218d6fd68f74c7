// SPDX-License-Identifier: MIT
// Case C-09: a trap that is not ours.
// (a) A raw int3 with no handler: the process dies by SIGTRAP exactly as
//     without the library (same wait status as a program not linked with it,
//     and as a child of this program that never started the library).
// (b) The program's own SIGTRAP handler installed before the library starts
//     and after (sigaction, and signal()): it runs exactly once per foreign
//     int3 with the kernel's siginfo and context, and probes keep working.
// Every scenario runs in a fork()ed child so the global state is clean.

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common.hpp"
#include "fixtures.hpp"

using namespace coretest;

#ifndef C09_RAW_INT3_HELPER
#error "C09_RAW_INT3_HELPER must name the helper program"
#endif

namespace {

struct Report {
  int stage = 0;
  std::uint64_t prog_calls = 0;   // program handler invocations
  std::uint64_t prog_bad = 0;     // invocations with a wrong signo/si_code/rip
  std::uint64_t hits = 0;         // probe hits
  std::uint64_t wrong = 0;        // wrong fixture results
  std::uint64_t foreign = 0;      // Stats::foreign_traps delta
  std::uint64_t stats_hits = 0;   // Stats::hits delta
  int error = 0;                  // 1 = an exception, see msg
  char msg[200] = {};
};

void send(int fd, const Report& r) {
  const char* p = reinterpret_cast<const char*>(&r);
  std::size_t left = sizeof r;
  while (left) {
    ssize_t n = ::write(fd, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

struct ChildResult {
  int status = 0;
  int reports = 0;
  Report last;
};

void no_core() {
  struct rlimit z = {0, 0};
  setrlimit(RLIMIT_CORE, &z);
}

/// Forks; the child runs body(fd) and _exit(0)s; the parent collects the
/// reports and the wait status.
template <typename Body>
ChildResult in_child(Body body) {
  ChildResult res;
  int p[2];
  if (::pipe(p) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return res;
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    no_core();
    body(p[1]);
    ::_exit(0);
  }
  ::close(p[1]);
  Report r;
  for (;;) {
    std::size_t got = 0;
    char* q = reinterpret_cast<char*>(&r);
    while (got < sizeof r) {
      ssize_t n = ::read(p[0], q + got, sizeof r - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got < sizeof r) break;
    res.last = r;
    ++res.reports;
  }
  ::close(p[0]);
  ::waitpid(pid, &res.status, 0);
  return res;
}

std::string status_str(int st) {
  if (WIFEXITED(st)) return "exited " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
                              strsignal(WTERMSIG(st)) + ")" + (WCOREDUMP(st) ? " core" : "");
  return "status " + hex(static_cast<std::uint64_t>(st));
}

int baseline_status_exec() {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    no_core();
    ::execl(C09_RAW_INT3_HELPER, C09_RAW_INT3_HELPER, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

// ------------------------------------------------------------ (a) ----

TEST(C09_ForeignTrap, RawInt3WithoutTheLibraryDiesBySigtrap) {
  int st = baseline_status_exec();
  ASSERT_TRUE(WIFSIGNALED(st)) << status_str(st);
  EXPECT_EQ(WTERMSIG(st), SIGTRAP) << status_str(st);
  // Same program, library linked but never started: same death.
  ChildResult c = in_child([](int fd) {
    Report r;
    r.stage = 1;
    send(fd, r);
    r.wrong = fx_int3() != 0x77;
    r.stage = 2;  // must not be reached
    send(fd, r);
  });
  EXPECT_EQ(c.last.stage, 1) << "the child survived its int3";
  ASSERT_TRUE(WIFSIGNALED(c.status)) << status_str(c.status);
  EXPECT_EQ(WTERMSIG(c.status), SIGTRAP) << status_str(c.status);
  EXPECT_EQ(c.status, st) << status_str(c.status) << " vs baseline " << status_str(st);
}

TEST(C09_ForeignTrap, RawInt3WithTheLibraryStartedDiesBySigtrap) {
  const int base = baseline_status_exec();
  ASSERT_TRUE(WIFSIGNALED(base) && WTERMSIG(base) == SIGTRAP) << status_str(base);
  for (int keep_probe = 1; keep_probe >= 0; --keep_probe) {
    SCOPED_TRACE(keep_probe ? "a probe is attached" : "the probe was detached");
    ChildResult c = in_child([keep_probe](int fd) {
      Report r;
      try {
        static Counter counter;
        uprobe::Uprobe* p = uprobe::register_uprobe(fx_addr(fx_nop1), counter);
        for (int i = 0; i < 10; ++i) r.wrong += fx_nop1(static_cast<std::uint64_t>(i), 0) != i + 1u;
        if (!keep_probe) uprobe::unregister_uprobe(p, counter);
        r.hits = counter.hits.load();
      } catch (const std::exception& e) {
        r.error = 1;
        std::snprintf(r.msg, sizeof r.msg, "%s", e.what());
      }
      r.stage = 1;
      send(fd, r);
      r.wrong += fx_int3() != 0x77;
      r.stage = 2;  // must not be reached
      send(fd, r);
    });
    EXPECT_EQ(c.last.error, 0) << c.last.msg;
    EXPECT_EQ(c.last.stage, 1) << "the child survived its int3 (" << status_str(c.status) << ")";
    EXPECT_EQ(c.last.hits, 10u);
    EXPECT_EQ(c.last.wrong, 0u);
    ASSERT_TRUE(WIFSIGNALED(c.status)) << status_str(c.status);
    EXPECT_EQ(WTERMSIG(c.status), SIGTRAP) << status_str(c.status);
    EXPECT_EQ(c.status, base) << status_str(c.status) << " vs baseline " << status_str(base);
  }
}

// ------------------------------------------------------------ (b) ----

std::atomic<std::uint64_t> g_prog_calls{0};
std::atomic<std::uint64_t> g_prog_bad{0};

void prog_action(int sig, siginfo_t* si, void* ctx) {
  g_prog_calls.fetch_add(1);
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  const auto expect_rip = reinterpret_cast<greg_t>(fx_addr(fx_int3)) + 1;
  if (sig != SIGTRAP || si == nullptr || si->si_signo != SIGTRAP || si->si_code != SI_KERNEL || uc == nullptr ||
      uc->uc_mcontext.gregs[REG_RIP] != expect_rip)
    g_prog_bad.fetch_add(1);
}

void prog_plain(int sig) {
  g_prog_calls.fetch_add(1);
  if (sig != SIGTRAP) g_prog_bad.fetch_add(1);
}

enum class Install { before_sigaction, after_sigaction, after_signal, before_signal };

void install(Install how) {
  if (how == Install::before_sigaction || how == Install::after_sigaction) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = prog_action;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTRAP, &sa, nullptr);
  } else {
    ::signal(SIGTRAP, prog_plain);
  }
}

/// In the child: the program handler and a probe, in the given order; 10
/// foreign int3s interleaved with 100 probed calls; then detach and 10 more
/// foreign int3s.
Report scenario(Install how, int fd) {
  Report r;
  const bool before = how == Install::before_sigaction || how == Install::before_signal;
  try {
    static Counter counter;
    if (before) install(how);
    const uprobe::Stats s0 = uprobe::stats();
    uprobe::Uprobe* p = uprobe::register_uprobe(fx_addr(fx_nop1), counter);
    if (!before) install(how);
    for (int k = 0; k < 10; ++k) {
      r.wrong += fx_int3() != 0x77;
      for (int i = 0; i < 10; ++i) r.wrong += fx_nop1(static_cast<std::uint64_t>(i), 0) != i + 1u;
    }
    r.hits = counter.hits.load();
    r.prog_calls = g_prog_calls.load();
    uprobe::Stats d = stats_delta(s0, uprobe::stats());
    r.foreign = d.foreign_traps;
    r.stats_hits = d.hits;
    r.stage = 1;
    send(fd, r);
    uprobe::unregister_uprobe(p, counter);
    for (int k = 0; k < 10; ++k) r.wrong += fx_int3() != 0x77;
    for (int i = 0; i < 10; ++i) r.wrong += fx_nop1(static_cast<std::uint64_t>(i), 0) != i + 1u;
    r.hits = counter.hits.load();
    r.prog_calls = g_prog_calls.load();
    r.prog_bad = g_prog_bad.load();
    r.stage = 2;
  } catch (const std::exception& e) {
    r.error = 1;
    std::snprintf(r.msg, sizeof r.msg, "%s", e.what());
  }
  return r;
}

void check_scenario(Install how, const char* name) {
  SCOPED_TRACE(name);
  ChildResult c = in_child([how](int fd) { send(fd, scenario(how, fd)); });
  const Report& r = c.last;
  EXPECT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)
      << "child " << status_str(c.status) << " after stage " << r.stage << " (program handler calls so far "
      << r.prog_calls << ", probe hits " << r.hits << ")";
  EXPECT_EQ(r.error, 0) << r.msg;
  ASSERT_EQ(r.stage, 2);
  EXPECT_EQ(r.wrong, 0u) << "wrong results (fx_int3 must return 0x77 after the handler)";
  EXPECT_EQ(r.prog_calls, 20u) << "the program's SIGTRAP handler must run exactly once per foreign int3";
  EXPECT_EQ(r.prog_bad, 0u) << "the program's handler saw a wrong signo/si_code/rip";
  EXPECT_EQ(r.hits, 100u) << "probe hits";
  EXPECT_EQ(r.stats_hits, 100u);
  EXPECT_EQ(r.foreign, 10u) << "Stats::foreign_traps while the probe was attached";
}

TEST(C09_ForeignTrap, ProgramHandlerInstalledBeforeLibraryStarts) { check_scenario(Install::before_sigaction, "before, sigaction"); }

TEST(C09_ForeignTrap, ProgramHandlerInstalledBeforeLibraryStartsWithSignal) {
  check_scenario(Install::before_signal, "before, signal()");
}

TEST(C09_ForeignTrap, ProgramHandlerInstalledAfterLibraryStarts) { check_scenario(Install::after_sigaction, "after, sigaction"); }

TEST(C09_ForeignTrap, ProgramHandlerInstalledAfterLibraryStartsWithSignal) {
  check_scenario(Install::after_signal, "after, signal()");
}

}  // namespace
