// SPDX-License-Identifier: MIT
// Processes: fork() with a return in flight where the child detaches and
// attaches on its own (its own counts, the parent unaffected); vfork() whose
// child calls a return-probed function before exec; posix_spawn() while
// libc's execve carries a return probe (the spawn child enters it on its own
// stack, sharing our memory and TLS, and never returns); clone(CLONE_VM)
// without CLONE_THREAD whose child runs return-probed code on its own stack
// (below and above the parent's) while the parent waits with a return in
// flight; a return probe on vfork itself refused (its child would take our
// return instance), an entry probe there counting each call; a vfork child
// resetting handlers leaves ours alone; a program that closes every
// descriptor (close_range()) while probed, then has new probes attached that
// need new XOL memory, and never sees a descriptor of ours. Each for int3 and
// optimized (nop5) probes.

#include <dirent.h>
#include <fcntl.h>
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "life_common.hpp"
#include "uprobe/symbols.hpp"

extern char** environ;

using namespace lifetest;

namespace {

class Process : public ::testing::TestWithParam<Kind> {
 protected:
  ConfigGuard guard;
  void SetUp() override { use_kind(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Kinds, Process, ::testing::Values(Kind::int3, Kind::optimized),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

std::uint8_t g_nop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};

// ----------------------------------------------------------------- fork ----

struct ForkCtx {
  Session* add = nullptr;
  uprobe::Attachment* add_att = nullptr;
  pid_t pid = -1;
  ChildReport child;  // filled in the child only
};
ForkCtx* g_fork = nullptr;

/// Runs inside lf_outer (a return in flight in both processes).
long fork_body(long a) {
  ForkCtx& c = *g_fork;
  c.pid = ::fork();
  if (c.pid != 0) return a + 2;
  // Child. v[0]: entries seen before anything here (the parent's 10).
  ChildReport& r = c.child;
  r.v[0] = c.add->entries.load();
  for (std::uint64_t i = 0; i < 5; ++i) r.v[1] += lf_add(i, 1) != i + 1;
  r.v[2] = c.add->entries.load();  // 15
  r.v[3] = c.add->rets.load();     // 15
  c.add_att->detach();
  r.v[4] = std::memcmp(vaddr(lf_add), g_nop5, 5) != 0;  // restored in the child
  for (std::uint64_t i = 0; i < 3; ++i) r.v[1] += lf_add(i, 2) != i + 2;
  r.v[5] = c.add->entries.load();  // still 15
  Counter mul;
  {
    uprobe::Attachment m(vaddr(lf_mul), mul);
    for (std::uint64_t i = 0; i < 7; ++i) r.v[1] += lf_mul(i, 3) != i * 3;
    r.v[6] = uprobe::probe_info(m.probe()).mode == kind_mode(uprobe::configuration().optimize ? Kind::optimized : Kind::int3) ? 1 : 0;
  }
  r.v[7] = mul.hits.load();  // 7
  Session again;
  again.adds = true;
  {
    uprobe::Attachment b(vaddr(lf_add), again);
    for (std::uint64_t i = 0; i < 4; ++i) r.v[1] += lf_add(i, 4) != i + 4;
  }
  r.v[8] = again.entries.load() * 100 + again.rets.load();  // 404
  r.v[9] = again.bad.load() + c.add->bad.load();
  return a + 1;
}

TEST_P(Process, ForkChildDetachesAndAttaches) {
  Session add, outer;
  add.adds = true;
  ForkCtx ctx;
  g_fork = &ctx;
  uprobe::Attachment aa(vaddr(lf_add), add), ao(vaddr(lf_outer), outer);
  ctx.add = &add;
  ctx.add_att = &aa;
  ASSERT_EQ(uprobe::probe_info(aa.probe()).mode, kind_mode(GetParam()));
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(lf_add(i, i), 2 * i);
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  std::fflush(nullptr);
  g_outer_body = fork_body;
  const long r = lf_outer(40);
  g_outer_body = nullptr;
  if (ctx.pid == 0) {
    // Child, after its own return through the trampoline.
    ctx.child.v[10] = static_cast<std::uint64_t>(r);                        // 41
    ctx.child.v[11] = outer.rets.load();                                    // 1
    ctx.child.v[12] = uprobe::return_stack_depth();                         // 0
    write_all(pfd[1], &ctx.child, sizeof ctx.child);
    ::_exit(0);
  }
  ::close(pfd[1]);
  ASSERT_GT(ctx.pid, 0);
  EXPECT_EQ(r, 42);
  EXPECT_EQ(outer.rets.load(), 1u);
  ChildReport rep;
  const bool got = read_all(pfd[0], &rep, sizeof rep) == sizeof rep;
  ::close(pfd[0]);
  const int st = wait_child(ctx.pid, 60);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
  ASSERT_TRUE(got);
  EXPECT_EQ(rep.v[0], 10u) << "the child starts with the parent's counts";
  EXPECT_EQ(rep.v[1], 0u) << "wrong results in the child";
  EXPECT_EQ(rep.v[2], 15u);
  EXPECT_EQ(rep.v[3], 15u);
  EXPECT_EQ(rep.v[4], 0u) << "detach in the child restores the original nop5 there";
  EXPECT_EQ(rep.v[5], 15u) << "no hits after the child's detach";
  EXPECT_EQ(rep.v[6], 1u) << "a probe attached in the child has the expected mode";
  EXPECT_EQ(rep.v[7], 7u);
  EXPECT_EQ(rep.v[8], 404u) << "entries*100 + returns of the child's new session";
  EXPECT_EQ(rep.v[9], 0u) << "bad cookies or return values in the child";
  EXPECT_EQ(rep.v[10], 41u) << "the child's own return through the trampoline";
  EXPECT_EQ(rep.v[11], 1u) << "the child's ret_handler for its in-flight return (its copy of the counter)";
  EXPECT_EQ(rep.v[12], 0u);
  // The parent: still probed, its own counts only.
  EXPECT_NE(std::memcmp(vaddr(lf_add), g_nop5, 5), 0) << "the child's detach reached the parent's text";
  for (std::uint64_t i = 0; i < 6; ++i) EXPECT_EQ(lf_add(i, 1), i + 1);
  EXPECT_EQ(add.entries.load(), 16u);
  EXPECT_EQ(add.rets.load(), 16u);
  EXPECT_EQ(add.bad.load(), 0u);
  EXPECT_EQ(lf_mul(6, 7), 42u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  g_fork = nullptr;
}

/// fork() while two other threads hit entry+return probes (int3 or
/// optimized) nonstop: the child (only the forking thread survives, the
/// others vanish with instances pending) keeps working probes with exact
/// counts of its own, can detach and attach, and exits cleanly; 10 rounds.
TEST_P(Process, ForkWhileOtherThreadsHitReturnProbes) {
  Session add;
  add.adds = true;
  uprobe::Attachment aa(vaddr(lf_add), add);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> wrong{0};
  auto hammer = [&](std::uint64_t k) {
    for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      wrong += lf_add(i, k) != i + k;
      wrong += lf_outer(static_cast<long>(i)) != static_cast<long>(i) + 1000;
    }
  };
  Session outer;
  uprobe::Attachment ao(vaddr(lf_outer), outer);
  std::thread t1(hammer, 1), t2(hammer, 2);
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ::usleep(2000);
    ChildReport r;
    bool got = false;
    const int st = in_child(
        [&](ChildReport& c) {
          const std::uint64_t e0 = add.entries.load(), r0 = add.rets.load();
          for (std::uint64_t i = 0; i < 1000; ++i) c.v[0] += lf_add(i, 9) != i + 9;
          c.v[1] = add.entries.load() - e0;
          c.v[2] = add.rets.load() - r0;
          aa.detach();
          for (std::uint64_t i = 0; i < 10; ++i) c.v[0] += lf_add(i, 9) != i + 9;
          c.v[3] = add.entries.load() - e0;
          Session again;
          again.adds = true;
          uprobe::Attachment b(vaddr(lf_add), again);
          for (std::uint64_t i = 0; i < 500; ++i) c.v[0] += lf_add(i, 8) != i + 8;
          c.v[4] = again.entries.load();
          c.v[5] = again.rets.load();
          c.v[6] = again.bad.load();
          c.v[7] = uprobe::return_stack_depth();
        },
        r, got);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " " << r.msg;
    ASSERT_TRUE(got);
    EXPECT_EQ(r.v[0], 0u) << "wrong results in the child";
    EXPECT_EQ(r.v[1], 1000u);
    EXPECT_EQ(r.v[2], 1000u);
    EXPECT_EQ(r.v[3], 1000u) << "no hits after the child's detach";
    EXPECT_EQ(r.v[4], 500u);
    EXPECT_EQ(r.v[5], 500u);
    EXPECT_EQ(r.v[6], 0u);
    EXPECT_EQ(r.v[7], 0u);
  }
  stop = true;
  t1.join();
  t2.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(add.bad.load(), 0u);
  EXPECT_EQ(add.entries.load(), add.rets.load());
  EXPECT_EQ(outer.entries.load(), outer.rets.load());
}

// ----------------------------------------------------------- vfork+exec ----

std::uint64_t g_vfork_result = 0;
pid_t g_vfork_pid = -1;

__attribute__((noinline)) pid_t vfork_exec() {
  pid_t p = ::vfork();
  if (p == 0) {
    g_vfork_result = lf_add(20, 22);  // in the parent's memory, with the parent's TLS
    ::execl("/bin/sh", "sh", "-c", "exit 7", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return p;
}

long vfork_body(long a) {
  g_vfork_pid = vfork_exec();
  return a + 3;
}

TEST_P(Process, VforkChildCallsProbedCodeThenExecs) {
  Session add, outer;
  add.adds = true;
  uprobe::Attachment aa(vaddr(lf_add), add), ao(vaddr(lf_outer), outer);
  const uprobe::Stats s0 = uprobe::stats();
  g_outer_body = vfork_body;
  const long r = lf_outer(1);
  g_outer_body = nullptr;
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  ASSERT_GT(g_vfork_pid, 0);
  const int st = wait_child(g_vfork_pid, 60);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << status_str(st);
  EXPECT_EQ(r, 4);
  EXPECT_EQ(g_vfork_result, 42u);
  EXPECT_EQ(add.entries.load(), 1u) << "the vfork child's hit (shared memory)";
  EXPECT_EQ(add.rets.load(), 1u);
  EXPECT_EQ(add.bad.load(), 0u);
  EXPECT_EQ(outer.entries.load(), 1u);
  EXPECT_EQ(outer.rets.load(), 1u);
  EXPECT_EQ(outer.bad.load(), 0u);
  EXPECT_EQ(d.return_hits, 2u) << stats_str(d);
  EXPECT_EQ(d.return_dropped, 0u) << stats_str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  EXPECT_EQ(lf_add(2, 3), 5u);
  EXPECT_EQ(add.entries.load(), 2u);
}

long exit_body(long) { ::_exit(9); }

__attribute__((noinline)) pid_t vfork_exit_inside() {
  pid_t p = ::vfork();
  if (p == 0) {
    g_outer_body = exit_body;
    lf_outer(5);  // return-probed; _exit()s inside: its instance stays behind
    ::_exit(127);
  }
  return p;
}

long vfork_exit_body(long a) {
  g_vfork_pid = vfork_exit_inside();
  g_outer_body = nullptr;
  return a + 6;
}

/// The vfork child (our stack, our TLS) enters the return-probed lf_outer and
/// _exit()s inside it: its return instance is left on our return stack,
/// below our own pending one. Our return must still come back right (the
/// child's instance dropped as stale).
TEST_P(Process, VforkChildExitsInsideReturnProbedFunction) {
  Session outer;
  uprobe::Attachment ao(vaddr(lf_outer), outer);
  const uprobe::Stats s0 = uprobe::stats();
  g_outer_body = vfork_exit_body;
  const long r = lf_outer(1);
  g_outer_body = nullptr;
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  ASSERT_GT(g_vfork_pid, 0);
  const int st = wait_child(g_vfork_pid, 60);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 9) << status_str(st);
  EXPECT_EQ(r, 7);
  EXPECT_EQ(outer.entries.load(), 2u) << "ours and the child's";
  EXPECT_EQ(outer.rets.load(), 1u) << "only ours returned";
  EXPECT_EQ(outer.bad.load(), 0u);
  EXPECT_EQ(d.return_hits, 1u) << stats_str(d);
  EXPECT_EQ(d.return_dropped, 1u) << "the child's instance: " << stats_str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  EXPECT_EQ(lf_outer(3), 1003);
  EXPECT_EQ(outer.rets.load(), 2u);
}

// ------------------------------------------------------ vfork itself ----

/// A return probe on libc's vfork itself: the child returns from vfork
/// first, on our stack and with our TLS, and took our return instance; our
/// own return then found none (abort: uretprobe:libc:* killed every program
/// that called vfork) or an outer function's (a return to the wrong caller).
/// It is refused, naming why, with nothing changed (the bytes, vfork still
/// works); an entry probe on vfork counts each call once, in the parent.
TEST_P(Process, ReturnProbeOnVforkIsRefusedEntryProbeCounts) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  const uprobe::Symbol sym = uprobe::find_symbol(libc, "vfork");
  const auto addrs = uprobe::runtime_addresses(libc, sym.offset);
  ASSERT_EQ(addrs.size(), 1u);
  std::uint8_t before[8];
  std::memcpy(before, reinterpret_cast<const void*>(addrs[0]), sizeof before);
  auto vfork_exits = [](int code) {
    const pid_t p = ::vfork();
    if (p == 0) ::_exit(code);
    return p;
  };
  for (const char* name : {"vfork", "__vfork"}) {
    SCOPED_TRACE(name);
    const uprobe::Symbol alias = uprobe::find_symbol(libc, name);
    ASSERT_EQ(alias.offset, sym.offset);
    Session s;
    try {
      uprobe::Attachment a(libc, alias.offset, s);
      ADD_FAILURE() << "a return probe on vfork was accepted";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), uprobe::Errc::refused_instruction) << e.what();
      EXPECT_NE(std::string(e.what()).find("vfork returns twice in one address space"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(std::memcmp(before, reinterpret_cast<const void*>(addrs[0]), sizeof before), 0);
    const pid_t p = vfork_exits(5);
    ASSERT_GT(p, 0);
    const int st = wait_child(p, 60);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 5) << status_str(st);
    EXPECT_EQ(s.entries.load(), 0u);
  }
  Counter c;
  {
    uprobe::Attachment a(libc, sym.offset, c);
    for (int i = 0; i < 3; ++i) {
      const pid_t p = vfork_exits(10 + i);
      ASSERT_GT(p, 0);
      const int st = wait_child(p, 60);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 10 + i) << status_str(st);
    }
  }
  EXPECT_EQ(c.hits.load(), 3u);
  EXPECT_EQ(std::memcmp(before, reinterpret_cast<const void*>(addrs[0]), sizeof before), 0);
}

// ------------------------------------------- vfork child's sigaction ----

std::atomic<int> g_usr1_runs{0};
void on_usr1(int) { g_usr1_runs.fetch_add(1, std::memory_order_relaxed); }

/// A vfork child that resets the parent's handlers before its exec (as
/// Python's subprocess does): sigaction() in the child wrote libuprobe's
/// handler table, which is the parent's memory, and the parent's wrapper,
/// still in its kernel action, then found SIG_DFL and dropped every later
/// signal (Python's test_signal hung waiting for SIGHUP). The child's reset
/// is its own (it reads back SIG_DFL; SIGTRAP's stays libuprobe's: the probe
/// it hits after asking SIG_DFL for SIGTRAP counts and it lives); the
/// parent's handler runs for each signal and reads back as it was set.
TEST_P(Process, VforkChildResettingHandlersLeavesTheParentsAlone) {
  Counter add;
  uprobe::Attachment aa(vaddr(lf_add), add);
  struct sigaction sa {};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, nullptr), 0);
  struct sigaction trap_before {}, trap_prev {};  // the program's own SIGTRAP handler (foreign traps)
  trap_before.sa_handler = on_usr1;
  sigemptyset(&trap_before.sa_mask);
  ASSERT_EQ(::sigaction(SIGTRAP, &trap_before, &trap_prev), 0);
  g_usr1_runs = 0;
  static volatile int child_saw = -1;
  const pid_t p = ::vfork();
  if (p == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    struct sigaction now {};
    int bad = ::sigaction(SIGUSR1, &dfl, nullptr) != 0;
    bad |= ::sigaction(SIGUSR1, nullptr, &now) != 0 || now.sa_handler != SIG_DFL;
    bad |= ::sigaction(SIGTRAP, &dfl, nullptr) != 0;
    child_saw = static_cast<int>(lf_add(40, 2));  // a probe hit after the child's SIGTRAP reset
    ::_exit(bad ? 3 : 0);
  }
  ASSERT_GT(p, 0);
  const int st = wait_child(p, 60);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
  EXPECT_EQ(child_saw, 42);
  EXPECT_EQ(add.hits.load(), 1u) << "the child's hit (shared memory)";
  for (int i = 1; i <= 3; ++i) {
    ASSERT_EQ(::raise(SIGUSR1), 0);
    EXPECT_EQ(g_usr1_runs.load(), i) << "the parent's SIGUSR1 handler did not run";
  }
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGUSR1, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, on_usr1);
  struct sigaction trap_after {};
  ASSERT_EQ(::sigaction(SIGTRAP, nullptr, &trap_after), 0);
  EXPECT_EQ(trap_after.sa_handler, trap_before.sa_handler);
  EXPECT_EQ(lf_add(1, 2), 3u);
  EXPECT_EQ(add.hits.load(), 2u);
  sa.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, nullptr), 0);
  ASSERT_EQ(::sigaction(SIGTRAP, &trap_prev, nullptr), 0);
}

// ---------------------------------------------------------- posix_spawn ----

int g_spawn_rc = -1;
pid_t g_spawn_pid = -1;

long spawn_body(long a) {
  const char* argv[] = {"sh", "-c", "exit 5", nullptr};
  g_spawn_rc = ::posix_spawn(&g_spawn_pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ);
  return a + 4;
}

/// posix_spawn() itself carries an entry+return probe (it runs in the parent)
/// and our own return is in flight; the spawn child (CLONE_VM | CLONE_VFORK,
/// its own stack, our memory and TLS) runs and execs normally.
TEST_P(Process, PosixSpawnWithReturnsInFlight) {
  // libc's own posix_spawn: the global scope's may be an interposer (ASan's
  // interceptor, which calls libc's; libuprobe refuses to probe the sanitizer runtime).
  void* const libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  void* spawn_addr = ::dlsym(libc, "posix_spawn");
  ::dlclose(libc);
  ASSERT_NE(spawn_addr, nullptr);
  Session sp, outer;
  Session add;
  add.adds = true;
  uprobe::Attachment as(spawn_addr, sp), ao(vaddr(lf_outer), outer), aa(vaddr(lf_add), add);
  const uprobe::Stats s0 = uprobe::stats();
  g_outer_body = spawn_body;
  const long r = lf_outer(1);
  g_outer_body = nullptr;
  ASSERT_EQ(g_spawn_rc, 0);
  const int st = wait_child(g_spawn_pid, 60);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 5) << status_str(st);
  EXPECT_EQ(r, 5);
  EXPECT_EQ(sp.entries.load(), 1u);
  EXPECT_EQ(sp.rets.load(), 1u);
  EXPECT_EQ(sp.bad.load(), 0u);
  EXPECT_EQ(outer.rets.load(), 1u) << "our own return in flight";
  EXPECT_EQ(outer.bad.load(), 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(lf_add(i, 5), i + 5);
  EXPECT_EQ(add.rets.load(), 10u);
  EXPECT_EQ(add.bad.load(), 0u);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(d.return_hits, 12u) << stats_str(d);
  EXPECT_EQ(d.return_misses + d.return_dropped, 0u) << stats_str(d);
}

/// KNOWN LIMITATION (disabled): glibc's posix_spawn child resets every
/// handled signal to SIG_DFL with a raw rt_sigaction before it calls execve,
/// so an int3 probe on code that child runs (here: libc's execve) kills it
/// by SIGTRAP; the kernel's uprobes need no signal handler. See the report
/// of the tests/life work.
TEST_P(Process, DISABLED_PosixSpawnThroughInt3ProbedExecve) {
  void* const libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  void* execve_addr = ::dlsym(libc, "execve");
  ::dlclose(libc);
  ASSERT_NE(execve_addr, nullptr);
  Session ex, outer;
  uprobe::Attachment ae(execve_addr, ex), ao(vaddr(lf_outer), outer);
  g_outer_body = spawn_body;
  const long r = lf_outer(1);
  g_outer_body = nullptr;
  ASSERT_EQ(g_spawn_rc, 0);
  const int st = wait_child(g_spawn_pid, 60);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 5) << status_str(st);
  EXPECT_EQ(r, 5);
  EXPECT_EQ(ex.entries.load(), 1u) << "the spawn child's execve (shared memory)";
  EXPECT_EQ(ex.rets.load(), 0u) << "a successful execve does not return";
  EXPECT_EQ(outer.rets.load(), 1u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

// ------------------------------------------------------- clone(CLONE_VM) ----

struct CloneCtx {
  Session* add;
  std::uint64_t wrong = 0;
  std::uint64_t depth_after = 99;
  void* stack = nullptr;
  std::size_t stack_size = 0;
  pid_t pid = -1;
  int status = -1;
};
CloneCtx* g_clone = nullptr;

int clone_child(void* arg) {
  auto* c = static_cast<CloneCtx*>(arg);
  for (std::uint64_t i = 0; i < 100; ++i) c->wrong += lf_add(i, 7) != i + 7;
  c->depth_after = uprobe::return_stack_depth();
  return 0;
}

/// Runs inside lf_outer: the parent has a return in flight while the child
/// (sharing memory and TLS, on its own stack) runs return-probed code.
long clone_body(long a) {
  CloneCtx& c = *g_clone;
  char* top = static_cast<char*>(c.stack) + c.stack_size;
  c.pid = ::clone(clone_child, top, CLONE_VM | SIGCHLD, &c);
  if (c.pid > 0) c.status = wait_child(c.pid, 60);
  return a + 5;
}

struct CloneThreadArg {
  CloneCtx* ctx;
  long r = 0;
  std::uint64_t depth = 99;
};

void* clone_thread(void* p) {
  auto* t = static_cast<CloneThreadArg*>(p);
  g_clone = t->ctx;
  g_outer_body = clone_body;
  t->r = lf_outer(10);
  g_outer_body = nullptr;
  t->depth = uprobe::return_stack_depth();
  return nullptr;
}

void check_clone(bool child_stack_above) {
  Session add, outer;
  add.adds = true;
  uprobe::Attachment aa(vaddr(lf_add), add), ao(vaddr(lf_outer), outer);
  // One region: the parent thread's stack and the child's, in the order asked.
  const std::size_t kStack = 1 << 20;
  void* region = ::mmap(nullptr, 2 * kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* base = static_cast<std::uint8_t*>(region);
  CloneCtx ctx;
  ctx.add = &add;
  ctx.stack = child_stack_above ? base + kStack : base;
  ctx.stack_size = kStack;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstack(&attr, child_stack_above ? base : base + kStack, kStack), 0);
  const uprobe::Stats s0 = uprobe::stats();
  CloneThreadArg t{&ctx};
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, &attr, clone_thread, &t), 0);
  ASSERT_EQ(pthread_join(th, nullptr), 0);
  pthread_attr_destroy(&attr);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  ::munmap(region, 2 * kStack);
  ASSERT_GT(ctx.pid, 0);
  EXPECT_TRUE(WIFEXITED(ctx.status) && WEXITSTATUS(ctx.status) == 0) << status_str(ctx.status);
  EXPECT_EQ(ctx.wrong, 0u);
  EXPECT_EQ(ctx.depth_after, 1u) << "in the child: only the parent's pending return (shared TLS)";
  EXPECT_EQ(add.entries.load(), 100u);
  EXPECT_EQ(add.rets.load(), 100u);
  EXPECT_EQ(add.bad.load(), 0u);
  EXPECT_EQ(t.r, 15);
  EXPECT_EQ(t.depth, 0u);
  EXPECT_EQ(outer.rets.load(), 1u) << "the parent's return in flight came back through its ret_handler";
  EXPECT_EQ(outer.bad.load(), 0u);
  EXPECT_EQ(d.return_hits, 101u) << stats_str(d);
  EXPECT_EQ(d.return_dropped, 0u) << stats_str(d);
  EXPECT_EQ(d.return_misses, 0u) << stats_str(d);
}

TEST_P(Process, CloneVmChildStackBelowParent) { check_clone(false); }
TEST_P(Process, CloneVmChildStackAboveParent) { check_clone(true); }


// ------------------------------------------------ file descriptors ----

/// The numbers in /proc/self/fd, sorted (the directory's own excluded).
std::vector<int> open_fds() {
  std::vector<int> fds;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return {-1};
  for (dirent* e; (e = ::readdir(d)) != nullptr;)
    if (e->d_name[0] != '.' && std::atoi(e->d_name) != ::dirfd(d)) fds.push_back(std::atoi(e->d_name));
  ::closedir(d);
  std::sort(fds.begin(), fds.end());
  return fds;
}

/// The R-X mappings of libuprobe's XOL memory ([start, end) each), from
/// /proc/self/maps.
std::vector<std::pair<std::uint64_t, std::uint64_t>> xol_mappings() {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return out;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::strstr(line, "libuprobe-xol") && std::sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) == 3 &&
        std::strcmp(perms, "r-xs") == 0)
      out.emplace_back(lo, hi);
  }
  std::fclose(f);
  return out;
}

using StrverscmpFn = int (*)(const char*, const char*);

/// A program that closes every descriptor but its own while probes are
/// attached (as daemons do, and Python's subprocess in its children, with
/// close_range()), opens files of its own that take the lowest free numbers,
/// and then has new probes attached that need new XOL memory: a slot or stub
/// next to its code (a region made before) and, for a libc function, a region
/// of its own. libuprobe holds no descriptor across calls (the kernel's
/// uprobes add none to the process), so nothing of its memory goes through a
/// number the program reused: every hit is counted, every probed function
/// returns what it computes, the program's files keep their bytes and it
/// sees the descriptors it has, before and after each attach and detach.
/// (libuprobe kept each region's memfd open and mapped a later RW alias from
/// it: here that number named one of the program's files.)
TEST_P(Process, ProgramClosingEveryDescriptorThenNewProbesNeedNewMemory) {
  // Attaching and detaching leave the descriptors as they were.
  const std::vector<int> fds0 = open_fds();
  {
    Counter c;
    uprobe::Attachment a(vaddr(lf_add), c);
    EXPECT_EQ(open_fds(), fds0) << "descriptors after an attach";
    EXPECT_EQ(lf_add(2, 3), 5u);
    EXPECT_EQ(c.hits.load(), 1u);
  }
  EXPECT_EQ(open_fds(), fds0) << "descriptors after a detach";

  void* const libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  auto* const verscmp = reinterpret_cast<StrverscmpFn>(::dlsym(libc, "strverscmp"));
  ::dlclose(libc);
  ASSERT_NE(verscmp, nullptr);
  constexpr int kVictims = 16;
  constexpr std::size_t kVictimSize = 64 * 1024;
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ChildReport r;
    const int rep = pfd[1];
    Counter add, mul, mov, vers;
    uprobe::Attachment aa(vaddr(lf_add), add);  // XOL memory near the program's code
    for (std::uint64_t i = 0; i < 3; ++i) r.v[0] += lf_add(i, 4) != i + 4;
    // Every descriptor from 3 on but the report pipe.
    r.v[1] = rep > 3 && ::close_range(3, static_cast<unsigned>(rep - 1), 0) != 0;
    r.v[1] += ::close_range(static_cast<unsigned>(rep + 1), ~0u, 0) != 0;
    // The program's files, in the lowest free numbers, each 64 KiB of 0xa5.
    std::vector<std::uint8_t> pattern(kVictimSize, 0xa5);
    int victims[kVictims];
    for (int& v : victims) {
      v = ::memfd_create("victim", 0);
      r.v[2] += v < 0 || ::pwrite(v, pattern.data(), kVictimSize, 0) != static_cast<ssize_t>(kVictimSize);
    }
    const std::vector<int> fds1 = open_fds();
    const auto xol0 = xol_mappings();
    const auto site = reinterpret_cast<std::uint64_t>(verscmp);
    bool in_reach = false;  // a region made by an earlier test of this process
    for (const auto& [lo, hi] : xol0)
      in_reach |= (lo > site ? lo - site : site - lo) < (1ull << 30) && (hi > site ? hi - site : site - hi) < (1ull << 30);
    {
      // A stub (optimized) near the program's code, an XOL slot for the mov
      // at lf_mul + 5 (or a window), and libc's strverscmp: a new region.
      uprobe::Attachment am(vaddr(lf_mul), mul), av(at(lf_mul, 5), mov), as(reinterpret_cast<void*>(verscmp), vers);
      r.v[3] = open_fds() != fds1;
      const auto xol1 = xol_mappings();
      r.v[4] = in_reach ? 2 : xol1.size() > xol0.size();
      for (std::uint64_t i = 0; i < 4; ++i) r.v[5] += lf_mul(i, 7) != i * 7;
      for (std::uint64_t i = 0; i < 2; ++i) r.v[5] += lf_add(i, 9) != i + 9;
      for (int i = 0; i < 5; ++i) r.v[5] += verscmp("libfoo-1.9", "libfoo-1.10") >= 0;
      r.v[6] = add.hits.load();   // 5
      r.v[7] = mul.hits.load();   // 4
      r.v[8] = mov.hits.load();   // 4
      r.v[9] = vers.hits.load();  // 5
    }
    r.v[10] = open_fds() != fds1;
    std::vector<std::uint8_t> back(kVictimSize);
    for (const int v : victims)
      r.v[11] += v < 0 || ::pread(v, back.data(), kVictimSize, 0) != static_cast<ssize_t>(kVictimSize) ||
                 back != pattern;
    write_all(rep, &r, sizeof r);
    ::_exit(0);
  }
  ::close(pfd[1]);
  ChildReport rep;
  const bool got = read_all(pfd[0], &rep, sizeof rep) == sizeof rep;
  ::close(pfd[0]);
  const int st = wait_child(pid, 60);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
  ASSERT_TRUE(got);
  EXPECT_EQ(rep.v[0], 0u) << "wrong lf_add results before the close";
  EXPECT_EQ(rep.v[1], 0u) << "close_range failed";
  EXPECT_EQ(rep.v[2], 0u) << "the program's files could not be made";
  EXPECT_EQ(rep.v[3], 0u) << "the new probes changed the descriptors the program sees";
  EXPECT_NE(rep.v[4], 0u) << "no new XOL region for strverscmp (none was in reach)";
  EXPECT_EQ(rep.v[5], 0u) << "wrong results from probed functions";
  EXPECT_EQ(rep.v[6], 5u);
  EXPECT_EQ(rep.v[7], 4u);
  EXPECT_EQ(rep.v[8], 4u);
  EXPECT_EQ(rep.v[9], 5u);
  EXPECT_EQ(rep.v[10], 0u) << "the detaches changed the descriptors the program sees";
  EXPECT_EQ(rep.v[11], 0u) << "a file of the program changed (XOL code written into it)";
  EXPECT_EQ(open_fds(), fds0);
}

/// A program that has used up its descriptors and calls dlopen() of a
/// library already loaded (the dynamic linker needs no descriptor for it)
/// and dlclose(): libuprobe's resync after each cannot read /proc/self/maps
/// (EMFILE), and its error must not reach the program (dlopen's caller is C:
/// an exception there ended the program with std::terminate()). Both calls
/// return as without libuprobe, the probe keeps counting exactly, and once
/// descriptors are free again the next dlopen()'s resync works.
TEST_P(Process, DlopenWithEveryDescriptorTakenLeavesTheProgramRunning) {
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [&](ChildReport& c) {
        Counter add;
        uprobe::Attachment aa(vaddr(lf_add), add);
        for (std::uint64_t i = 0; i < 3; ++i) c.v[0] += lf_add(i, 4) != i + 4;
        rlimit lim{};
        ::getrlimit(RLIMIT_NOFILE, &lim);
        const rlimit low{64, lim.rlim_max};
        c.v[1] = ::setrlimit(RLIMIT_NOFILE, &low) != 0;
        std::vector<int> taken;
        for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
        c.v[2] = errno == EMFILE;
        void* h = ::dlopen("libc.so.6", RTLD_NOW);  // (loaded: no descriptor needed)
        c.v[3] = h != nullptr;
        c.v[4] = h && ::dlclose(h) == 0;
        for (std::uint64_t i = 0; i < 4; ++i) c.v[0] += lf_add(i, 5) != i + 5;
        for (const int fd : taken) ::close(fd);
        ::setrlimit(RLIMIT_NOFILE, &lim);
        void* again = ::dlopen("libc.so.6", RTLD_NOW);
        c.v[5] = again != nullptr && ::dlclose(again) == 0;
        for (std::uint64_t i = 0; i < 2; ++i) c.v[0] += lf_add(i, 6) != i + 6;
        c.v[6] = add.hits.load();
      },
      r, got);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " " << r.msg;
  ASSERT_TRUE(got);
  EXPECT_EQ(r.v[0], 0u) << "wrong lf_add results";
  EXPECT_EQ(r.v[1], 0u) << "setrlimit failed";
  EXPECT_EQ(r.v[2], 1u) << "the descriptors were not used up";
  EXPECT_EQ(r.v[3], 1u) << "dlopen failed";
  EXPECT_EQ(r.v[4], 1u) << "dlclose failed";
  EXPECT_EQ(r.v[5], 1u) << "dlopen/dlclose failed once descriptors were free";
  EXPECT_EQ(r.v[6], 9u);
}

}  // namespace
