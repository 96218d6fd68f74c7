// SPDX-License-Identifier: MIT
#pragma once
// The program's signal masks while libuprobe owns SIGTRAP (src/interpose/masks.cpp).
//
// An int3 hit in a thread that blocks SIGTRAP is fatal: the kernel forces
// the signal and the process dies. So from the moment libuprobe is loaded no
// mask the program sets through libc blocks SIGTRAP for real; whether the
// program asked for it is kept per thread (the "view" bit below) and shown
// back wherever the program reads a mask (sigprocmask()'s old set,
// sigaction()'s sa_mask, getcontext()'s uc_sigmask, a handler's ucontext,
// posix_spawnattr_getsigmask()). A SIGTRAP sent to a thread whose view
// blocks it is held by libuprobe and delivered when the view unblocks it (or
// taken by sigwait()); a synchronous one (a foreign int3, a single-step
// trap) kills the process, as the kernel does.

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

#include <cstdint>

#include "services.hpp"

// uprobe_view_blocked, the calling thread's SIGTRAP bit as the program sees
// its own mask (initial-exec TLS, read by arch/x86_64/interpose/context.S):
// declared with the core symbols arch code names (arch.hpp), defined in
// masks.cpp.

namespace uprobe::detail {

/// Bit of `sig` (1..64) in the first word of a sigset_t, the only word the
/// kernel reads (glibc's sigset_t is 16 words; its sigprocmask passes 8 bytes).
constexpr unsigned long sig_bit(int sig) noexcept { return 1ul << (sig - 1); }
inline bool has_sig(const sigset_t& s, int sig) noexcept { return (s.__val[0] & sig_bit(sig)) != 0; }

/// The calling thread's id: t_state's cached one, else gettid(2) (not
/// cached: current_tid()'s caching is instrumented code in sanitizer builds,
/// and the interposers run before the sanitizer runtime is ready).
/// Async-signal-safe.
pid_t self_tid() noexcept;

/// rt_sigprocmask(2) made with the syscall instruction: the thread's real
/// mask, no virtualisation. Returns 0 or a negative errno. Async-signal-safe.
long raw_sigprocmask(int how, const sigset_t* set, sigset_t* old) noexcept;

/// sigprocmask()/pthread_sigmask() as the program sees them: `set` never
/// blocks SIGTRAP for real (nor glibc's SIGCANCEL/SIGSETXID, as glibc's own
/// wrapper), `old` shows SIGTRAP when the program's view blocks it. A SIGTRAP
/// found blocked for real (inherited across execve, or blocked before
/// libuprobe was loaded) becomes the view's and is unblocked. A SIGTRAP held
/// while the view blocked it is delivered when the view unblocks it. Returns
/// 0 or an errno value (EINVAL for a bad `how`). Async-signal-safe.
int program_sigmask(int how, const sigset_t* set, sigset_t* old) noexcept;

// set_view(blocked): declared in src/hit/services.hpp, defined in masks.cpp
// (when the view becomes clear, it delivers a held SIGTRAP:
// deliver_held_sigtrap()).

/// What the SIGTRAP handler does with a SIGTRAP that is neither a probe hit
/// nor libuprobe's own step trap, sent (not forced: si_code <= 0) while the
/// calling thread's view blocks it: keeps it, as the kernel keeps a blocked
/// signal pending, for the thread (tkill/tgkill/raise) or for the process
/// (kill/sigqueue; re-sent to a thread waiting for SIGTRAP in sigwait() if
/// there is one). Async-signal-safe.
void hold_sigtrap(const siginfo_t& info) noexcept;

/// Whether a held SIGTRAP is there for the calling thread (its own or the
/// process's). Async-signal-safe.
bool sigtrap_held() noexcept;

/// Re-sends every held SIGTRAP the calling thread may take to itself
/// (rt_tgsigqueueinfo with the original siginfo): the kernel delivers it on
/// the way back from that system call. Call with the view clear and SIGTRAP
/// unblocked. Async-signal-safe.
void deliver_held_sigtrap() noexcept;

/// Counts a run of one of the program's signal handlers on this thread (a
/// call interrupted only by a held SIGTRAP is resumed, one interrupted by a
/// handler returns EINTR). Async-signal-safe.
void note_program_handler_run() noexcept;

/// Re-arms the program's view of SIGTRAP around a handler of the program:
/// `uc` is the handler's ucontext, `in_handler` whether the handler runs with
/// SIGTRAP in its mask (sa_mask, or SIGTRAP's own handler without
/// SA_NODEFER). Shows the interrupted code's view in uc->uc_sigmask and sets
/// the view for the handler. finish() takes the view the handler left in
/// uc->uc_sigmask (restored at sigreturn) and clears the real bit again.
/// The thread's SIGSEGV/SIGBUS state (uprobe_fault_state) is unknown while
/// the handler runs and the interrupted code's again after it (unless the
/// handler changed those bits of uc_sigmask). Async-signal-safe.
class HandlerView {
 public:
  HandlerView(void* uc, bool in_handler) noexcept;
  void finish() noexcept;

 private:
  void* uc_;
  bool real_blocked_;
  unsigned char fault_state_;  ///< the interrupted code's uprobe_fault_state
  unsigned long fault_bits_;   ///< its SIGSEGV and SIGBUS bits of uc_sigmask
};

/// Forgets the calling thread's SIGSEGV/SIGBUS state (uprobe_fault_state):
/// the next in-process read asks the kernel. Async-signal-safe.
void forget_fault_state() noexcept;

/// The state after a mask change to `mask_word` through libc: blocked is
/// kept (a wrong "blocked" costs only speed); unblocked is kept when it was
/// known already, else left for the kernel to confirm (a vfork() child's
/// change would otherwise tell its parent, whose TLS it shares, that
/// nothing is blocked). Async-signal-safe.
void note_fault_mask(unsigned long mask_word) noexcept;

/// Resolves the libc functions the interposers call on (dlsym RTLD_NEXT),
/// takes over a SIGTRAP the main thread inherited blocked and installs the
/// SIGTRAP handler: what libuprobe's load does (a constructor in masks.cpp).
void init_masks() noexcept;

/// Whether a thread created now by the calling thread starts with SIGTRAP in
/// its view: the caller's view, or pthread_attr_setsigmask_np()'s set in
/// `attr`. Used by the interposed pthread_create() (thread_start.cpp).
bool new_thread_view_blocked(const pthread_attr_t* attr) noexcept;

/// In the new thread, before its start routine: SIGTRAP unblocked for real,
/// blocked in its view. Not instrumented (it runs before a sanitizer's
/// thread set-up).
void take_blocked_view_in_new_thread() noexcept;

}  // namespace uprobe::detail
