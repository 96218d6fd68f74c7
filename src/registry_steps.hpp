// SPDX-License-Identifier: MIT
#pragma once
// The steps of register_uprobe()/unregister_uprobe() (registry.cpp) that the
// batch API (batch.cpp) runs too, one probe at a time but with one address-
// space snapshot, one probe-table publication and one grace period for the
// whole batch. Every function: caller holds the registry mutex.

#include <memory>

#include "probe.hpp"
#include "runtime.hpp"
#include "vma.hpp"

namespace uprobe::detail {

/// The sites of `up` in `vmas` (one per executable mapping of its file that
/// covers the offset), with their XOL slots prepared.
/// @throws uprobe::Error(refused_instruction) when a site cannot be probed.
std::unique_ptr<SiteSet> probe_sites(Uprobe* up, const VmaSnapshot& vmas);

/// Brings the sites of `up` in line with `vmas` (breakpoints in new mappings
/// when applied; vanished ones dropped without a write).
/// @throws uprobe::Error(refused_instruction) as probe_sites().
void sync_probe_sites(Registry& r, Uprobe* up, const VmaSnapshot& vmas);

/// +1 on the USDT semaphore of `up` in every mapping where `reg` has not
/// counted yet; forgets unmapped addresses.
void sync_probe_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas);

/// Undoes `reg`'s semaphore increments where still mapped (never below 0).
void release_probe_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas);

/// Publishes a new probe table built from the registry's tree.
void publish_probe_table(Registry& r);

/// The offset of a probe of the same file strictly inside the entry window
/// of `up` (`extra` counts as one when given), or 0.
std::uint64_t probe_in_window(Registry& r, const Uprobe* up, const ProbeKey* extra);

/// Re-evaluates the window of every entry probe of the file of `k` whose
/// window may cover k.offset: blocked ones go back to int3, unblocked ones
/// are optimized again (when `vmas` is given).
void refresh_entry_windows(Registry& r, const ProbeKey& k, const ProbeKey* extra, const VmaSnapshot* vmas);

/// True when `up` is a probe of the registry.
bool probe_registered(Registry& r, const Uprobe* up);

/// Holds `up`'s patch_lock (breakpoint writes against the trap path's
/// Action::remove).
class PatchLock {
 public:
  explicit PatchLock(Uprobe* up) : up_(up) {
    while (up_->patch_lock.test_and_set(std::memory_order_acquire)) __builtin_ia32_pause();
  }
  ~PatchLock() { up_->patch_lock.clear(std::memory_order_release); }
  PatchLock(const PatchLock&) = delete;
  PatchLock& operator=(const PatchLock&) = delete;

 private:
  Uprobe* up_;
};

}  // namespace uprobe::detail
