// SPDX-License-Identifier: MIT
#pragma once
// Process-wide runtime state: the registry writer's side, guarded by its
// mutex. What the hit path reads (g_hot) is in hit/hot.hpp.

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "fork_held_mutex.hpp"
#include "hot.hpp"
#include "signals.hpp"
#include "probe.hpp"
#include "uprobe/config.hpp"
#include "vma.hpp"

namespace uprobe::detail {


/// The registry: writer side, guarded by `mutex` (the kernel's
/// uprobes_treelock + register_rwsem rolled into one).
struct Registry {
  ForkHeldMutex mutex;  ///< (held across fork(): runtime.cpp before_fork())
  /// Every registered probe, by key. Changed only through insert_probe() and
  /// erase_probes() (txn_steps.cpp), which keep `keys` and `evicting` in step.
  boost::intrusive::set<Uprobe> tree;
  /// `tree` as an array, what the published ProbeTable copies: a publish
  /// reads it in one sweep instead of walking the tree's scattered nodes (a
  /// cache miss each), so an attach among 1,000 probes stays cheap. Sorted
  /// by key whenever `keys_sorted` (publish_probes() sorts it).
  std::vector<std::pair<ProbeKey, Uprobe*>> keys;
  bool keys_sorted = true;
  /// The probes of `tree` whose plan evicts the successor (window.evict.len:
  /// fixed at registration), whose successor key the ProbeTable also names.
  std::vector<Uprobe*> evicting;
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
/// a file-backed mapping there that the process still maps exactly
/// (file_offset_if_unchanged(): one ioctl); nullopt otherwise (the caller then reads the
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

/// Takes the registry mutex into `lock` (unlocked, on registry().mutex) so
/// that this thread never calls into the dynamic linker while holding it: a
/// thread inside dlopen() holds the dynamic linker's lock while a
/// constructor that registers a probe, forks or dlopen()s waits for the
/// mutex. First asks the dynamic linker what the checks need
/// (prepare_forbidden_checks()); then, holding the mutex, when
/// uprobe::defer_elfutils() left elfutils to the first ELF read and another
/// thread exists (/proc/self/task: any thread, pthread_create()'s or glibc's
/// own, C11 thrd_create, SIGEV_THREAD timers), lets the mutex go, loads
/// elfutils and takes it again (counted under the mutex: a thread alone
/// there creates none meanwhile). Not with the mutex held; not
/// async-signal-safe. @throws std::bad_alloc.
void lock_registry(std::unique_lock<ForkHeldMutex>& lock);

/// Starts the runtime once: SIGTRAP handler, fork handlers. Caller holds the mutex.
void start_runtime(Registry& r);

}  // namespace uprobe::detail
