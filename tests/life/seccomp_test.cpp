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
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "life_common.hpp"

using namespace lifetest;

namespace {

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

}  // namespace
