// SPDX-License-Identifier: MIT
#pragma once
// The consumer chain: one hit of `up` on the calling thread.

#include "probe.hpp"

namespace uprobe::detail {

/// Runs filters, entry handlers (with session cookies), Action::remove, and
/// arms the return probe for the consumers that want the return. The caller
/// holds the RCU read lock and has set the recursion guard. AS-safe.
void handler_chain(Uprobe* up, Regs& regs) noexcept;

/// handler_chain() behind the per-thread recursion guard: a hit while a
/// handler of ours runs on this thread only counts a recursion miss.
void guarded_handler_chain(Uprobe* up, Regs& regs) noexcept;

}  // namespace uprobe::detail
