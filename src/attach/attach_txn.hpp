// SPDX-License-Identifier: MIT
#pragma once
// The one attach path: a transaction. Every change to the probes goes
// through it: register_uprobe()/unregister_uprobe() are a transaction of one
// request, register_uprobes()/unregister_uprobes() of many, the dlopen/dlclose
// resync and configure() a transaction of no request (registry.cpp holds
// those thin wrappers). frida-gum's Interceptor makes every attach a
// transaction in the same way; the kernel's uprobe_register() is one request
// and its uprobe_unregister_nosync() + uprobe_unregister_sync() split is
// add-removals + commit here.
//
// A transaction holds the registry mutex from begin (the constructor) to its
// end (the destructor) and does once, whatever the number of requests: one
// read of the address space (snapshot(): refresh_vmas()), one open and ELF
// read per file, one publication of the probe table, one run of the
// optimized-jump protocol, and for removals one RCU grace period.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "patch.hpp"
#include "probe.hpp"
#include "runtime.hpp"
#include "uprobe/batch.hpp"
#include "validate.hpp"

namespace uprobe::detail {

/// The error of a request made from inside a handler (Errc::in_handler; the
/// same message for every API function).
Error in_handler_error(const std::string& path, std::uint64_t offset);

/// True when `up` is a probe of the registry (registry mutex held).
bool probe_registered(Registry& r, const Uprobe* up);

/// Holds a uprobe's patch_lock for a scope (spins; registry side only: the
/// trap path's Action::remove only ever try-locks it, dispatch.cpp).
class PatchLock {
 public:
  explicit PatchLock(Uprobe* up) noexcept;
  ~PatchLock();
  PatchLock(const PatchLock&) = delete;
  PatchLock& operator=(const PatchLock&) = delete;
  /// Takes / releases the lock without a scope (a probe locked across a loop).
  static void lock(Uprobe* up) noexcept;
  static void unlock(Uprobe* up) noexcept;

 private:
  Uprobe* up_;
};

/// An attach transaction: begin (constructor), add() / remove() requests,
/// commit(). Not thread-safe itself (one thread; the registry mutex it holds
/// serialises transactions); never from inside a handler (the callers refuse
/// that first, with in_handler_error()). Not async-signal-safe.
class Transaction {
 public:
  /// Begins: takes the registry mutex. `expected` is the number of requests
  /// that follow (sizes the bookkeeping; with more than one, each file's code
  /// is read through a window rather than one read per function, and reads of
  /// the text go through a page cache).
  explicit Transaction(std::size_t expected);
  /// Begins under the registry mutex the caller holds already (configure()).
  struct HeldLock {};
  Transaction(std::size_t expected, HeldLock);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  Registry& registry() noexcept { return r_; }

  /// Starts the runtime once (start_runtime()) and reads the address space:
  /// call before add(). @throws uprobe::Error as refresh_vmas().
  void begin_attach();

  /// Adds one consumer (the kernel's uprobe_register()): checks the request,
  /// then either adds it to a published probe at once or stages a new probe
  /// (in the tree, not yet published or written). Returns a ticket for
  /// added(); a refused request changes nothing and its error is there.
  std::size_t add(const ProbeRequest& q);

  /// Queues one removal (the kernel's uprobe_unregister_nosync()); done by
  /// commit() (uprobe_unregister_sync(): one grace period for all). Returns a
  /// ticket for removed().
  std::size_t remove(const ProbeConsumer& pc);

  /// Brings every probe in line with the address space (after dlopen() or
  /// dlclose()): breakpoints and USDT semaphore counts in new mappings of a
  /// probed file, vanished mappings forgotten without a write.
  void resync();

  /// After Config::optimize* changed: converts every applied probe's sites to
  /// the configured form (int3-only probes as one optimized-jump batch).
  void reoptimize();

  /// Commits: publishes the new probes, writes their breakpoints and
  /// optimized jumps, the USDT semaphores, then the removals (sites restored
  /// together, one publication), then waits one grace period when anything
  /// was removed or dropped (else only when many frees are pending).
  void commit();

  /// The outcome of add() `ticket` after commit(): the probe, or null and the
  /// error (an uprobe::Error, or what else was thrown, e.g. std::bad_alloc)
  /// with the file and offset the request named (an address resolved).
  struct Added {
    Uprobe* probe = nullptr;
    std::exception_ptr error;
    std::string path;
    std::uint64_t offset = 0;
  };
  const Added& added(std::size_t ticket) const { return adds_[ticket]; }
  /// The error of remove() `ticket` after commit(), null when it was done.
  const std::exception_ptr& removed(std::size_t ticket) const { return removes_[ticket].error; }

 private:
  struct Fresh {
    Uprobe* up;
    bool optimizable;  // optimizable() when it was made
  };
  struct Removal {
    ProbeConsumer pc;
    std::exception_ptr error;
  };
  class Files;

  const VmaSnapshot& snapshot();
  void writing();
  Uprobe* add_checked(const ProbeRequest& q, std::size_t ticket, std::string& path, std::uint64_t& offset);
  void add_to_published(Uprobe* up, std::unique_ptr<Registration> reg);
  void commit_adds();
  void commit_removals();

  std::unique_lock<ForkHeldMutex> lock_;
  Registry& r_;
  const std::size_t expected_;
  const VmaSnapshot* vmas_ = nullptr;
  std::optional<PeekCache> peeks_;
  std::optional<PokeSession> poke_;
  bool xol_batch_ = false;
  bool ri_reserved_ = false;  // uretprobe_reserve() ran for this transaction's return consumers
  ClobbersMemo clobbers_memo_;  // consumers' code read by this transaction (make_registration())
  std::unique_ptr<Files> files_;
  // The bookkeeping of the new probes comes from one arena, freed at once at
  // the end: once the breakpoints are in, every free() of a probed free() traps.
  std::pmr::monotonic_buffer_resource arena_;
  std::pmr::vector<Fresh> fresh_;
  std::pmr::unordered_map<const Uprobe*, std::size_t> fresh_index_;
  std::vector<Added> adds_;
  std::vector<std::size_t> fresh_of_;  // add ticket -> its fresh probe, or kNotFresh
  std::vector<Removal> removes_;
  bool must_sync_ = false;              // something was dropped or removed: wait a grace period
  std::size_t reclaim_over_ = 256;      // else reclaim only above this many deferred frees
};

}  // namespace uprobe::detail
