// SPDX-License-Identifier: MIT
// The libc entry points interposed for the program's signal masks (masks.cpp
// holds the view they keep and masks.hpp says why): sigprocmask,
// pthread_sigmask, sigpending, the BSD and System V calls, the calls that
// wait under a temporary mask, the sigwait family, setcontext/swapcontext and
// the longjmps.

#include "masks.hpp"
#include "masks_internal.hpp"

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
#include "raw_syscall.hpp"
#include "runtime.hpp"
#include "sanitize.hpp"
#include "thread_state.hpp"

extern "C" {
/// context.S's getcontext(), not through the PLT.
int uprobe_getcontext(ucontext_t* ucp) noexcept __attribute__((returns_twice));
/// context.S's resume point of a context getcontext() saved.
void uprobe_context_resume();
}

namespace uprobe::detail {

namespace {

/// glibc's sigtimedwait() reports raise()'s SI_TKILL as SI_USER.
void fold_tkill(siginfo_t& si) noexcept {
  if (si.si_code == SI_TKILL) si.si_code = SI_USER;
}

// ---------------------------------------------------------------- deadlines

/// The time left of a relative timeout, for a call resumed after a held
/// SIGTRAP interrupted it (the kernel would not have woken it).
struct Deadline {
  bool forever = true;
  struct timespec end {};

  static struct timespec now() noexcept {
    struct timespec t {};
    arch::raw_syscall(SYS_clock_gettime, CLOCK_MONOTONIC, reinterpret_cast<long>(&t));
    return t;
  }
  explicit Deadline(const struct timespec* rel) noexcept {
    if (!rel) return;
    forever = false;
    end = now();
    end.tv_sec += rel->tv_sec;
    end.tv_nsec += rel->tv_nsec;
    if (end.tv_nsec >= 1000000000) end.tv_sec += 1, end.tv_nsec -= 1000000000;
  }
  /// Time left (0 when past the deadline).
  struct timespec left() const noexcept {
    const struct timespec t = now();
    struct timespec d {end.tv_sec - t.tv_sec, end.tv_nsec - t.tv_nsec};
    if (d.tv_nsec < 0) d.tv_sec -= 1, d.tv_nsec += 1000000000;
    if (d.tv_sec < 0) d = {0, 0};
    return d;
  }
};

// ---------------------------------------------------------------- temporary masks

/// Runs `call(mask)` (a libc function that waits under a temporary signal
/// mask) with SIGTRAP taken out of `mask` and the view set from it for the
/// call. A SIGTRAP held before it that the temporary mask lets in is
/// delivered first, and the call then fails with EINTR, as the kernel does; a
/// SIGTRAP that arrives during the call while the temporary mask blocks it is
/// held, and the call goes on (`resume(deadline)` says with which timeout)
/// unless a handler of the program ran too.
template <typename Call, typename Resume>
int with_temporary_mask(const sigset_t* mask, Call call, Resume resume) {
  if (!mask) return call(nullptr);
  sigset_t k = *mask;
  const bool during = has_sig(k, SIGTRAP);
  k.__val[0] &= ~sig_bit(SIGTRAP);
  ThreadState& ts = t_state;
  const bool saved = uprobe_view_blocked;
  const bool mine = during == saved || owns_view();
  for (;;) {
    if (mine) uprobe_view_blocked = during;
    if (mine && !during && sigtrap_held()) {
      sigset_t o;
      raw_sigprocmask(SIG_SETMASK, &k, &o);
      deliver_held_sigtrap();
      raw_sigprocmask(SIG_SETMASK, &o, nullptr);
      set_view(saved);
      errno = EINTR;
      return -1;
    }
    const std::uint32_t runs = ts.handler_runs, holds = ts.holds;
    const int r = call(&k);
    const int err = errno;
    if (mine) uprobe_view_blocked = saved;
    if (r == -1 && err == EINTR && mine && ts.handler_runs == runs && ts.holds != holds && resume()) continue;
    if (mine && !saved) deliver_held_sigtrap();
    errno = err;
    return r;
  }
}

// ---------------------------------------------------------------- longjmp

// ---------------------------------------------------------------- longjmp

/// Before a longjmp to `env`: the mask it restores (if it saved one) must
/// not block SIGTRAP; the view becomes the one __sigsetjmp() noted (or the
/// saved mask's own SIGTRAP bit, for a buffer saved without our stub).
UPROBE_NO_SANITIZE void prepare_longjmp(struct __jmp_buf_tag* env) noexcept {
  if (__builtin_expect(t_state.depth != 0, 0)) leave_abandoned_hit(arch::jmpbuf_sp(env));
  if (!env->__mask_was_saved) return;
  unsigned long& first = env->__saved_mask.__val[0];
  note_fault_mask(first);
  const unsigned long mark = *reinterpret_cast<const unsigned long*>(reinterpret_cast<const char*>(env) + UPROBE_JB_MARK);
  const bool view = mark == UPROBE_JB_MARK_BLOCKED || (first & sig_bit(SIGTRAP)) != 0;
  first &= ~sig_bit(SIGTRAP);
  if (view != static_cast<bool>(uprobe_view_blocked) && !owns_view()) return;
  set_view(view);
}

}  // namespace

}  // namespace uprobe::detail

using uprobe::detail::program_sigmask;
using uprobe::detail::real;
using uprobe::detail::sig_bit;
using uprobe::detail::has_sig;

extern "C" {

#define UPROBE_INTERPOSED __attribute__((visibility("default"))) UPROBE_NO_SANITIZE

// ---------------------------------------------------------------- the mask

/// Interposed sigprocmask(2): program_sigmask() (masks.hpp).
UPROBE_INTERPOSED int sigprocmask(int how, const sigset_t* set, sigset_t* old) noexcept {
  const int err = program_sigmask(how, set, old);
  if (err == 0) return 0;
  errno = err;
  return -1;
}

/// Interposed pthread_sigmask(3): program_sigmask() (masks.hpp); returns
/// the error number.
UPROBE_INTERPOSED int pthread_sigmask(int how, const sigset_t* set, sigset_t* old) noexcept {
  return program_sigmask(how, set, old);
}

/// Interposed sigpending(2): the real pending set and a held SIGTRAP.
UPROBE_INTERPOSED int sigpending(sigset_t* set) noexcept {
  const long r = uprobe::arch::raw_syscall(SYS_rt_sigpending, reinterpret_cast<long>(set), 8);
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  if (uprobe::detail::sigtrap_held()) set->__val[0] |= sig_bit(SIGTRAP);
  return 0;
}

// BSD (4.2BSD masks of signals 1..32, glibc's sigset_set_old_mask) and System V.

namespace {
int bsd_mask(int how, int mask) noexcept {
  sigset_t s{}, o{};
  s.__val[0] = static_cast<unsigned int>(mask);
  if (const int err = program_sigmask(how, &s, &o)) {
    errno = err;
    return -1;
  }
  return static_cast<int>(static_cast<unsigned int>(o.__val[0]));
}

/// `p` as the compiler cannot see it: libc's headers declare the argument
/// nonnull, and a program may pass null all the same (libc then reports EFAULT).
const sigset_t* opaque(const sigset_t* p) noexcept {
  uprobe::arch::opaque(p);
  return p;
}
}  // namespace

/// Interposed sigblock(3).
UPROBE_INTERPOSED int sigblock(int mask) noexcept { return bsd_mask(SIG_BLOCK, mask); }

/// Interposed sigsetmask(3).
UPROBE_INTERPOSED int sigsetmask(int mask) noexcept { return bsd_mask(SIG_SETMASK, mask); }

/// Interposed siggetmask(3).
UPROBE_INTERPOSED int siggetmask(void) noexcept { return bsd_mask(SIG_BLOCK, 0); }

namespace {
int one_signal(int how, int sig) noexcept {
  if (sig <= 0 || sig >= NSIG) {
    errno = EINVAL;
    return -1;
  }
  sigset_t s;
  s.__val[0] = sig_bit(sig);
  return sigprocmask(how, &s, nullptr);
}
}  // namespace

/// Interposed sighold(3).
UPROBE_INTERPOSED int sighold(int sig) noexcept { return one_signal(SIG_BLOCK, sig); }

/// Interposed sigrelse(3).
UPROBE_INTERPOSED int sigrelse(int sig) noexcept { return one_signal(SIG_UNBLOCK, sig); }

/// Interposed sigset(3) (System V): SIG_HOLD blocks the signal, anything
/// else installs the disposition and unblocks it (glibc's sigset.c).
UPROBE_INTERPOSED sighandler_t sigset(int sig, sighandler_t disp) noexcept {
  if (sig <= 0 || sig >= NSIG) {
    errno = EINVAL;
    return SIG_ERR;
  }
  sigset_t s{}, o;
  s.__val[0] = sig_bit(sig);
  struct sigaction act, oact;
  if (disp == SIG_HOLD) {
    if (sigprocmask(SIG_BLOCK, &s, &o) < 0) return SIG_ERR;
    if (has_sig(o, sig)) return SIG_HOLD;
    if (sigaction(sig, nullptr, &oact) < 0) return SIG_ERR;
    return oact.sa_handler;
  }
  std::memset(&act, 0, sizeof act);
  act.sa_handler = disp;
  if (sigaction(sig, &act, &oact) < 0) return SIG_ERR;
  if (sigprocmask(SIG_UNBLOCK, &s, &o) < 0) return SIG_ERR;
  return has_sig(o, sig) ? SIG_HOLD : oact.sa_handler;
}

// ---------------------------------------------------------------- waiting under a temporary mask

namespace {
bool forever() noexcept { return true; }
}  // namespace

/// Interposed sigsuspend(2) (with_temporary_mask()).
UPROBE_INTERPOSED int sigsuspend(const sigset_t* mask) {
  if (!opaque(mask)) return real().sigsuspend(mask);
  return uprobe::detail::with_temporary_mask(opaque(mask), [](const sigset_t* m) { return real().sigsuspend(m); }, forever);
}

/// Interposed __sigsuspend (glibc's other name of it).
UPROBE_INTERPOSED int __sigsuspend(const sigset_t* mask) { return sigsuspend(mask); }

namespace {
int sigpause_impl(int sig_or_mask, bool is_sig) {
  sigset_t s{};
  if (is_sig) {
    if (sig_or_mask <= 0 || sig_or_mask >= NSIG) {
      errno = EINVAL;
      return -1;
    }
    sigprocmask(SIG_BLOCK, nullptr, &s);
    s.__val[0] &= ~sig_bit(sig_or_mask);
  } else {
    s.__val[0] = static_cast<unsigned int>(sig_or_mask);
  }
  return sigsuspend(&s);
}
}  // namespace

/// Interposed __sigpause (glibc's sigpause with both meanings).
UPROBE_INTERPOSED int __sigpause(int sig_or_mask, int is_sig) { return sigpause_impl(sig_or_mask, is_sig != 0); }

/// Interposed __xpg_sigpause (X/Open sigpause(): removes one signal).
UPROBE_INTERPOSED int __xpg_sigpause(int sig) { return sigpause_impl(sig, true); }

/// The BSD sigpause(mask): the `sigpause` symbol is bsd_sigpause.c's (in C,
/// without <signal.h>, which maps X/Open programs' sigpause to
/// __xpg_sigpause), which calls this. Hidden.
extern "C" UPROBE_NO_SANITIZE int uprobe_bsd_sigpause(int mask) { return sigpause_impl(mask, false); }

namespace {
/// A relative timeout, resumable: the time left at each retry.
struct Timeout {
  uprobe::detail::Deadline dl;
  struct timespec cur {};
  const struct timespec* ptr;
  explicit Timeout(const struct timespec* t) noexcept : dl(t), ptr(t) {}
  bool resume() noexcept {
    if (dl.forever) return true;
    cur = dl.left();
    ptr = &cur;
    return true;  // a zero timeout polls once more
  }
};
}  // namespace

/// Interposed ppoll(2) (with_temporary_mask()).
UPROBE_INTERPOSED int ppoll(struct pollfd* fds, nfds_t n, const struct timespec* t, const sigset_t* mask) {
  Timeout to(t);
  return uprobe::detail::with_temporary_mask(
      mask, [&](const sigset_t* m) { return real().ppoll(fds, n, to.ptr, m); }, [&] { return to.resume(); });
}

/// Interposed __ppoll_chk (_FORTIFY_SOURCE's ppoll).
UPROBE_INTERPOSED int __ppoll_chk(struct pollfd* fds, nfds_t n, const struct timespec* t, const sigset_t* mask,
                                  std::size_t fdslen) {
  Timeout to(t);
  return uprobe::detail::with_temporary_mask(
      mask, [&](const sigset_t* m) { return real().ppoll_chk(fds, n, to.ptr, m, fdslen); },
      [&] { return to.resume(); });
}

/// Interposed pselect(2) (with_temporary_mask()).
UPROBE_INTERPOSED int pselect(int n, fd_set* r, fd_set* w, fd_set* e, const struct timespec* t, const sigset_t* mask) {
  Timeout to(t);
  // The sets are in and out: a resumed call must see the ones asked for.
  fd_set r0, w0, e0;
  if (r) r0 = *r;
  if (w) w0 = *w;
  if (e) e0 = *e;
  return uprobe::detail::with_temporary_mask(
      mask,
      [&](const sigset_t* m) {
        if (r) *r = r0;
        if (w) *w = w0;
        if (e) *e = e0;
        return real().pselect(n, r, w, e, to.ptr, m);
      },
      [&] { return to.resume(); });
}

namespace {
/// epoll_pwait's milliseconds (-1: forever), resumable.
struct MsTimeout {
  uprobe::detail::Deadline dl;
  int cur;
  static const struct timespec* rel(int ms, struct timespec& t) noexcept {
    if (ms < 0) return nullptr;
    t = {ms / 1000, (ms % 1000) * 1000000L};
    return &t;
  }
  struct timespec t0 {};
  explicit MsTimeout(int ms) noexcept : dl(rel(ms, t0)), cur(ms) {}
  bool resume() noexcept {
    if (dl.forever) return true;
    const struct timespec l = dl.left();
    cur = static_cast<int>(l.tv_sec * 1000 + (l.tv_nsec + 999999) / 1000000);
    return true;
  }
};
}  // namespace

/// Interposed epoll_pwait(2) (with_temporary_mask()).
UPROBE_INTERPOSED int epoll_pwait(int fd, struct epoll_event* ev, int max, int ms, const sigset_t* mask) {
  MsTimeout to(ms);
  return uprobe::detail::with_temporary_mask(
      mask, [&](const sigset_t* m) { return real().epoll_pwait(fd, ev, max, to.cur, m); },
      [&] { return to.resume(); });
}

/// Interposed epoll_pwait2(2) (with_temporary_mask()).
UPROBE_INTERPOSED int epoll_pwait2(int fd, struct epoll_event* ev, int max, const struct timespec* t,
                                   const sigset_t* mask) {
  if (!real().epoll_pwait2) {
    errno = ENOSYS;
    return -1;
  }
  Timeout to(t);
  return uprobe::detail::with_temporary_mask(
      mask, [&](const sigset_t* m) { return real().epoll_pwait2(fd, ev, max, to.ptr, m); },
      [&] { return to.resume(); });
}

// ---------------------------------------------------------------- sigwait

/// Interposed sigtimedwait(2): a held SIGTRAP in `set` is taken first; a
/// wait a held SIGTRAP interrupted (one sent to another thread for the
/// process, re-sent here: g_trap_waiter) returns it or goes on.
UPROBE_INTERPOSED int sigtimedwait(const sigset_t* set, siginfo_t* info, const struct timespec* t) {
  using namespace uprobe::detail;
  const bool want = opaque(set) && has_sig(*set, SIGTRAP);
  siginfo_t si;
  if (want && take_held(si)) {
    fold_tkill(si);
    if (info) *info = si;
    return SIGTRAP;
  }
  if (want) g_trap_waiter.store(self_tid(), std::memory_order_release);
  Timeout to(t);
  ThreadState& ts = t_state;
  int r;
  for (;;) {
    const std::uint32_t runs = ts.handler_runs, holds = ts.holds;
    r = real().sigtimedwait(set, info, to.ptr);
    if (!(r == -1 && errno == EINTR && ts.handler_runs == runs && ts.holds != holds)) break;
    if (want && take_held(si)) {
      fold_tkill(si);
      if (info) *info = si;
      r = SIGTRAP;
      break;
    }
    to.resume();
  }
  if (want) {
    pid_t me = self_tid();
    g_trap_waiter.compare_exchange_strong(me, 0, std::memory_order_acq_rel);
  }
  return r;
}

/// Interposed sigwaitinfo(2).
UPROBE_INTERPOSED int sigwaitinfo(const sigset_t* set, siginfo_t* info) { return sigtimedwait(set, info, nullptr); }

/// Interposed sigwait(3): returns an error number, never EINTR.
UPROBE_INTERPOSED int sigwait(const sigset_t* set, int* sig) {
  siginfo_t si;
  int r;
  do r = sigtimedwait(set, &si, nullptr);
  while (r < 0 && errno == EINTR);
  if (r < 0) return errno;
  *sig = r;
  return 0;
}

// ---------------------------------------------------------------- contexts

/// Interposed setcontext(3): the mask it restores never blocks SIGTRAP; the
/// view becomes uc_sigmask's SIGTRAP bit.
UPROBE_INTERPOSED int setcontext(const ucontext_t* ucp) noexcept {
  using namespace uprobe::detail;
  ucontext_t c;
  std::memcpy(&c, ucp, sizeof c);  // (uc_mcontext.fpregs still points at ucp's)
  const bool view = has_sig(c.uc_sigmask, SIGTRAP);
  c.uc_sigmask.__val[0] &= ~sig_bit(SIGTRAP);
  const unsigned char fault_state = uprobe_fault_state;
  note_fault_mask(c.uc_sigmask.__val[0]);
  ThreadState& ts = t_state;
  const bool was = uprobe_view_blocked;
  const bool mine = view == was || owns_view();
  if (mine) set_view(view);
  ts.ctx_view_set = mine && c.uc_mcontext.gregs[REG_RIP] == reinterpret_cast<greg_t>(&uprobe_context_resume);
  real().setcontext(&c);
  ts.ctx_view_set = false;  // failed
  if (mine) uprobe_view_blocked = was;
  uprobe_fault_state = fault_state;
  return -1;
}

/// Interposed swapcontext(3): getcontext(oucp) (context.S: the view in its
/// uc_sigmask) and setcontext(ucp); when oucp is resumed, returns 0 here.
UPROBE_INTERPOSED int swapcontext(ucontext_t* oucp, const ucontext_t* ucp) noexcept {
  volatile bool resumed = false;
  if (uprobe_getcontext(oucp) != 0) return -1;
  if (resumed) return 0;
  resumed = true;
  return setcontext(ucp);
}

// ---------------------------------------------------------------- longjmp

/// Interposed siglongjmp(3), longjmp(3), _longjmp and __longjmp_chk
/// (_FORTIFY_SOURCE): prepare_longjmp(), then glibc's.
UPROBE_INTERPOSED void siglongjmp(sigjmp_buf env, int val) noexcept {
  uprobe::detail::prepare_longjmp(env);
  real().siglongjmp(env, val);
  __builtin_unreachable();
}

UPROBE_INTERPOSED void longjmp(jmp_buf env, int val) noexcept {
  uprobe::detail::prepare_longjmp(env);
  real().longjmp(env, val);
  __builtin_unreachable();
}

UPROBE_INTERPOSED void _longjmp(jmp_buf env, int val) noexcept {
  uprobe::detail::prepare_longjmp(env);
  real().underscore_longjmp(env, val);
  __builtin_unreachable();
}

UPROBE_INTERPOSED [[noreturn]] void __longjmp_chk(jmp_buf env, int val) noexcept {
  uprobe::detail::prepare_longjmp(env);
  real().longjmp_chk(env, val);
  __builtin_unreachable();
}

// (pthread_create is interposed in thread_start.cpp: new_thread_view_blocked(),
// take_blocked_view_in_new_thread().)

}  // extern "C"
