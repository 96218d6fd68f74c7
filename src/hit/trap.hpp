// SPDX-License-Identifier: MIT
#pragma once
// The int3 hit path's entry (trap.cpp): what the SIGTRAP handler installed
// by interpose/signals.cpp runs.

#include <signal.h>

namespace uprobe::detail {

/// The SIGTRAP handler (trap.cpp).
void on_sigtrap(int sig, siginfo_t* info, void* uc) noexcept;

}  // namespace uprobe::detail
