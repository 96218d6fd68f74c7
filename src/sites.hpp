// SPDX-License-Identifier: MIT
#pragma once
// Writing and restoring probe sites: int3, and the optimized form (a jmp rel32
// into a per-site stub) with the cross-modifying protocol of the kernel's
// text_poke_bp(): int3 at byte 0, serialise every core, write the tail,
// serialise, write byte 0, serialise. Callers hold the uprobe's patch_lock.

#include <string>
#include <vector>

#include "probe.hpp"
#include "vma.hpp"

namespace uprobe::detail {

/// Writes int3 at every site. On failure restores what it wrote and throws
/// uprobe::Error(system). Registry side.
void apply_sites(Uprobe* up, const SiteSet& ss);

/// Restores the original bytes at every site that holds our int3 or our jump
/// (un-optimizing through int3). Async-signal-safe (open/pwrite/membarrier).
void restore_sites(Uprobe* up, const SiteSet& ss) noexcept;

/// Why `up` can never be optimized as things are configured ("" when its
/// shape allows it). Registry side.
std::string why_not_optimizable(const Uprobe* up);

/// Why `up` is not optimized: why_not_optimizable(), else the reason the
/// last attempt failed (a thread inside the window), else "". Registry side.
std::string why_not_optimized(const Uprobe* up);

/// Converts the int3 sites of an optimizable uprobe into jumps to stubs.
/// Sites that cannot be converted stay int3. Registry mutex held.
void optimize_sites(Uprobe* up, const SiteSet& ss, const std::vector<Vma>& vmas);

/// Turns optimized sites back into int3 sites (jmp -> int3, through the same
/// protocol). Patch lock held.
void deoptimize_sites(Uprobe* up, const SiteSet& ss) noexcept;

/// Rewrites the stubs' "save vector state" flag after the consumer set
/// changed. Registry mutex held.
void refresh_stub_flags(Uprobe* up, const SiteSet& ss);

/// True when the site currently jumps to its stub (not merely holds a jmp
/// rel32: a function may start with one). Patch lock held, or registry side.
/// Async-signal-safe.
bool site_is_optimized(const Site& s) noexcept;

/// The stub built for the site address `addr` in this process, 0 if none.
/// Registry mutex held.
std::uint64_t stub_of(std::uint64_t addr);

/// Registers for membarrier(SYNC_CORE) once; false when unavailable.
bool init_core_sync();

}  // namespace uprobe::detail
