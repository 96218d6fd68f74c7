// SPDX-License-Identifier: MIT
#pragma once
// The SIGTRAP disposition (signals.cpp): libuprobe's handler installed under
// the program's sigaction()/signal(), and the program's own disposition kept
// and honoured for the traps that are not ours.

#include <signal.h>

#include "services.hpp"
#include "uprobe/lab.hpp"

namespace uprobe::detail {

/// Installs (or re-installs, after a configure()) the SIGTRAP handler with the
/// configured SignalMask. Defined in signals.cpp.
void install_trap_handler(SignalMask mask);

/// In a fork() child: forgets the other threads' hold on sigaction()'s
/// per-signal locks (signals.cpp).
void signals_after_fork_child() noexcept;

// forward_foreign_trap() and program_handles_sigtrap(): declared in
// src/hit/services.hpp (the SIGTRAP handler calls them), defined in
// signals.cpp.

}  // namespace uprobe::detail
