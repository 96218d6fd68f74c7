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

/// Why `up` cannot be optimized ("" when it can). Registry side.
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

/// True when the site at `addr` currently jumps to our stub.
bool site_is_optimized(std::uint64_t addr) noexcept;

/// Registers for membarrier(SYNC_CORE) once; false when unavailable.
bool init_core_sync();

}  // namespace uprobe::detail
