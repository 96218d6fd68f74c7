// SPDX-License-Identifier: MIT
#pragma once
// Process-wide runtime state. The trap path reads only the `hot` globals
// (RCU-published snapshots, the address-space sequence count, switches);
// everything else belongs to the registry writer and is guarded by its mutex.

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "probe.hpp"
#include "spin_rwlock.hpp"
#include "uprobe/config.hpp"
#include "vma.hpp"

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

/// The registry: writer side, guarded by `mutex` (the kernel's
/// uprobes_treelock + register_rwsem rolled into one).
struct Registry {
  std::mutex mutex;
  boost::intrusive::set<Uprobe> tree;
  /// Frees that wait for the next grace period.
  std::vector<std::function<void()>> deferred;
  bool started = false;
};
Registry& registry();

/// Publishes new snapshots (either may be null = unchanged): blocks signals,
/// takes mm_lock for writing, bumps mm_seq around the stores. The old
/// snapshots are freed after the next grace period. Caller holds the mutex.
void publish(Registry& r, const VmaSnapshot* vmas, const ProbeTable* probes);

/// Waits for an RCU grace period, then runs the deferred frees. Caller holds
/// the mutex and is not in a read-side critical section.
void synchronize_and_reclaim(Registry& r);

/// Brings the VMA snapshot up to date: keeps the current one while the
/// process's file-backed mappings are exactly its own (file_mappings_unchanged(),
/// a few ioctls), else re-reads /proc/self/maps and publishes a new snapshot
/// if the layout changed. Returns the current snapshot. Caller holds the mutex.
const VmaSnapshot* refresh_vmas(Registry& r);

/// The file and offset of `addr` from the current snapshot, when it lies in
/// a file-backed mapping there and the file-backed mappings are unchanged
/// (file_mappings_unchanged()); nullopt otherwise (the caller then reads the
/// address space). Takes the registry mutex (not from a handler: nullopt).
std::optional<FileOffset> file_offset_from_snapshot(std::uint64_t addr);

/// Re-reads the address space and brings every probe in line with it: new
/// mappings of a probed file get their breakpoints and USDT semaphore counts
/// (pending probes), vanished ones are forgotten without a write. Called after
/// dlopen() and dlclose(). A transaction of no request
/// (Transaction::resync(), attach_txn.hpp); takes the registry mutex.
void resync_address_space();

/// After Config::optimize changed: converts every applied probe's sites to
/// the configured form. A transaction of no request
/// (Transaction::reoptimize(), attach_txn.hpp). Registry mutex held.
void reoptimize_all(Registry& r);

/// Starts the runtime once: SIGTRAP handler, fork handlers. Caller holds the mutex.
void start_runtime(Registry& r);

/// Installs (or re-installs, after a configure()) the SIGTRAP handler with the
/// configured SignalMask. Defined in signals.cpp.
void install_trap_handler(SignalMask mask);

/// In a fork() child: forgets the other threads' hold on sigaction()'s
/// per-signal locks (signals.cpp).
void signals_after_fork_child() noexcept;

/// The SIGTRAP handler (trap.cpp).
void on_sigtrap(int sig, siginfo_t* info, void* uc) noexcept;

/// Passes a SIGTRAP that is not ours to the program's disposition
/// (signals.cpp). Async-signal-safe.
void forward_foreign_trap(int sig, siginfo_t* info, void* uc) noexcept;

/// True when the program's SIGTRAP disposition is a handler (not SIG_DFL or
/// SIG_IGN): only then can the program be single-stepping itself, and only
/// then does the SIGTRAP handler hand it the single-step trap of a probed
/// instruction (a TF without a handler is a debugger's, which sees its own
/// traps through ptrace). Async-signal-safe.
bool program_handles_sigtrap() noexcept;

}  // namespace uprobe::detail
