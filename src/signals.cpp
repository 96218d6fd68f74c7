// SPDX-License-Identifier: MIT
// SIGTRAP ownership. The runtime's handler is installed once and stays; the
// disposition the program asks for (before or after the runtime started) is
// remembered as "the program's action" and receives every SIGTRAP that is not
// ours, exactly as if it were installed. sigaction() and signal() are
// interposed for SIGTRAP only (every other signal goes straight to libc), so
// a program that installs its own SIGTRAP handler later does not break probes
// and still sees its own traps. A raw rt_sigaction syscall bypasses this.

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "raw_syscall.hpp"
#include "arch.hpp"
#include "runtime.hpp"
#include "sanitize.hpp"
#include "thread_state.hpp"

extern "C" int __sigaction(int, const struct sigaction*, struct sigaction*);

namespace uprobe::detail {

namespace {

std::atomic<bool> g_installed{false};
// The program's SIGTRAP action, double-buffered so the trap path reads a
// complete copy without a lock: writers fill the spare slot, then flip.
struct sigaction g_program[2];
std::atomic<int> g_program_idx{0};
std::atomic_flag g_program_write = ATOMIC_FLAG_INIT;

UPROBE_NO_SANITIZE int real_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  return __sigaction(sig, act, old);
}

void set_program_action(const struct sigaction& act) noexcept {
  while (g_program_write.test_and_set(std::memory_order_acquire)) __builtin_ia32_pause();
  int next = 1 - g_program_idx.load(std::memory_order_relaxed);
  g_program[next] = act;
  g_program_idx.store(next, std::memory_order_release);
  g_program_write.clear(std::memory_order_release);
}

struct sigaction program_action() noexcept { return g_program[g_program_idx.load(std::memory_order_acquire)]; }

}  // namespace

void install_trap_handler(SignalMask mask) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = uprobe_sigtrap_entry;  // arch entry: clears rflags.AC, then on_sigtrap()
  // Seed 001 in user space: with SA_NODEFER and an empty sa_mask, delivery
  // and sigreturn leave the blocked mask as it is, so the kernel never takes
  // the process-wide siglock to change it.
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | (mask == SignalMask::nodefer ? SA_NODEFER : 0);
  sigemptyset(&sa.sa_mask);
  struct sigaction old;
  real_sigaction(SIGTRAP, &sa, &old);
  if (!g_installed.load(std::memory_order_relaxed)) {
    set_program_action(old);
    g_installed.store(true, std::memory_order_release);
  }
}

bool program_handles_sigtrap() noexcept {
  const struct sigaction pa = program_action();
  return pa.sa_handler != SIG_DFL && pa.sa_handler != SIG_IGN;
}

void forward_foreign_trap(int sig, siginfo_t* info, void* ctx) noexcept {
  struct sigaction pa = program_action();
  auto* uc = static_cast<ucontext_t*>(ctx);
  const bool from_int3 = info->si_code == SI_KERNEL;
  if (pa.sa_handler == SIG_DFL || (pa.sa_handler == SIG_IGN && from_int3)) {
    // Die by SIGTRAP as the program would have without us: restore the
    // default action and make the trap happen again.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGTRAP, &dfl, nullptr);
    sigdelset(&uc->uc_sigmask, SIGTRAP);
    std::uint64_t ip = arch::ucontext_ip(uc);
    std::uint8_t prev[2];
    std::memcpy(prev, reinterpret_cast<const void*>(ip - 2), 2);
    if (from_int3 && prev[1] == arch::kBreakpoint)
      arch::set_ucontext_ip(uc, ip - 1);  // int3: run it again
    else if (from_int3 && prev[0] == 0xCD && prev[1] == 0x03)
      arch::set_ucontext_ip(uc, ip - 2);  // int $3
    else
      arch::raw_syscall(SYS_tgkill, arch::raw_syscall(SYS_getpid), current_tid(), SIGTRAP);  // not libc's: probe targets
    return;
  }
  if (pa.sa_handler == SIG_IGN) return;
  sigset_t block = pa.sa_mask, old;
  if (!(pa.sa_flags & SA_NODEFER)) sigaddset(&block, SIGTRAP);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  if (pa.sa_flags & SA_RESETHAND) {
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    set_program_action(dfl);
  }
  if (pa.sa_flags & SA_SIGINFO)
    pa.sa_sigaction(sig, info, ctx);
  else
    pa.sa_handler(sig);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace uprobe::detail

using uprobe::detail::g_installed;

/// Interposed sigaction(2): SIGTRAP is virtualised once the runtime owns it
/// (see the file comment); everything else goes to libc unchanged.
/// Not instrumented: under a sanitizer, the sanitizer's own sigaction
/// interceptor reaches this function (its "real" sigaction is the next
/// definition, ours) while the sanitizer runtime initialises, before it can
/// run instrumented code. Likewise signal().
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE int sigaction(int sig, const struct sigaction* act,
                                                                  struct sigaction* old) {
  if (sig != SIGTRAP || !g_installed.load(std::memory_order_acquire))
    return uprobe::detail::real_sigaction(sig, act, old);
  if (old) *old = uprobe::detail::program_action();
  if (act) uprobe::detail::set_program_action(*act);
  return 0;
}

/// Interposed signal(3), with glibc's BSD semantics (SA_RESTART, the signal
/// blocked in its handler), routed through the sigaction() above.
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  std::memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  sigemptyset(&act.sa_mask);
  if (sig > 0 && sig < NSIG) sigaddset(&act.sa_mask, sig);
  act.sa_flags = SA_RESTART;
  if (sigaction(sig, &act, &old) < 0) return SIG_ERR;
  return old.sa_handler;
}
