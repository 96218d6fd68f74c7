// SPDX-License-Identifier: MIT
#pragma once
// The SIGTRAP disposition (signals.cpp): libuprobe's handler installed under
// the program's sigaction()/signal(), and the program's own disposition kept
// and honoured for the traps that are not ours.

#include <signal.h>

#include <cstdint>

#include "services.hpp"
#include "uprobe/lab.hpp"

namespace uprobe::detail {

/// Installs (or re-installs, after a configure()) the SIGTRAP handler with the
/// configured SignalMask. Defined in signals.cpp.
void install_trap_handler(SignalMask mask);

/// Where the handler libuprobe installed for SIGTRAP returns through: the
/// sa_restorer libc set for it (glibc's __restore_rt, whose rt_sigreturn
/// system call ends every signal handler), as an address in this process; 0
/// before install_trap_handler() or when libc set none. A probe on those
/// bytes would be hit by the return of its own SIGTRAP handler and recurse
/// without end (validate.cpp refuses it). Any thread; async-signal-safe (an
/// atomic load).
std::uint64_t signal_return_trampoline() noexcept;

/// In a fork() child: forgets the other threads' hold on sigaction()'s
/// per-signal locks and on the lock of the program's SIGTRAP action (the
/// interposed sigaction(SIGTRAP) takes it without the per-signal lock), and
/// makes the child the owner of the handler tables (signals.cpp).
void signals_after_fork_child() noexcept;

/// Whether the calling process is not the one whose memory holds the
/// handler tables: a vfork() child or clone(CLONE_VM) process (or a child of
/// a raw fork system call, which no atfork handler told). sigaction() there
/// leaves the tables alone. Async-signal-safe (one getpid system call).
bool shares_parents_tables() noexcept;

/// Makes SIGSEGV and SIGBUS go to uprobe_signal_wrapper() whatever the
/// program's disposition (the program's own kept in the table and honoured
/// for every signal that is not a fault of arch::copy_user() or
/// copy_user_str(), which the wrapper resumes at their fixup). Idempotent;
/// true once both are armed, false in a vfork() child or when
/// rt_sigaction(2) fails. Any thread; not async-signal-safe (it takes
/// sigaction()'s per-signal locks).
bool arm_user_faults() noexcept;

// user_faults_armed(): declared in src/hit/services.hpp (the hit path's
// reads ask it), defined in signals.cpp.

// forward_foreign_trap() and program_handles_sigtrap(): declared in
// src/hit/services.hpp (the SIGTRAP handler calls them), defined in
// signals.cpp.

}  // namespace uprobe::detail
