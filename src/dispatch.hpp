// SPDX-License-Identifier: MIT
#pragma once
// The consumer chain: one hit of `up` on the calling thread.

#include "arch.hpp"
#include "probe.hpp"

namespace uprobe::detail {

/// The kernel's handler_chain() behind the per-thread recursion guard: runs
/// filters, entry handlers (with session cookies), Action::remove, and arms
/// the return probe for the consumers that want the return; a hit while a
/// handler of ours runs on this thread only counts a recursion miss. The
/// caller holds the RCU read lock. AS-safe.
void guarded_handler_chain(Uprobe* up, Regs& regs) noexcept;

/// The core's side of an optimized hit: counts it, finds the uprobe by the
/// stub's key and runs the guarded handler chain on `regs` (rip = the site).
/// Called by the stub's C entry and, for a program single-stepping into a
/// stub, by the SIGTRAP handler. Async-signal-safe.
void optimized_hit(const arch::OptSite& site, Regs& regs) noexcept;

}  // namespace uprobe::detail

extern "C" {
/// The C entry of an optimized stub when no vector state is saved (called,
/// or tail-called, by arch's uprobe_opt_entry()): `frame` is the Regs the stub
/// pushed; runs optimized_hit() on it and sets the stub's continuation.
/// Async-signal-safe, allocation-free, no system call.
void uprobe_opt_hit(std::uint64_t* frame, const uprobe::arch::OptSite* site) noexcept;
}
