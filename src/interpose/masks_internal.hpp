// SPDX-License-Identifier: MIT
#pragma once
// What masks.cpp (the mask view's state) shares with masks_interposed.cpp
// (the interposed libc entry points): the libc functions they call on, and
// the held SIGTRAPs' state a sigwait takes from. Internal to src/interpose/.

#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/types.h>
#include <time.h>
#include <ucontext.h>

#include <atomic>
#include <cstddef>

namespace uprobe::detail {

/// The libc functions the interposers call on.
struct Real {
  int (*setcontext)(const ucontext_t*);
  void (*siglongjmp)(sigjmp_buf, int);
  void (*longjmp)(jmp_buf, int);
  void (*underscore_longjmp)(jmp_buf, int);
  void (*longjmp_chk)(jmp_buf, int);
  int (*sigsuspend)(const sigset_t*);
  int (*sigtimedwait)(const sigset_t*, siginfo_t*, const struct timespec*);
  int (*ppoll)(struct pollfd*, nfds_t, const struct timespec*, const sigset_t*);
  int (*ppoll_chk)(struct pollfd*, nfds_t, const struct timespec*, const sigset_t*, std::size_t);
  int (*pselect)(int, fd_set*, fd_set*, fd_set*, const struct timespec*, const sigset_t*);
  int (*epoll_pwait)(int, struct epoll_event*, int, int, const sigset_t*);
  int (*epoll_pwait2)(int, struct epoll_event*, int, const struct timespec*, const sigset_t*);
  int (*pthread_create)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  int (*attr_getsigmask)(const pthread_attr_t*, sigset_t*);
};

/// g_real, resolved (an interposer may run before libuprobe's constructor:
/// another object's constructor).
const Real& real() noexcept;

/// The view belongs to the thread: a vfork() child shares its parent's TLS
/// (and stack) but has a mask of its own, so it must not move the view.
/// (Before the thread's id is cached, it is the thread's.)
bool owns_view() noexcept;

/// A thread waiting for SIGTRAP in sigwait()/sigwaitinfo()/sigtimedwait().
extern std::atomic<pid_t> g_trap_waiter;

/// Takes a held SIGTRAP the calling thread may receive (its own first).
bool take_held(siginfo_t& out) noexcept;

}  // namespace uprobe::detail
