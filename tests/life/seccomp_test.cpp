// SPDX-License-Identifier: MIT
// The int3 path makes no system call but rt_sigreturn: a forked child
// attaches probes (entry + return) with Config::optimize off, warms them up,
// installs a strict seccomp filter (read, write, exit_group, rt_sigreturn,
// futex only) and calls the probed functions 1000 times each: an emulated
// nop5 entry with a return probe, an out-of-line site. Then the same with an
// optimized site carrying a return probe and a default (vector-saving)
// consumer (tests/opt/seccomp_test.cpp covers an entry-only integer
// consumer). Any other system call raises SIGSYS; the child's SIGSYS handler
// reports its number through the pipe.

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <tuple>

#include "life_common.hpp"

using namespace lifetest;

namespace {

/// This suite's site inside a function is an out-of-line int3 site (what it
/// checks is that path under a filter): windows inside functions stay off
/// (Config::optimize_windows; tests/opt/window_test.cpp covers them).
[[maybe_unused]] testing::Environment* const g_windows_off =
    testing::AddGlobalTestEnvironment(windows_off_environment());

int g_wr = -1;

// Leaves the child under the filter with exit_group, not through a call of a
// noreturn function such as _exit(): ASan precedes each of those with
// __asan_handle_no_return, whose sigaltstack() the filter forbids (a system
// call of the test's own exit, not of the probe path under test).
#define UNDER_FILTER_EXIT(code)              \
  do {                                       \
    ::syscall(SYS_exit_group, (code));       \
    __builtin_unreachable();                 \
  } while (0)

void on_sigsys(int, siginfo_t* si, void*) {
  ChildReport r;
  r.v[15] = 0x5157;  // marker: a forbidden system call
  r.v[14] = static_cast<std::uint64_t>(si->si_syscall);
  write_all(g_wr, &r, sizeof r);
  UNDER_FILTER_EXIT(4);
}

int install_filter() {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_read, 5, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_write, 4, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit_group, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigreturn, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_futex, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 10;
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return 11;
  return 0;
}

/// Runs in the child; the pipe's write end is g_wr.
[[noreturn]] void child(Kind kind) {
  use_kind(kind);
  static Session add;
  static Counter xol;
  add.adds = true;
  uprobe::Attachment aa(vaddr(lf_add), add), ax(at(lf_xmm_pushed, lf_xmm_pushed_site), xol);
  ChildReport r;
  r.v[0] = uprobe::probe_info(aa.probe()).mode == kind_mode(kind);
  r.v[1] = uprobe::probe_info(ax.probe()).emulated ? 0 : 1;
  std::uint64_t src[2] = {7, 9}, dst[2];
  // Warm-up: the thread's return stack and caches exist before the filter.
  lf_add(1, 1);
  lf_xmm_pushed(src, dst);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGSYS, &sa, nullptr) != 0) ::_exit(5);
  const uprobe::Stats s0 = uprobe::stats();
  if (int rc = install_filter()) ::_exit(rc);
  // From here on: only read, write, exit_group, rt_sigreturn, futex.
  for (std::uint64_t i = 0; i < 1000; ++i) {
    r.v[2] += lf_add(i, 3) != i + 3;
    src[0] = i;
    r.v[2] += lf_xmm_pushed(src, dst) != i * 5;
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  r.v[3] = add.entries.load();
  r.v[4] = add.rets.load();
  r.v[5] = add.bad.load();
  r.v[6] = xol.hits.load();
  r.v[7] = d.hits;
  r.v[8] = d.return_hits;
  r.v[9] = d.out_of_line;
  write_all(g_wr, &r, sizeof r);
  UNDER_FILTER_EXIT(0);
}

class Seccomp : public ::testing::TestWithParam<Kind> {
 protected:
  ConfigGuard guard;
};
INSTANTIATE_TEST_SUITE_P(Kinds, Seccomp, ::testing::Values(Kind::int3, Kind::optimized),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

TEST_P(Seccomp, ProbedCallsUnderStrictFilter) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(p[0]);
    g_wr = p[1];
    child(GetParam());
  }
  ::close(p[1]);
  ChildReport r;
  const bool got = read_all(p[0], &r, sizeof r) == sizeof r;
  ::close(p[0]);
  const int st = wait_child(pid, 60);
  if (got && r.v[15] == 0x5157) ADD_FAILURE() << "the child made system call " << r.v[14] << " under the filter";
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " (4: SIGSYS, 5: sigaction, 10/11: prctl)";
  ASSERT_TRUE(got);
  EXPECT_EQ(r.v[0], 1u) << "probe mode";
  EXPECT_EQ(r.v[1], 1u) << "the imul site runs out of line";
  EXPECT_EQ(r.v[2], 0u) << "wrong results";
  EXPECT_EQ(r.v[3], 1001u);
  EXPECT_EQ(r.v[4], 1001u);
  EXPECT_EQ(r.v[5], 0u);
  EXPECT_EQ(r.v[6], 1001u);
  EXPECT_EQ(r.v[7], 2000u) << "hits under the filter";
  EXPECT_EQ(r.v[8], 1000u) << "return hits under the filter";
  EXPECT_EQ(r.v[9], 1000u) << "out-of-line hits under the filter";
}

// ------------------------------------------------------------------------
// No warm-up: a program that attaches a return probe, an entry probe and an
// out-of-line int3 probe, starts a thread, and then installs a filter that
// forbids memory mapping (mmap, munmap, mprotect, mremap: SIGSYS, or EPERM)
// for all its threads. Its first hits, on the main thread, on the thread
// started before the filter and on one started after it (on a stack the
// program mapped before; glibc maps none then), need nothing mapped: no
// return stack, no XOL slot, no TLS. The thread created after the filter is
// ready for hits from its start (pthread_create() is interposed).

constexpr int kCalls = 1000;

/// The thread id the filter was called with, for the handler that follows.
__thread pid_t t_filter_tid;

/// Counts hits per thread: [0] main, [1] started before the filter, [2]
/// started after it (by the tid the filter is given, which must be the
/// thread's own: libuprobe caches it before the thread's first hit).
struct PerThread : uprobe::Consumer {
  explicit PerThread(uprobe::Callbacks cb = uprobe::Callbacks::entry) : uprobe::Consumer(cb) {}
  std::atomic<pid_t> tids[3] = {};
  std::atomic<std::uint64_t> hits[3] = {}, rets[3] = {}, other{0}, bad{0};
  int slot_of(pid_t t) {
    for (int i = 0; i < 3; ++i)
      if (tids[i].load(std::memory_order_relaxed) == t) return i;
    return -1;
  }
  bool filter(pid_t tid) override {
    t_filter_tid = tid;
    return true;
  }
  uprobe::Action handler(uprobe::Regs&) override {
    const int i = slot_of(t_filter_tid);
    (i < 0 ? other : hits[i]).fetch_add(1, std::memory_order_relaxed);
    if (t_filter_tid != static_cast<pid_t>(::syscall(SYS_gettid))) bad.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs& r, std::uint64_t) override {
    const int i = slot_of(static_cast<pid_t>(::syscall(SYS_gettid)));
    (i < 0 ? other : rets[i]).fetch_add(1, std::memory_order_relaxed);
    if (r.rax != r.rdi * r.rsi) bad.fetch_add(1, std::memory_order_relaxed);
  }
};

int install_no_mapping_filter(bool trap) {
  const std::uint32_t action = trap ? SECCOMP_RET_TRAP : SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 4, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_munmap, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mremap, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, action),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 10;
  // Every thread of the process, and the threads they create later.
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) return 11;
  return 0;
}

PerThread* g_ret = nullptr;  // return probe on lf_mul
PerThread* g_entry = nullptr;  // entry probe on lf_add
PerThread* g_xol = nullptr;  // int3 probe at lf_xmm_pushed's imul (an XOL slot)
std::atomic<int> g_go{0};
std::atomic<std::uint64_t> g_wrong{0};

void calls(int who) {
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  for (PerThread* c : {g_ret, g_entry, g_xol}) c->tids[who].store(tid, std::memory_order_relaxed);
  std::uint64_t src[2] = {0, 0}, dst[2] = {1, 1};
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    if (lf_mul(i, 7) != i * 7) g_wrong.fetch_add(1, std::memory_order_relaxed);
    if (lf_add(i, 3) != i + 3) g_wrong.fetch_add(1, std::memory_order_relaxed);
    src[0] = i;
    if (lf_xmm_pushed(src, dst) != i * 5 || dst[0] != i) g_wrong.fetch_add(1, std::memory_order_relaxed);
  }
}

void* before_filter_thread(void*) {
  while (g_go.load(std::memory_order_acquire) == 0) ::sched_yield();
  calls(1);
  return nullptr;
}

void* after_filter_thread(void*) {
  calls(2);
  return nullptr;
}

[[noreturn]] void child_no_mapping(Kind kind, bool trap) {
  use_kind(kind);
  static PerThread ret(uprobe::Callbacks::ret), entry, xol;
  g_ret = &ret, g_entry = &entry, g_xol = &xol;
  uprobe::Attachment ar(vaddr(lf_mul), ret), ae(vaddr(lf_add), entry), ax(at(lf_xmm_pushed, lf_xmm_pushed_site), xol);
  ChildReport r;
  r.v[0] = uprobe::probe_info(ae.probe()).mode == kind_mode(kind);
  r.v[1] = uprobe::probe_info(ax.probe()).emulated ? 0 : 1;
  pthread_t before, after;
  if (pthread_create(&before, nullptr, before_filter_thread, nullptr) != 0) ::_exit(6);
  // The thread created after the filter runs on a stack mapped now.
  constexpr std::size_t kStack = 256 * 1024;
  void* stack = ::mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (stack == MAP_FAILED) ::_exit(7);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, stack, kStack);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGSYS, &sa, nullptr) != 0) ::_exit(5);
  const uprobe::Stats s0 = uprobe::stats();
  if (int rc = install_no_mapping_filter(trap)) ::_exit(rc);
  // From here on no thread of this process maps, unmaps or protects memory.
  calls(0);
  g_go.store(1, std::memory_order_release);
  if (pthread_join(before, nullptr) != 0) ::_exit(8);
  if (pthread_create(&after, &attr, after_filter_thread, nullptr) != 0) ::_exit(9);
  if (pthread_join(after, nullptr) != 0) ::_exit(12);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  for (int i = 0; i < 3; ++i) {
    r.v[2 + i] = ret.rets[i].load();
    r.v[5 + i] = entry.hits[i].load();
    r.v[8 + i] = xol.hits[i].load();
  }
  r.v[11] = g_wrong.load() + ret.bad.load() + ret.other.load() + entry.other.load() + xol.other.load() +
            entry.bad.load() + xol.bad.load();
  r.v[12] = d.hits;
  r.v[13] = d.return_hits;
  r.v[14] = d.return_misses + d.foreign_traps + d.recursion_misses;
  write_all(g_wr, &r, sizeof r);
  UNDER_FILTER_EXIT(0);
}

class SeccompNoMapping : public ::testing::TestWithParam<std::tuple<Kind, bool>> {
 protected:
  ConfigGuard guard;
};
INSTANTIATE_TEST_SUITE_P(Kinds, SeccompNoMapping,
                         ::testing::Combine(::testing::Values(Kind::int3, Kind::optimized), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(kind_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_sigsys" : "_eperm");
                         });

TEST_P(SeccompNoMapping, FirstHitsOfEveryThreadMapNothing) {
  const Kind kind = std::get<0>(GetParam());
  const bool trap = std::get<1>(GetParam());
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(p[0]);
    g_wr = p[1];
    child_no_mapping(kind, trap);
  }
  ::close(p[1]);
  ChildReport r;
  const bool got = read_all(p[0], &r, sizeof r) == sizeof r;
  ::close(p[0]);
  const int st = wait_child(pid, 60);
  if (got && r.v[15] == 0x5157) ADD_FAILURE() << "the child made system call " << r.v[14] << " under the filter";
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << status_str(st) << " (4: SIGSYS, 5: sigaction, 6-9/12: threads, 10/11: filter)";
  ASSERT_TRUE(got);
  EXPECT_EQ(r.v[0], 1u) << "probe mode";
  EXPECT_EQ(r.v[1], 1u) << "the imul site runs out of line";
  const char* who[3] = {"main thread", "thread started before the filter", "thread started after the filter"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.v[2 + i], static_cast<std::uint64_t>(kCalls)) << "returns of lf_mul on the " << who[i];
    EXPECT_EQ(r.v[5 + i], static_cast<std::uint64_t>(kCalls)) << "entries of lf_add on the " << who[i];
    EXPECT_EQ(r.v[8 + i], static_cast<std::uint64_t>(kCalls)) << "out-of-line hits on the " << who[i];
  }
  EXPECT_EQ(r.v[11], 0u) << "wrong results, or hits on no known thread";
  EXPECT_EQ(r.v[12], 3u * 3 * kCalls) << "hits under the filter (the return probe's entries count too)";
  EXPECT_EQ(r.v[13], 3u * kCalls) << "return hits under the filter";
  EXPECT_EQ(r.v[14], 0u) << "return misses, foreign traps, recursion misses";
}

// A thread started before a strict filter (read, write, exit_group,
// rt_sigreturn, futex only, for every thread) takes its first hits under it:
// pthread_create() made it ready (thread id cached, RCU reader registered)
// before its start routine ran, so they need no system call, where a first
// hit would otherwise register it (rt_sigprocmask: SIGSYS here). It never
// exits under the filter (its exit unregisters it); the process ends with
// exit_group.

std::atomic<int> g_strict_go{0}, g_strict_done{0};
std::atomic<pid_t> g_strict_tid{0};

/// Hits only from the thread the test started: the filter's argument must
/// be that thread's id, cached before the filter (gettid is forbidden).
struct TidChecked : Counter {
  std::atomic<std::uint64_t> bad_tid{0};
  bool filter(pid_t tid) override {
    if (tid != g_strict_tid.load(std::memory_order_relaxed)) bad_tid.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
};

void* strict_thread(void*) {
  g_strict_tid.store(static_cast<pid_t>(::syscall(SYS_gettid)), std::memory_order_relaxed);
  while (g_strict_go.load(std::memory_order_acquire) == 0) __builtin_ia32_pause();
  std::uint64_t wrong = 0, src[2] = {0, 0}, dst[2];
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    wrong += lf_add(i, 3) != i + 3;
    src[0] = i;
    wrong += lf_xmm_pushed(src, dst) != i * 5;
  }
  g_strict_done.store(wrong == 0 ? 1 : 2, std::memory_order_release);
  for (;;) __builtin_ia32_pause();  // exit_group ends it
}

int install_strict_filter_all_threads() {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_read, 5, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_write, 4, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit_group, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigreturn, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_futex, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 10;
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) return 11;
  return 0;
}

[[noreturn]] void child_strict_thread(Kind kind) {
  use_kind(kind);
  static Session session;
  static TidChecked xol;
  session.adds = true;
  uprobe::Attachment as(vaddr(lf_add), session), ax(at(lf_xmm_pushed, lf_xmm_pushed_site), xol);
  ChildReport r;
  r.v[0] = uprobe::probe_info(as.probe()).mode == kind_mode(kind);
  pthread_t t;
  if (pthread_create(&t, nullptr, strict_thread, nullptr) != 0) ::_exit(6);
  while (g_strict_tid.load(std::memory_order_relaxed) == 0) __builtin_ia32_pause();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGSYS, &sa, nullptr) != 0) ::_exit(5);
  const uprobe::Stats s0 = uprobe::stats();
  if (int rc = install_strict_filter_all_threads()) ::_exit(rc);
  // From here on, in every thread: only read, write, exit_group, rt_sigreturn, futex.
  g_strict_go.store(1, std::memory_order_release);
  while (g_strict_done.load(std::memory_order_acquire) == 0) __builtin_ia32_pause();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  r.v[1] = g_strict_done.load() == 1 ? 0 : 1;
  r.v[2] = session.entries.load();
  r.v[3] = session.rets.load();
  r.v[4] = session.bad.load();
  r.v[5] = xol.hits.load();
  r.v[6] = xol.bad_tid.load();
  r.v[7] = d.hits;
  r.v[8] = d.return_hits;
  r.v[9] = d.return_misses + d.foreign_traps + d.recursion_misses;
  write_all(g_wr, &r, sizeof r);
  UNDER_FILTER_EXIT(0);
}

class SeccompStrictThread : public ::testing::TestWithParam<Kind> {
 protected:
  ConfigGuard guard;
};
INSTANTIATE_TEST_SUITE_P(Kinds, SeccompStrictThread, ::testing::Values(Kind::int3, Kind::optimized),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

TEST_P(SeccompStrictThread, ThreadStartedBeforeTheFilterHitsWithoutSystemCalls) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(p[0]);
    g_wr = p[1];
    child_strict_thread(GetParam());
  }
  ::close(p[1]);
  ChildReport r;
  const bool got = read_all(p[0], &r, sizeof r) == sizeof r;
  ::close(p[0]);
  const int st = wait_child(pid, 60);
  if (got && r.v[15] == 0x5157) ADD_FAILURE() << "the child made system call " << r.v[14] << " under the filter";
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " (4: SIGSYS, 5: sigaction, 6: thread, 10/11: filter)";
  ASSERT_TRUE(got);
  EXPECT_EQ(r.v[0], 1u) << "probe mode";
  EXPECT_EQ(r.v[1], 0u) << "wrong results";
  EXPECT_EQ(r.v[2], static_cast<std::uint64_t>(kCalls)) << "entries";
  EXPECT_EQ(r.v[3], static_cast<std::uint64_t>(kCalls)) << "returns";
  EXPECT_EQ(r.v[4], 0u) << "bad sessions";
  EXPECT_EQ(r.v[5], static_cast<std::uint64_t>(kCalls)) << "out-of-line hits";
  EXPECT_EQ(r.v[6], 0u) << "filter calls with another thread id than the thread's";
  EXPECT_EQ(r.v[7], 2u * kCalls) << "hits under the filter";
  EXPECT_EQ(r.v[8], static_cast<std::uint64_t>(kCalls)) << "return hits under the filter";
  EXPECT_EQ(r.v[9], 0u) << "return misses, foreign traps, recursion misses";
}

}  // namespace
