// SPDX-License-Identifier: MIT
// The optimized path makes no system call: a forked child attaches an
// optimized probe (consumer with set_vector_state_unused()), then installs a
// strict seccomp filter (read, write, exit_group, rt_sigreturn, futex only),
// calls the probed function 1000 times and writes the hit count to a pipe.
// Any other system call raises SIGSYS (SECCOMP_RET_TRAP); the child's SIGSYS
// handler reports the system call number through the pipe and exits, so a
// failure names the call.

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "int_consumers.hpp"
#include "opt_common.hpp"

using namespace opttest;

namespace {

constexpr std::uint64_t kMagicOk = 0x0c0ffee000000001ull;
constexpr std::uint64_t kMagicSigsys = 0x0c0ffee000000002ull;

int g_pipe_wr = -1;

void on_sigsys(int, siginfo_t* si, void*) {
  std::uint64_t msg[4] = {kMagicSigsys, static_cast<std::uint64_t>(si->si_syscall),
                          reinterpret_cast<std::uint64_t>(si->si_call_addr), 0};
  (void)!::write(g_pipe_wr, msg, sizeof msg);
  ::_exit(4);
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

[[noreturn]] void child(int wr) {
  g_pipe_wr = wr;
  static IntCounter c;
  uprobe::Uprobe* p = nullptr;
  try {
    p = uprobe::register_uprobe(vaddr(opt_secc), c);
    if (uprobe::probe_info(p).mode != uprobe::ProbeMode::optimized_nop5) ::_exit(3);
  } catch (...) {
    ::_exit(2);
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGSYS, &sa, nullptr) != 0) ::_exit(5);
  if (int rc = install_filter()) ::_exit(rc);
  // From here on: only read, write, exit_group, rt_sigreturn, futex.
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < 1000; ++i)
    if (opt_secc(i) != i + 5) ++bad;
  std::uint64_t msg[4] = {kMagicOk, c.hits.load(), bad, 0};
  (void)!::write(wr, msg, sizeof msg);
  ::_exit(0);
}

TEST(Seccomp, OptimizedHitsMakeNoSystemCall) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1]);
  }
  ::close(fds[1]);
  std::uint64_t msg[4] = {};
  std::size_t got = 0;
  while (got < sizeof msg) {
    ssize_t n = ::read(fds[0], reinterpret_cast<char*>(msg) + got, sizeof msg - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  if (got == sizeof msg && msg[0] == kMagicSigsys)
    ADD_FAILURE() << "the child made system call " << msg[1] << " (forbidden by the filter) at " << hex(msg[2])
                  << " while calling the optimized probe";
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ASSERT_EQ(WEXITSTATUS(status), 0) << "child exit code (2: register threw, 3: not optimized, 4: SIGSYS, "
                                       "5: sigaction, 10/11: prctl)";
  ASSERT_EQ(got, sizeof msg);
  EXPECT_EQ(msg[0], kMagicOk);
  EXPECT_EQ(msg[1], 1000u) << "hits in the child";
  EXPECT_EQ(msg[2], 0u) << "wrong results in the child";
}

}  // namespace
