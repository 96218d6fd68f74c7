// SPDX-License-Identifier: MIT
#pragma once
// The consumer chain: one hit of `up` on the calling thread.

#include "arch.hpp"
#include "probe.hpp"
#include "hot.hpp"

namespace uprobe::detail {

/// The kernel's handler_chain() on the int3 path, behind the per-thread
/// recursion guard: runs filters, entry handlers (with session cookies),
/// Action::remove, and arms the return probe for the consumers that want the
/// return, in signal context (the kernel saved the vector state: none is
/// saved here); a hit while a handler of ours runs on this thread only counts
/// a recursion miss. The caller holds the RCU read lock. AS-safe.
void guarded_handler_chain(Uprobe* up, Regs& regs) noexcept;

/// The core's side of an optimized hit: counts it, finds the uprobe by the
/// stub's key and runs the guarded handler chain on `regs` (rip = the site),
/// preserving around the consumers what they need (ConsumerSet::entry_save)
/// unless `kernel_saved` (the SIGTRAP handler, for a program single-stepping
/// into a stub: the signal frame holds the state). Called by the stub's C
/// entry and by that SIGTRAP path. Async-signal-safe.
void optimized_hit(const arch::OptSite& site, Regs& regs, bool kernel_saved) noexcept;

/// `m`, or SaveMode::full where it is not none and Config::site_state is
/// SiteState::full. Async-signal-safe. Inline: both hit paths read it per hit.
inline arch::SaveMode effective_save(arch::SaveMode m) noexcept {
  return m != arch::SaveMode::none && g_hot.full_state.load(std::memory_order_relaxed) ? arch::SaveMode::full : m;
}

}  // namespace uprobe::detail

