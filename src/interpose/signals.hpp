// SPDX-License-Identifier: MIT
#pragma once
// The SIGTRAP disposition (signals.cpp): libuprobe's handler installed under
// the program's sigaction()/signal(), and the program's own disposition kept
// and honoured for the traps that are not ours.

#include <signal.h>

#include "uprobe/lab.hpp"

namespace uprobe::detail {

/// Installs (or re-installs, after a configure()) the SIGTRAP handler with the
/// configured SignalMask. Defined in signals.cpp.
void install_trap_handler(SignalMask mask);

/// In a fork() child: forgets the other threads' hold on sigaction()'s
/// per-signal locks (signals.cpp).
void signals_after_fork_child() noexcept;

/// Passes a SIGTRAP that is not ours to the program's disposition
/// (signals.cpp). Async-signal-safe.
void forward_foreign_trap(int sig, siginfo_t* info, void* uc) noexcept;

/// True when the program's SIGTRAP disposition is a handler (not SIG_DFL or
/// SIG_IGN): only then can the program be single-stepping itself, and only
/// then does the SIGTRAP handler hand it the single-step trap of a probed
/// instruction (a TF without a handler is a debugger's, which sees its own
/// traps through ptrace). Async-signal-safe.
bool program_handles_sigtrap() noexcept;

}  // namespace uprobe::detail
