// SPDX-License-Identifier: MIT
// The program's signal masks never block SIGTRAP (see masks.hpp).
//
// Every libc entry point through which a program sets a thread's signal
// mask, or runs code under one, is interposed: sigprocmask, pthread_sigmask,
// the BSD and System V calls (sigblock, sigsetmask, siggetmask, sighold,
// sigrelse, sigset, sigpause), the calls that wait under a temporary mask
// (sigsuspend, ppoll, pselect, epoll_pwait, epoll_pwait2), the sigwait family
// and sigpending (a held SIGTRAP), setcontext/swapcontext and the longjmps
// (they restore a saved mask), pthread_create (a new thread inherits the
// view; one started with pthread_attr_setsigmask_np() blocking SIGTRAP takes
// it into its view at once). getcontext, __sigsetjmp and setjmp are in
// arch/x86_64/interpose/context.S, sigaction's sa_mask and the handler
// wrapper in signals.cpp, pthread_create in thread_start.cpp, the others in
// masks_interposed.cpp; this file holds the view they keep.
//
// The masks themselves are set with rt_sigprocmask system calls of our own:
// liburcu-bp changes masks on the trap path (a thread's first hit registers
// it as a reader with every signal blocked), through pthread_sigmask, which
// now arrives here. The blocking calls go to libc's own functions (found
// with dlsym(RTLD_NEXT), called with SIGTRAP unblocked: a probe on them is
// an ordinary hit), which keeps their cancellation points, time64 handling
// and siginfo conventions.

#include "masks.hpp"
#include "masks_internal.hpp"
#include "signals.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "context_layout.h"
#include "next_symbol.hpp"
#include "raw_syscall.hpp"
#include "runtime.hpp"
#include "sanitize.hpp"
#include "thread_state.hpp"

extern "C" {
__thread unsigned char uprobe_view_blocked __attribute__((tls_model("initial-exec"))) = 0;
__thread unsigned char uprobe_fault_state __attribute__((tls_model("initial-exec"))) = 0;

// Read by context.S; resolved by init_masks() (or uprobe_resolve_real()).
void* uprobe_real_sigsetjmp = nullptr;
void* uprobe_real_getcontext = nullptr;
void* uprobe_resolve_real(int which) noexcept;
void uprobe_context_resumed() noexcept;
}

namespace uprobe::detail {

namespace {

constexpr int kSigCancel = 32;  // glibc's SIGCANCEL and SIGSETXID: never blocked by its wrappers
constexpr int kSigSetxid = 33;
constexpr long kKernelSigsetBytes = 8;

Real g_real;
std::atomic<bool> g_resolved{false};

template <typename F>
void next(F& f, const char* name) {
  f = reinterpret_cast<F>(uprobe::detail::libc_symbol(name));
}

void resolve_all() noexcept {
  if (g_resolved.load(std::memory_order_acquire)) return;
  uprobe_real_sigsetjmp = uprobe::detail::libc_symbol("__sigsetjmp");
  uprobe_real_getcontext = uprobe::detail::libc_symbol("getcontext");
  next(g_real.setcontext, "setcontext");
  next(g_real.siglongjmp, "siglongjmp");
  next(g_real.longjmp, "longjmp");
  next(g_real.underscore_longjmp, "_longjmp");
  next(g_real.longjmp_chk, "__longjmp_chk");
  next(g_real.sigsuspend, "sigsuspend");
  next(g_real.sigtimedwait, "sigtimedwait");
  next(g_real.ppoll, "ppoll");
  next(g_real.ppoll_chk, "__ppoll_chk");
  next(g_real.pselect, "pselect");
  next(g_real.epoll_pwait, "epoll_pwait");
  next(g_real.epoll_pwait2, "epoll_pwait2");
  next(g_real.pthread_create, "pthread_create");
  next(g_real.attr_getsigmask, "pthread_attr_getsigmask_np");
  g_resolved.store(true, std::memory_order_release);
}

}  // namespace

const Real& real() noexcept {
  if (!g_resolved.load(std::memory_order_acquire)) resolve_all();
  return g_real;
}

namespace {

pid_t raw_tid() noexcept { return static_cast<pid_t>(arch::raw_syscall(SYS_gettid)); }

}  // namespace

bool owns_view() noexcept {
  const pid_t cached = t_state.tid;
  return cached == 0 || raw_tid() == cached;
}

// ---------------------------------------------------------------- held SIGTRAPs

namespace {

/// A SIGTRAP held for the process (kill(), sigqueue()): 0 none, 1 being
/// written or read, 2 held.
std::atomic<int> g_proc_held{0};
siginfo_t g_proc_held_info;

}  // namespace

std::atomic<pid_t> g_trap_waiter{0};

namespace {

bool take_process_held(siginfo_t& out) noexcept {
  int expected = 2;
  if (!g_proc_held.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return false;
  out = g_proc_held_info;
  g_proc_held.store(0, std::memory_order_release);
  return true;
}

}  // namespace

bool take_held(siginfo_t& out) noexcept {
  ThreadState& ts = t_state;
  if (ts.trap_held) {
    out = ts.held_info;
    ts.trap_held = false;
    return true;
  }
  return take_process_held(out);
}

namespace {

long requeue(pid_t tid, const siginfo_t& si) noexcept {
  // To itself a process may send any si_code: the program's handler sees the
  // siginfo of the signal that was held.
  return arch::raw_syscall(SYS_rt_tgsigqueueinfo, arch::raw_syscall(SYS_getpid), tid, SIGTRAP,
                           reinterpret_cast<long>(&si));
}

}  // namespace

// ---------------------------------------------------------------- thread start

bool new_thread_view_blocked(const pthread_attr_t* attr) noexcept {
  bool blocked = uprobe_view_blocked;
  sigset_t m;
  if (attr && real().attr_getsigmask && real().attr_getsigmask(attr, &m) == 0) blocked = has_sig(m, SIGTRAP);
  return blocked;
}

UPROBE_NO_SANITIZE void take_blocked_view_in_new_thread() noexcept {
  // The view of the creating thread (or of pthread_attr_setsigmask_np()'s
  // set); glibc set the latter for real, before this ran.
  sigset_t trap;
  trap.__val[0] = sig_bit(SIGTRAP);
  raw_sigprocmask(SIG_UNBLOCK, &trap, nullptr);
  uprobe_view_blocked = 1;
}

pid_t self_tid() noexcept {
  const pid_t cached = t_state.tid;
  return cached != 0 ? cached : raw_tid();
}

long raw_sigprocmask(int how, const sigset_t* set, sigset_t* old) noexcept {
  return arch::raw_syscall(SYS_rt_sigprocmask, how, reinterpret_cast<long>(set), reinterpret_cast<long>(old),
                           kKernelSigsetBytes);
}

int program_sigmask(int how, const sigset_t* set, sigset_t* old) noexcept {
  sigset_t k;
  bool asks = false;
  if (set) {
    if (how != SIG_BLOCK && how != SIG_UNBLOCK && how != SIG_SETMASK) return EINVAL;
    k.__val[0] = set->__val[0];  // the kernel reads the first 8 bytes
    asks = has_sig(k, SIGTRAP);
    k.__val[0] &= ~(sig_bit(kSigCancel) | sig_bit(kSigSetxid));
    if (how != SIG_UNBLOCK) k.__val[0] &= ~sig_bit(SIGTRAP);
  }
  const auto after = [&](bool prev) {
    if (!set) return prev;
    return how == SIG_SETMASK ? asks : how == SIG_BLOCK ? (prev || asks) : (prev && !asks);
  };
  const bool was = uprobe_view_blocked;
  // The view moves for the thread it belongs to only (one gettid when it moves).
  int mine = after(was) != was ? owns_view() : -1;
  if (mine == 1 && after(was)) uprobe_view_blocked = 1;  // blocking: a SIGTRAP sent meanwhile is held, as asked
  sigset_t o;
  const long r = raw_sigprocmask(how, set ? &k : nullptr, &o);
  if (r < 0) {
    if (mine == 1) uprobe_view_blocked = was;
    return static_cast<int>(-r);
  }
  bool prev = was;
  if (has_sig(o, SIGTRAP)) {
    // Blocked for real (inherited across execve, or blocked before
    // libuprobe was loaded): the program's, from now on in its view only.
    prev = true;
    sigset_t trap;
    trap.__val[0] = sig_bit(SIGTRAP);
    raw_sigprocmask(SIG_UNBLOCK, &trap, nullptr);
  }
  if (old) old->__val[0] = (o.__val[0] & ~sig_bit(SIGTRAP)) | (prev ? sig_bit(SIGTRAP) : 0);
  if (set) {
    const unsigned long real_now = how == SIG_SETMASK ? k.__val[0]
                                   : how == SIG_BLOCK ? (o.__val[0] | k.__val[0])
                                                      : (o.__val[0] & ~k.__val[0]);
    note_fault_mask(real_now);
  }
  const bool now = after(prev);
  if (now != was && mine == -1) mine = owns_view();
  if (mine == 1) {
    uprobe_view_blocked = now;
    if (!now && prev) deliver_held_sigtrap();
  }
  return 0;
}

void set_view(bool blocked) noexcept {
  uprobe_view_blocked = blocked;
  if (!blocked) deliver_held_sigtrap();
}

void forget_fault_state() noexcept { uprobe_fault_state = kFaultsUnknown; }

void note_fault_mask(unsigned long mask_word) noexcept {
  const unsigned char now = fault_state_of(mask_word);
  if (now == kFaultsBlocked) uprobe_fault_state = kFaultsBlocked;
  else if (uprobe_fault_state != kFaultsOk) uprobe_fault_state = kFaultsUnknown;
}

bool user_copy_faults_recoverable() noexcept {
  if (!user_faults_armed()) return false;
  const unsigned char known = uprobe_fault_state;
  if (known != kFaultsUnknown) return known == kFaultsOk;
  sigset_t cur;
  if (raw_sigprocmask(SIG_BLOCK, nullptr, &cur) != 0) return false;
  const unsigned char now = fault_state_of(cur.__val[0]);
  // A vfork() child's answer is its own: not kept in the TLS it shares with
  // its parent (and its dispositions may not be the wrapper: no in-process read).
  if (shares_parents_tables()) return false;
  uprobe_fault_state = now;
  return now == kFaultsOk;
}

void hold_sigtrap(const siginfo_t& info) noexcept {
  ThreadState& ts = t_state;
  ++ts.holds;
  if (info.si_code == SI_TKILL) {  // tkill, tgkill, raise, pthread_kill: this thread's
    if (!ts.trap_held) {
      ts.held_info = info;
      ts.trap_held = true;
    }
    return;
  }
  // kill(), sigqueue(): the process's. A thread waiting for it in sigwait()
  // takes it (there the kernel dequeues it, SIGTRAP being in its wait set).
  const pid_t waiter = g_trap_waiter.load(std::memory_order_acquire);
  if (waiter != 0 && waiter != self_tid() && requeue(waiter, info) == 0) return;
  int expected = 0;
  if (g_proc_held.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    g_proc_held_info = info;
    g_proc_held.store(2, std::memory_order_release);
  }  // else one is held already: a standard signal does not queue twice
}

bool sigtrap_held() noexcept {
  return t_state.trap_held || g_proc_held.load(std::memory_order_acquire) == 2;
}

void deliver_held_sigtrap() noexcept {
  if (!sigtrap_held()) return;
  const pid_t me = self_tid();
  siginfo_t si;
  for (int i = 0; i < 2 && take_held(si); ++i) requeue(me, si);
}

void note_program_handler_run() noexcept { ++t_state.handler_runs; }

HandlerView::HandlerView(void* uc, bool in_handler) noexcept : uc_(uc) {
  auto* u = static_cast<ucontext_t*>(uc);
  real_blocked_ = has_sig(u->uc_sigmask, SIGTRAP);
  if (real_blocked_) {
    // The interrupted code had SIGTRAP blocked for real (libuprobe's handler
    // in SignalMask::defer, or code that ran before libuprobe was loaded):
    // so has this handler. Not the program's choice: not in its view.
    sigset_t trap;
    trap.__val[0] = sig_bit(SIGTRAP);
    raw_sigprocmask(SIG_UNBLOCK, &trap, nullptr);
    u->uc_sigmask.__val[0] &= ~sig_bit(SIGTRAP);
  }
  // uc_sigmask is the interrupted code's mask as the program sees it.
  if (uprobe_view_blocked) u->uc_sigmask.__val[0] |= sig_bit(SIGTRAP);
  uprobe_view_blocked = uprobe_view_blocked || in_handler;
  // The handler's mask (the interrupted one, or a sigsuspend()'s, plus its
  // sa_mask): not known here.
  fault_state_ = uprobe_fault_state;
  fault_bits_ = u->uc_sigmask.__val[0] & (sig_bit(SIGSEGV) | sig_bit(SIGBUS));
  uprobe_fault_state = kFaultsUnknown;
  note_program_handler_run();
}

void HandlerView::finish() noexcept {
  // sigreturn restores uc_sigmask: its SIGTRAP bit, as the handler left it,
  // is the view from then on, and the real bit what it was.
  auto* u = static_cast<ucontext_t*>(uc_);
  const bool after = has_sig(u->uc_sigmask, SIGTRAP);
  if (real_blocked_) u->uc_sigmask.__val[0] |= sig_bit(SIGTRAP);
  else u->uc_sigmask.__val[0] &= ~sig_bit(SIGTRAP);
  uprobe_view_blocked = after;
  // sigreturn restores uc_sigmask: the interrupted code's state stands
  // unless the handler changed its SIGSEGV or SIGBUS bit there.
  if ((u->uc_sigmask.__val[0] & (sig_bit(SIGSEGV) | sig_bit(SIGBUS))) == fault_bits_) uprobe_fault_state = fault_state_;
  else uprobe_fault_state = fault_state_of(u->uc_sigmask.__val[0]) == kFaultsBlocked ? kFaultsBlocked : kFaultsUnknown;
  if (!after && !real_blocked_) deliver_held_sigtrap();
}

namespace {
/// In a fork() child: the thread's id cached before the fork is the
/// parent's, and owns_view() would take the child for a vfork() child.
/// Registered at load, so it runs before later atfork handlers (a vfork()
/// child runs none). The child owns its copy of the handler tables too
/// (signals.cpp), whether the runtime has started or not.
void forget_tid_in_child() {
  t_state.tid = 0;
  signals_after_fork_child();
}
}  // namespace

void init_masks() noexcept {
  resolve_all();
  pthread_atfork(nullptr, nullptr, forget_tid_in_child);
  install_trap_handler(g_hot.signal_mask_for_install);
  sigset_t o;
  program_sigmask(SIG_BLOCK, nullptr, &o);  // takes over a SIGTRAP inherited blocked
}

}  // namespace uprobe::detail

extern "C" {

void* uprobe_resolve_real(int which) noexcept {
  uprobe::detail::resolve_all();
  return which == 0 ? uprobe_real_sigsetjmp : uprobe_real_getcontext;
}

/// A context getcontext() saved was resumed (context.S): by libuprobe's
/// setcontext()/swapcontext(), which set the view already, or by glibc's own
/// setcontext (a makecontext() function returned to its uc_link), which set
/// uc_sigmask verbatim.
UPROBE_NO_SANITIZE void uprobe_context_resumed() noexcept {
  using namespace uprobe::detail;
  ThreadState& ts = t_state;
  if (ts.ctx_view_set) {
    ts.ctx_view_set = false;
    return;
  }
  sigset_t cur;
  raw_sigprocmask(SIG_BLOCK, nullptr, &cur);
  note_fault_mask(cur.__val[0]);
  if (has_sig(cur, SIGTRAP)) {
    sigset_t trap;
    trap.__val[0] = sig_bit(SIGTRAP);
    raw_sigprocmask(SIG_UNBLOCK, &trap, nullptr);
  }
  set_view(has_sig(cur, SIGTRAP));
}


}  // extern "C"

namespace {
/// At load: the libc functions, the main thread's inherited mask, SIGTRAP's
/// handler (so that a SIGTRAP sent while the view blocks it is held rather
/// than delivered to a disposition the program thinks blocked).
__attribute__((constructor)) void load_masks() { uprobe::detail::init_masks(); }
}  // namespace