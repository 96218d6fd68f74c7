// SPDX-License-Identifier: MIT
#pragma once
// The state every hit reads: the RCU-published snapshots (VMAs, probes), the
// address-space sequence count and the switches. Written only by the
// registry writer (attach/runtime.hpp), under its mutex.

#include <atomic>
#include <cstdint>

#include "probe.hpp"
#include "spin_rwlock.hpp"
#include "uprobe/config.hpp"
#include "vma_snapshot.hpp"

namespace uprobe::detail {

/// State read on every hit. Written only by the registry writer.
struct HotState {
  /// The mm_lock_seq analog: odd while a writer publishes, bumped on every
  /// change of the VMA snapshot or the probe table.
  alignas(64) std::atomic<std::uint64_t> mm_seq{0};
  std::atomic<const VmaSnapshot*> vmas{nullptr};
  std::atomic<const ProbeTable*> probes{nullptr};
  std::atomic<LookupMode> lookup{LookupMode::speculative};
  std::atomic<XolMode> xol{XolMode::jump_back};
  std::atomic<bool> emulate{true};
  std::atomic<bool> optimize{true};
  std::atomic<bool> optimize_entries{true};
  std::atomic<bool> optimize_windows{true};  ///< Config::optimize_windows
  std::atomic<bool> optimize_punned{true};   ///< Config::optimize_punned
  std::atomic<bool> optimize_evicted{true};  ///< Config::optimize_evicted (read when a probe is analysed)
  /// Set (for good) once a successor's jump to its trampoline was first
  /// written: only then does a self-stepping program's foreign step look
  /// for a trampoline's mark (stepped_into_evicted()).
  std::atomic<bool> evicted_ever{false};
  std::atomic<SiteTactics> site_tactics{SiteTactics::windows};  ///< Config::site_tactics (read when a probe is analysed)
  /// Config::site_state == SiteState::full: every save the optimized paths
  /// make is SaveMode::full (effective_save()).
  std::atomic<bool> full_state{false};
  /// Written under the registry mutex only; not read on the trap path.
  SignalMask signal_mask_for_install = SignalMask::nodefer;
  uprobe::RiPool ri_pool_for_install = uprobe::RiPool::objpool;
  uprobe::RiLock ri_lock_for_install = uprobe::RiLock::none;
  unsigned max_depth_for_install = 64;
  bool optimize_for_install = true;
  /// The locked lookup path's lock (the mmap_lock analog).
  SpinRwLock mm_lock;
};
extern HotState g_hot;

/// Whether a displacement window may take the jump: Config::optimize_entries
/// for a function entry, Config::optimize_windows for a site inside one.
/// Async-signal-safe.
inline bool window_switch_on(bool function_entry) noexcept {
  return (function_entry ? g_hot.optimize_entries : g_hot.optimize_windows).load(std::memory_order_relaxed);
}

}  // namespace uprobe::detail
