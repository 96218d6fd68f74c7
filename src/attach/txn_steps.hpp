// SPDX-License-Identifier: MIT
#pragma once
// The steps of the one attach path (txn_steps.cpp), each written once: what
// a Transaction (attach_txn.cpp) runs, with the registry mutex it holds.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "probe.hpp"
#include "runtime.hpp"
#include "vma_snapshot.hpp"

namespace uprobe::detail {

/// The sites of `up` in the current address space: one per executable
/// mapping of the file that covers the offset. Prepares their XOL slots.
/// @throws uprobe::Error(refused_instruction) when a site cannot be probed.
std::unique_ptr<SiteSet> compute_sites(Uprobe* up, const VmaSnapshot& vmas);

/// Brings the sites of `up` in line with the address space: new mappings get
/// the breakpoint (when applied), vanished ones are dropped without a write.
/// @throws uprobe::Error(refused_instruction) as compute_sites().
void sync_sites(Registry& r, Uprobe* up, const VmaSnapshot& vmas);

/// Brings one registration's semaphore increments in line with the mappings
/// (the kernel's update_ref_ctr()): +1 where the file's semaphore is mapped
/// and not yet counted; forgets addresses that are no longer mapped (nothing
/// to decrement there).
void sync_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas);

/// Undoes a registration's increments where the semaphore is still mapped;
/// never below 0.
void release_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas);

/// Retires the per-site memory of `up`, which left the tree (published
/// without it) and whose sites hold the file's bytes again: reused once no
/// thread can be inside (reclaim_retired(), after the transaction's grace
/// period). Per-site memory belongs to a site address, not to a probe: a
/// site of `up` in a mapping that is no longer the file's (a stale one, when
/// another file is mapped there now) may share it with a live probe, and
/// keeps it.
void retire_sites(const Uprobe* up, const VmaSnapshot& vmas);

/// Adds `up` to the registry's tree, keys (appended: sorted at the next
/// publish, once for a whole batch) and evicting list.
void insert_probe(Registry& r, Uprobe* up);

/// Removes `ups` (each in the tree) from the registry's tree, keys and
/// evicting list: one compaction of each array for the whole batch.
void erase_probes(Registry& r, const std::vector<Uprobe*>& ups);

/// Publishes a new probe table built from the registry's keys.
void publish_probes(Registry& r);

/// The first probe (or `extra`) at key.offset + [1, len) in the file of
/// `k`, as an offset; 0 when none.
std::uint64_t probe_within(Registry& r, const ProbeKey& k, std::size_t len, const ProbeKey* extra);

/// The offset of a probe of the same file strictly inside the window of
/// `up` (`extra` counts as one when given), or 0.
std::uint64_t probe_inside_window(Registry& r, const Uprobe* up, const ProbeKey* extra);

/// Re-evaluates the window of every entry probe of the file of `k` whose
/// window may cover k.offset: blocked ones go back to int3 (before a probe
/// inside them gets its breakpoint), unblocked ones are optimized again
/// (when `vmas` is given).
void refresh_windows_around(Registry& r, const ProbeKey& k, const ProbeKey* extra, const VmaSnapshot* vmas);

/// Ids of probes and registrations: unique for the life of the process
/// (registry mutex held).
std::uint64_t next_id();

std::unique_ptr<Registration> make_registration(Consumer& c, ClobbersMemo& memo);

/// The refusals of one more consumer on an existing probe (errors name the
/// request's path and offset).
void check_can_add(const Uprobe* up, const ConsumerSet& cs, const Registration& reg, std::uint64_t ref_ctr_offset,
                   const std::string& path, std::uint64_t offset);

}  // namespace uprobe::detail
