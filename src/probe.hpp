// SPDX-License-Identifier: MIT
#pragma once
// struct uprobe, in process: the probe keyed by (dev, ino, offset), its
// consumer chain and its sites (one per executable mapping of the file).
// Readers (the trap path) see immutable ConsumerSet/SiteSet snapshots through
// RCU; writers replace them under the registry mutex.

#include <sys/types.h>

#include <atomic>
#include <boost/intrusive/set.hpp>
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "arch.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

/// The kernel's (inode, offset) key; dev + ino stand for the inode.
struct ProbeKey {
  dev_t dev = 0;
  ino_t ino = 0;
  std::uint64_t offset = 0;
  auto operator<=>(const ProbeKey&) const = default;
};

/// One consumer registered on one probe. `removed` is set by the trap path
/// when the handler returned Action::remove.
struct Registration {
  Consumer* consumer = nullptr;
  std::uint64_t id = 0;  ///< unique for the life of the process (return instances name consumers by id)
  bool has_entry = true;
  bool has_ret = false;
  std::atomic<bool> removed{false};
  /// USDT semaphore counts this registration incremented (writer side only).
  std::vector<std::uint64_t> ref_ctr_addrs;
};

/// Immutable consumer chain (replaced, never edited, once published).
struct ConsumerSet {
  std::vector<Registration*> regs;
};

/// A place where the breakpoint is written: the runtime address of the probed
/// instruction in one mapping, and its XOL slot.
struct Site {
  std::uint64_t addr = 0;
  std::uint64_t xol = 0;
};

/// Immutable set of sites.
struct SiteSet {
  std::vector<Site> sites;
  const Site* find(std::uint64_t addr) const noexcept {
    for (const Site& s : sites)
      if (s.addr == addr) return &s;
    return nullptr;
  }
};

}  // namespace uprobe::detail

namespace uprobe {

class Uprobe : public boost::intrusive::set_base_hook<> {
 public:
  detail::ProbeKey key;
  std::uint64_t id = 0;  ///< unique for the life of the process (return instances name probes by key + id)
  std::uint64_t ref_ctr_offset = 0;  ///< file offset of the USDT semaphore, 0 = none
  std::string path;
  arch::Insn insn;
  std::atomic<detail::ConsumerSet*> consumers{nullptr};
  std::atomic<detail::SiteSet*> sites{nullptr};
  /// Serialises breakpoint writes between the registry and the trap path's
  /// Action::remove (which only ever try-locks it). Guards `applied`.
  std::atomic_flag patch_lock = ATOMIC_FLAG_INIT;
  bool applied = false;

  friend bool operator<(const Uprobe& a, const Uprobe& b) { return a.key < b.key; }
};

}  // namespace uprobe

namespace uprobe::detail {

struct KeyLess {
  bool operator()(const ProbeKey& k, const Uprobe& u) const { return k < u.key; }
  bool operator()(const Uprobe& u, const ProbeKey& k) const { return u.key < k; }
};

/// The RCU-published lookup structure of the trap path: (key -> uprobe),
/// sorted, immutable.
class ProbeTable {
 public:
  std::vector<std::pair<ProbeKey, Uprobe*>> entries;
  /// Async-signal-safe, allocation-free binary search.
  Uprobe* find(const ProbeKey& k) const noexcept {
    std::size_t lo = 0, hi = entries.size();
    while (lo < hi) {
      std::size_t mid = lo + (hi - lo) / 2;
      if (entries[mid].first < k)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo < entries.size() && entries[lo].first == k ? entries[lo].second : nullptr;
  }
};

}  // namespace uprobe::detail
