// SPDX-License-Identifier: MIT
// SIGTRAP ownership. The runtime's handler is installed once and stays; the
// disposition the program asks for (before or after the runtime started) is
// remembered as "the program's action" and receives every SIGTRAP that is not
// ours, exactly as if it were installed. So a program that installs its own
// SIGTRAP handler later does not break probes and still sees its own traps.
//
// The other signals' handlers run under a mask that must not block SIGTRAP
// (masks.hpp): sigaction() takes SIGTRAP out of sa_mask, and a handler the
// program installs runs through uprobe_signal_wrapper(), which gives it the
// program's view of the mask (in the view while it runs, in its ucontext's
// uc_sigmask) and takes the view back from uc_sigmask when it returns, as
// sigreturn restores the mask. sigaction()'s old action shows the program's
// handler, flags and sa_mask. signal(), bsd_signal(), ssignal() and
// sysv_signal() go through the same sigaction(). A raw rt_sigaction syscall
// bypasses all of this. A vfork() child shares the tables' memory with its
// parent but has handlers of its own: its sigaction() goes to the kernel
// only, and leaves the tables (the parent's) alone.
//
// SIGSEGV and SIGBUS, once arm_user_faults() ran (uprobe::enable_fault_safe_reads()),
// are always delivered to uprobe_signal_wrapper(), with the program's flags
// and sa_mask (SA_RESETHAND emulated): it first takes the faults of
// arch::copy_user()/copy_user_str() for its own (the kernel's exception
// table) and resumes them at their fixup; any other goes to the program's
// disposition as the kernel would have delivered it: its handler, or the
// default action (the process dies of the signal, as without us), or
// nothing for a sent signal the program ignores.

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "raw_syscall.hpp"
#include "arch.hpp"
#include "masks.hpp"
#include "runtime.hpp"
#include "signals.hpp"
#include "trap.hpp"
#include "sanitize.hpp"
#include "thread_state.hpp"

extern "C" int __sigaction(int, const struct sigaction*, struct sigaction*);
extern "C" void uprobe_signal_wrapper(int sig, siginfo_t* info, void* ctx);

namespace uprobe::detail {

namespace {

std::atomic<bool> g_installed{false};
std::atomic<std::uint64_t> g_restorer{0};  // signal_return_trampoline()
// The program's SIGTRAP action, double-buffered so the trap path reads a
// complete copy without a lock: writers fill the spare slot, then flip.
struct sigaction g_program[2];
std::atomic<int> g_program_idx{0};
std::atomic_flag g_program_write = ATOMIC_FLAG_INIT;

UPROBE_NO_SANITIZE int real_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  return __sigaction(sig, act, old);
}

void set_program_action(const struct sigaction& act) noexcept {
  while (g_program_write.test_and_set(std::memory_order_acquire)) arch::cpu_relax();
  int next = 1 - g_program_idx.load(std::memory_order_relaxed);
  g_program[next] = act;
  g_program_idx.store(next, std::memory_order_release);
  g_program_write.clear(std::memory_order_release);
}

struct sigaction program_action() noexcept { return g_program[g_program_idx.load(std::memory_order_acquire)]; }

}  // namespace

namespace {
/// The process whose memory holds the tables above (the program's SIGTRAP
/// action, g_actions): set when the runtime installs its SIGTRAP handler
/// and in a fork() child; 0 before.
std::atomic<pid_t> g_table_pid{0};
}  // namespace

/// Whether the caller is another process than the one whose memory this is
/// (a vfork() child, a clone(CLONE_VM) process; also a child of a raw fork
/// system call, which no atfork handler told). Async-signal-safe (getpid).
bool shares_parents_tables() noexcept {
  const pid_t owner = g_table_pid.load(std::memory_order_relaxed);
  return owner != 0 && static_cast<pid_t>(arch::raw_syscall(SYS_getpid)) != owner;
}

void install_trap_handler(SignalMask mask) {
  g_table_pid.store(static_cast<pid_t>(arch::raw_syscall(SYS_getpid)), std::memory_order_relaxed);
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
  struct sigaction now;
  if (real_sigaction(SIGTRAP, nullptr, &now) == 0)
    g_restorer.store(reinterpret_cast<std::uint64_t>(now.sa_restorer), std::memory_order_release);
  if (!g_installed.load(std::memory_order_relaxed)) {
    set_program_action(old);
    g_installed.store(true, std::memory_order_release);
  }
}

std::uint64_t signal_return_trampoline() noexcept { return g_restorer.load(std::memory_order_acquire); }

bool program_handles_sigtrap() noexcept {
  const struct sigaction pa = program_action();
  return pa.sa_handler != SIG_DFL && pa.sa_handler != SIG_IGN;
}

void forward_foreign_trap(int sig, siginfo_t* info, void* ctx) noexcept {
  struct sigaction pa = program_action();
  auto* uc = static_cast<ucontext_t*>(ctx);
  const bool from_int3 = info->si_code == SI_KERNEL;
  // Forced by the kernel (an int3, int $3, a single-step or breakpoint trap:
  // si_code > 0) rather than sent (kill, tkill, sigqueue: si_code <= 0).
  const bool forced = info->si_code > 0;
  if (uprobe_view_blocked && !forced) {  // the program blocks it: pending until it does not
    hold_sigtrap(*info);
    return;
  }
  // The kernel's force_sig_fault(): a blocked or ignored trap resets the
  // disposition and kills.
  if (pa.sa_handler == SIG_DFL || (forced && (pa.sa_handler == SIG_IGN || uprobe_view_blocked))) {
    // Die by SIGTRAP as the program would have without us: restore the
    // default action and make the trap happen again.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGTRAP, &dfl, nullptr);
    uc->uc_sigmask.__val[0] &= ~sig_bit(SIGTRAP);
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
  // The program's handler, under its sa_mask (SIGTRAP itself too, without
  // SA_NODEFER: in the view only), as the kernel would run it.
  sigset_t block = pa.sa_mask, old;
  const bool trap_in_handler = has_sig(block, SIGTRAP) || !(pa.sa_flags & SA_NODEFER);
  block.__val[0] &= ~(sig_bit(SIGTRAP) | sig_bit(32) | sig_bit(33));
  raw_sigprocmask(SIG_BLOCK, &block, &old);
  if (pa.sa_flags & SA_RESETHAND) {
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    set_program_action(dfl);
  }
  HandlerView view(uc, trap_in_handler);
  if (pa.sa_flags & SA_SIGINFO)
    pa.sa_sigaction(sig, info, ctx);
  else
    pa.sa_handler(sig);
  raw_sigprocmask(SIG_SETMASK, &old, nullptr);
  view.finish();
}

}  // namespace uprobe::detail

using uprobe::detail::g_installed;

namespace uprobe::detail {
namespace {

// The program's handler of each signal but SIGTRAP, when it installed one:
// the handler's address with kWrapped, kSiginfo (SA_SIGINFO) and kTrapInMask
// (SIGTRAP in sa_mask) in its top bits, stored whole (one atomic word: the
// wrapper never sees a handler with another's flags). 0: not a handler.
// For SIGSEGV and SIGBUS once armed, the entry describes the program's
// disposition whatever it is (uprobe_signal_wrapper() is the kernel's action
// even for SIG_DFL and SIG_IGN): kIgnored for SIG_IGN, neither kWrapped nor
// kIgnored for SIG_DFL, kResetHand for SA_RESETHAND (emulated: the kernel's
// would put SIG_DFL in place of the wrapper).
constexpr std::uint64_t kWrapped = 1ull << 63, kSiginfo = 1ull << 62, kTrapInMask = 1ull << 61;
constexpr std::uint64_t kIgnored = 1ull << 60, kResetHand = 1ull << 59;
constexpr std::uint64_t kHandlerBits = kResetHand - 1;
std::atomic<std::uint64_t> g_actions[NSIG];

/// Per signal: the wrapper is the kernel's action for every disposition
/// (SIGSEGV and SIGBUS once arm_user_faults() ran); set under ActionLock.
std::atomic<bool> g_armed[NSIG];
/// For an armed signal: the program's sa_flags as it set them (what
/// sigaction()'s old action shows).
std::atomic<int> g_program_flags[NSIG];
/// Both SIGSEGV and SIGBUS armed.
std::atomic<bool> g_faults_armed{false};

/// The table entry of a disposition (see kWrapped).
std::uint64_t encode_action(const struct sigaction& a, bool trap_in_mask) noexcept {
  std::uint64_t e = ((a.sa_flags & SA_SIGINFO) ? kSiginfo : 0) | (trap_in_mask ? kTrapInMask : 0) |
                    ((a.sa_flags & SA_RESETHAND) ? kResetHand : 0);
  if (a.sa_handler == SIG_IGN) e |= kIgnored;
  else if (a.sa_handler != SIG_DFL) e |= kWrapped | (reinterpret_cast<std::uint64_t>(a.sa_handler) & kHandlerBits);
  return e;
}

/// The kernel's action for a disposition `act` of the program (its sa_mask
/// without SIGTRAP): act itself, or the wrapper with the program's flags
/// when the disposition is a handler or the signal is armed.
struct sigaction kernel_action(const struct sigaction& act, std::uint64_t entry, bool armed) noexcept {
  struct sigaction k = act;
  k.sa_mask.__val[0] &= ~sig_bit(SIGTRAP);
  if ((entry & kWrapped) || armed) {
    k.sa_sigaction = uprobe_signal_wrapper;
    k.sa_flags |= SA_SIGINFO;
  }
  if (armed) {
    k.sa_flags &= ~SA_RESETHAND;  // (emulated: the wrapper stays)
    // A sent signal the program ignores or leaves to the default action
    // interrupts no system call (SIG_IGN discards it; SIG_DFL's stops the process).
    if (!(entry & kWrapped)) k.sa_flags |= SA_RESTART;
  }
  return k;
}

/// sigaction()'s old action as the program set it, from the kernel's
/// (`old`), the table entry of the signal then and, armed, the program's flags then.
void show_program_action(struct sigaction& old, std::uint64_t entry, bool armed, int program_flags) noexcept {
  if (old.sa_sigaction != uprobe_signal_wrapper) return;
  if (entry & kWrapped) old.sa_handler = reinterpret_cast<sighandler_t>(entry & kHandlerBits);
  else if (armed) old.sa_handler = (entry & kIgnored) ? SIG_IGN : SIG_DFL;
  else return;
  if (armed) old.sa_flags = program_flags;
  else if (!(entry & kSiginfo)) old.sa_flags &= ~SA_SIGINFO;
  if (entry & kTrapInMask) old.sa_mask.__val[0] |= sig_bit(SIGTRAP);
}

/// Serializes sigaction() per signal between threads (the table entry and
/// the kernel's action change together); a nested call on the same thread
/// (a signal handler calling sigaction) goes through.
std::atomic<pid_t> g_action_owner[NSIG];

struct ActionLock {
  int sig;
  bool held = false;
  explicit ActionLock(int s) noexcept : sig(s) {
    const pid_t me = self_tid();
    if (g_action_owner[sig].load(std::memory_order_relaxed) == me) return;
    pid_t expected = 0;
    while (!g_action_owner[sig].compare_exchange_weak(expected, me, std::memory_order_acquire)) {
      expected = 0;
      arch::cpu_relax();
    }
    held = true;
  }
  ~ActionLock() {
    if (held) g_action_owner[sig].store(0, std::memory_order_release);
  }
  ActionLock(const ActionLock&) = delete;
  ActionLock& operator=(const ActionLock&) = delete;
};

/// What the program's disposition of an armed signal does with one that is
/// not ours and that no handler of the program takes (entry `e`: SIG_DFL, or
/// SIG_IGN): as the kernel, a sent signal the program ignores is dropped;
/// anything else is the default action (a fault the program ignores is
/// fatal too: force_sig_fault()): the default disposition restored and the
/// same signal sent again to this thread, delivered when the wrapper returns
/// (its siginfo kept: a process may send itself any si_code), so the process
/// ends as it would have without us (killed by the signal, a core dump where
/// the limits allow one).
void take_default_action(int sig, siginfo_t* info, void* ctx, std::uint64_t e) noexcept {
  const bool forced = info->si_code > 0;  // raised by the kernel for an instruction, not sent
  if ((e & kIgnored) && !forced) return;
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  real_sigaction(sig, &dfl, nullptr);
  static_cast<ucontext_t*>(ctx)->uc_sigmask.__val[0] &= ~sig_bit(sig);
  arch::raw_syscall(SYS_rt_tgsigqueueinfo, arch::raw_syscall(SYS_getpid), arch::raw_syscall(SYS_gettid), sig,
                    reinterpret_cast<long>(info));
}

}  // namespace

void signals_after_fork_child() noexcept {
  // A thread that was inside sigaction() is not in the child. (This thread
  // was not, or a handler of its signal forked from inside: the section it
  // interrupted runs on alone in the child.)
  for (auto& owner : g_action_owner) owner.store(0, std::memory_order_relaxed);
  g_program_write.clear(std::memory_order_relaxed);
  g_table_pid.store(static_cast<pid_t>(arch::raw_syscall(SYS_getpid)), std::memory_order_relaxed);
}

bool user_faults_armed() noexcept { return g_faults_armed.load(std::memory_order_acquire); }

UPROBE_NO_SANITIZE bool arm_user_faults() noexcept {
  if (g_faults_armed.load(std::memory_order_acquire)) return true;
  if (shares_parents_tables()) return false;  // a vfork() child: its handlers are not the tables'
  for (const int sig : {SIGSEGV, SIGBUS}) {
    ActionLock lock(sig);
    if (g_armed[sig].load(std::memory_order_relaxed)) continue;
    struct sigaction cur;
    if (real_sigaction(sig, nullptr, &cur) != 0) return false;
    std::uint64_t e;
    struct sigaction program = cur;
    if (cur.sa_sigaction == uprobe_signal_wrapper) {
      // A handler the program installed through us: the table has it.
      e = g_actions[sig].load(std::memory_order_relaxed);
      if (!(e & kWrapped)) e = 0;  // (not a handler any more: SIG_DFL)
      if (cur.sa_flags & SA_RESETHAND) e |= kResetHand;
      if (!(e & kSiginfo)) program.sa_flags &= ~SA_SIGINFO;
    } else {
      // SIG_DFL, SIG_IGN, or a handler installed before libuprobe was
      // loaded or with a raw system call (a sanitizer runtime's).
      e = encode_action(cur, has_sig(cur.sa_mask, SIGTRAP));
    }
    g_program_flags[sig].store(program.sa_flags, std::memory_order_relaxed);
    g_actions[sig].store(e, std::memory_order_release);
    g_armed[sig].store(true, std::memory_order_release);
    const struct sigaction k = kernel_action(program, e, true);
    if (real_sigaction(sig, &k, nullptr) != 0) {
      g_armed[sig].store(false, std::memory_order_release);
      return false;
    }
  }
  g_faults_armed.store(true, std::memory_order_release);
  return true;
}

}  // namespace uprobe::detail

bool uprobe::enable_fault_safe_reads() noexcept { return detail::arm_user_faults(); }

/// What the kernel runs for every handler the program installed with
/// sigaction() (but SIGTRAP's), and for every disposition of SIGSEGV and
/// SIGBUS once they are armed: a fault of libuprobe's own reads first
/// (resumed at its fixup), then the program's handler from the table, under
/// the program's view of the mask (HandlerView), or its SIG_DFL or SIG_IGN
/// (take_default_action()). Async-signal-safe.
extern "C" UPROBE_NO_SANITIZE void uprobe_signal_wrapper(int sig, siginfo_t* info, void* ctx) {
  using namespace uprobe::detail;
  if ((sig == SIGSEGV || sig == SIGBUS) && uprobe::arch::user_copy_fixup(info, static_cast<ucontext_t*>(ctx)))
    return;
  const bool armed = g_armed[sig].load(std::memory_order_acquire);
  std::uint64_t e = g_actions[sig].load(std::memory_order_acquire);
  // SA_RESETHAND of an armed signal: SIG_DFL from this delivery on (one
  // thread takes the handler, as the kernel resets the action under its lock).
  while (armed && (e & kWrapped) && (e & kResetHand) &&
         !g_actions[sig].compare_exchange_weak(e, e & ~(kWrapped | kHandlerBits), std::memory_order_acq_rel)) {
  }
  if (!(e & kWrapped)) {
    if (armed) take_default_action(sig, info, ctx, e);
    return;  // (not armed: SIG_DFL/SIG_IGN set since the kernel chose this handler)
  }
  HandlerView view(ctx, (e & kTrapInMask) != 0);
  if (e & kSiginfo)
    reinterpret_cast<void (*)(int, siginfo_t*, void*)>(e & kHandlerBits)(sig, info, ctx);
  else
    reinterpret_cast<void (*)(int)>(e & kHandlerBits)(sig);
  view.finish();
}

/// Interposed sigaction(2): SIGTRAP is virtualised once the runtime owns it
/// (see the file comment); for every other signal SIGTRAP leaves sa_mask and
/// a handler is installed as uprobe_signal_wrapper() (every disposition of
/// an armed SIGSEGV or SIGBUS), and the old action reads as the program set it.
/// Not instrumented: under a sanitizer, the sanitizer's own sigaction
/// interceptor reaches this function (its "real" sigaction is the next
/// definition, ours) while the sanitizer runtime initialises, before it can
/// run instrumented code. Likewise signal().
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE int sigaction(int sig, const struct sigaction* act,
                                                                  struct sigaction* old) {
  using namespace uprobe::detail;
  // A vfork() child (or a clone(CLONE_VM) process) runs in our memory with
  // handlers of its own: what it sets must not reach our tables, or our
  // handler, still installed in our kernel action, would find the child's
  // SIG_DFL and drop the signal (Python's subprocess resets its handlers in
  // its vfork child: the parent lost every later SIGHUP, SIGUSR1, ...). Its
  // own handlers go straight to the kernel; SIGTRAP's stays ours (a probe
  // hit in the child before its exec needs it), what it asks for SIGTRAP is
  // not kept.
  const bool shared = act && shares_parents_tables();
  if (sig == SIGTRAP && g_installed.load(std::memory_order_acquire)) {
    if (old) *old = program_action();
    if (act && !shared) set_program_action(*act);
    return 0;
  }
  // Bad numbers, and glibc's own SIGCANCEL/SIGSETXID (refused by it): libc answers.
  if (sig <= 0 || sig >= NSIG || sig == SIGTRAP || sig == 32 || sig == 33) return real_sigaction(sig, act, old);
  if (shared) {
    struct sigaction k;
    if (act) {
      k = *act;
      k.sa_mask.__val[0] &= ~sig_bit(SIGTRAP);
      // The child's own disposition of SIGSEGV or SIGBUS may not be the
      // wrapper any more: no in-process read from now on (the TLS is the
      // parent's, which re-checks its mask at its next read).
      if (sig == SIGSEGV || sig == SIGBUS) forget_fault_state();
    }
    const std::uint64_t prev = g_actions[sig].load(std::memory_order_acquire);
    const bool armed = g_armed[sig].load(std::memory_order_acquire);
    const int r = real_sigaction(sig, act ? &k : nullptr, old);
    if (r == 0 && old) show_program_action(*old, prev, armed, g_program_flags[sig].load(std::memory_order_relaxed));
    return r;
  }
  ActionLock lock(sig);
  const bool armed = g_armed[sig].load(std::memory_order_acquire);
  struct sigaction k;
  std::uint64_t entry = 0;
  if (act) {
    entry = encode_action(*act, has_sig(act->sa_mask, SIGTRAP));
    k = kernel_action(*act, entry, armed);
  }
  const std::uint64_t prev = g_actions[sig].load(std::memory_order_relaxed);
  const int prev_flags = g_program_flags[sig].load(std::memory_order_relaxed);
  // The entry before the kernel's action: a signal that comes in between
  // runs the new handler (under the old flags), as one that arrived a
  // moment later would.
  if (act && ((entry & kWrapped) || armed)) {
    g_actions[sig].store(entry, std::memory_order_release);
    if (armed) g_program_flags[sig].store(act->sa_flags, std::memory_order_relaxed);
  }
  const int r = real_sigaction(sig, act ? &k : nullptr, old);
  if (r != 0) {
    g_actions[sig].store(prev, std::memory_order_release);
    g_program_flags[sig].store(prev_flags, std::memory_order_relaxed);
    return r;
  }
  if (act && !(entry & kWrapped) && !armed) g_actions[sig].store(0, std::memory_order_release);
  if (old) show_program_action(*old, prev, armed, prev_flags);
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

/// Interposed bsd_signal(3) and ssignal(3): glibc's other names of signal().
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE sighandler_t bsd_signal(int sig, sighandler_t handler) {
  return signal(sig, handler);
}
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE sighandler_t ssignal(int sig, sighandler_t handler) {
  return signal(sig, handler);
}

/// Interposed sysv_signal(3) (and __sysv_signal): a one-shot handler, not
/// blocked in itself, interrupting system calls (glibc's sysv_signal.c).
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE sighandler_t __sysv_signal(int sig, sighandler_t handler) {
  if (handler == SIG_ERR || sig <= 0 || sig >= NSIG) {
    errno = EINVAL;
    return SIG_ERR;
  }
  struct sigaction act, old;
  std::memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESETHAND | SA_NODEFER;
  if (sigaction(sig, &act, &old) < 0) return SIG_ERR;
  return old.sa_handler;
}
extern "C" __attribute__((visibility("default"))) UPROBE_NO_SANITIZE sighandler_t sysv_signal(int sig, sighandler_t handler) {
  return __sysv_signal(sig, handler);
}
