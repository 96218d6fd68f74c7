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
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
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
  /// The code of the consumer's filter() when it is `return true;` and nothing
  /// more (Consumer's own, as compilers emit it; see trivial_filter() in
  /// sites.hpp), else nullptr. A hit whose consumer still has that filter
  /// (filter_code()) skips the call, and no vector state is saved for it.
  const void* trivial_filter = nullptr;
  /// The consumer's handler() and ret_handler() code as read at
  /// registration, and what it can clobber (arch::analyze_clobbers(); not
  /// read, unknown, for a consumer that declared set_vector_state_unused()
  /// or has no such callback): save_modes() saves only that around them.
  const void* handler_code = nullptr;
  const void* ret_code = nullptr;
  arch::Clobbers handler_clobbers{};
  arch::Clobbers ret_clobbers{};
  std::atomic<bool> removed{false};
  /// USDT semaphore counts this registration incremented (writer side only).
  std::vector<std::uint64_t> ref_ctr_addrs;
};

/// What analyze_clobbers() said of each code address, within one transaction
/// (a consumer registered on many probes is read once; not kept longer: a
/// library unloaded and another loaded there may put other code at an address).
using ClobbersMemo = std::unordered_map<const void*, arch::Clobbers>;

/// The code of the virtual member function `pmf` of `c`'s class, read from
/// its vtable (Itanium C++ ABI 2.3: a pointer to a virtual member function
/// is 1 + the byte offset of its slot; the vtable pointer is the object's
/// first word). Async-signal-safe.
template <class Pmf>
inline const void* virtual_code(const Consumer& c, Pmf pmf) noexcept {
  struct {
    std::uintptr_t ptr;
    std::ptrdiff_t adj;
  } rep;
  static_assert(sizeof pmf == sizeof rep);
  __builtin_memcpy(&rep, &pmf, sizeof rep);
  const char* vtable;
  __builtin_memcpy(&vtable, &c, sizeof vtable);
  const void* fn;
  __builtin_memcpy(&fn, vtable + (rep.ptr - 1), sizeof fn);
  return fn;
}

/// The code of `c`'s filter(), handler() and ret_handler(). Async-signal-safe.
inline const void* filter_code(const Consumer& c) noexcept { return virtual_code(c, &Consumer::filter); }
inline const void* handler_code(const Consumer& c) noexcept { return virtual_code(c, &Consumer::handler); }
inline const void* ret_handler_code(const Consumer& c) noexcept { return virtual_code(c, &Consumer::ret_handler); }

/// ConsumerSet::entry_sse / ret_sse: the consumers' code was not read as
/// legacy SSE only (arch::Clobbers unknown): the save mode's full preservation.
inline constexpr std::uint8_t kSseUnknown = 0xff;
/// Distinct handler codes a ConsumerSet's SSE-only saves stand for; more: unknown.
inline constexpr std::size_t kMaxSseCodes = 4;

/// Immutable consumer chain (replaced, never edited, once published).
struct ConsumerSet {
  ConsumerSet() noexcept : serial(next_serial()) {}
  explicit ConsumerSet(std::vector<Registration*> r) noexcept : regs(std::move(r)), serial(next_serial()) {}
  /// A copy to edit: the same consumers and save modes, a serial of its own.
  ConsumerSet(const ConsumerSet& o)
      : regs(o.regs), entry_save(o.entry_save), ret_save(o.ret_save), entry_sse(o.entry_sse), ret_sse(o.ret_sse),
        nsse_codes(o.nsse_codes), serial(next_serial()) {
    for (std::size_t i = 0; i < kMaxSseCodes; ++i) sse_codes[i] = o.sse_codes[i];
  }
  ConsumerSet& operator=(const ConsumerSet&) = delete;

  std::vector<Registration*> regs;
  /// What the optimized path preserves around the filters and handlers
  /// (entry side) and the return trampoline around the ret_handlers, beyond
  /// the general registers: SaveMode::none when every consumer that runs
  /// there declared set_vector_state_unused(), else what the site makes live
  /// (save_modes(), sites.cpp). Set before the set is published. The int3
  /// path needs none: the kernel saved everything in the signal frame.
  arch::SaveMode entry_save = arch::SaveMode::none;
  arch::SaveMode ret_save = arch::SaveMode::none;
  /// Where the consumers that need a save run only code read as legacy SSE
  /// (arch::analyze_clobbers(), save_modes()): how many xmm registers from
  /// xmm0 it may write, saved instead of what entry_save / ret_save name
  /// (arch::sse_save()); kSseUnknown: the save mode's. A hit
  /// whose consumer runs a handler not among sse_codes (its class changed
  /// after it registered) preserves the full state around that handler.
  std::uint8_t entry_sse = kSseUnknown;
  std::uint8_t ret_sse = kSseUnknown;
  std::uint8_t nsse_codes = 0;
  const void* sse_codes[kMaxSseCodes] = {};
  /// Whether `code` (a handler's or ret_handler's) is one of sse_codes. Async-signal-safe.
  bool sse_code(const void* code) const noexcept {
    for (std::uint8_t i = 0; i < nsse_codes; ++i)
      if (sse_codes[i] == code) return true;
    return false;
  }
  /// Unique for the life of the process (a set allocated where a freed one
  /// was has another): a return instance that recorded the set of its entry
  /// hit knows, by pointer and serial, that the set published at the return
  /// is that one, its registrations alive, and calls the consumers it
  /// recorded without looking them up.
  const std::uint64_t serial;
  /// The common case, decided when the set is made (save_modes()): its one
  /// consumer has an entry handler, wants no return, and its filter was read
  /// as `return true;`, what a save around it needs is known (nothing, or
  /// the SSE-only save of the handler read: entry_save / entry_sse), and the
  /// site is not one whose faults are fatal (Uprobe::faults_fatal). An
  /// optimized hit then checks that the consumer's class still has that
  /// filter and handler and calls it (sole_entry_hit(), dispatch.cpp),
  /// without the consumer loop's bookkeeping. nullptr otherwise.
  Registration* sole_entry = nullptr;

 private:
  static std::uint64_t next_serial() noexcept {
    static std::atomic<std::uint64_t> n{0};
    return n.fetch_add(1, std::memory_order_relaxed) + 1;
  }
};

/// A place where the breakpoint is written: the runtime address of the probed
/// instruction in one mapping, and its XOL slot.
struct Site {
  std::uint64_t addr = 0;
  std::uint64_t xol = 0;
  /// The window slot of an entry probe (every displaced instruction,
  /// relocated, then a jump to addr + window.len), 0 if none. While entry
  /// optimization is on and nothing blocks the window, the int3 path
  /// continues there, so that no thread resumes inside bytes the optimized
  /// jump may overwrite; the stub continues there too.
  std::uint64_t window_xol = 0;
  /// This site's optimized-probe stub, 0 before one was built; written and
  /// read under the uprobe's patch_lock (the registry carries it over when it
  /// replaces the SiteSet).
  mutable std::uint64_t stub = 0;
  /// A punned window's hop (arch::EntryWindow::punned): where the site's
  /// jump lands, a `jmp` to the stub there; 0 for the other sites, or when
  /// no page at the address the jump's fixed bytes select was free (the site
  /// stays int3).
  std::uint64_t hop = 0;
  /// The redundant prefixes before a punned jump's opcode (E9Patch's T1,
  /// arch::EntryWindow::min_pad .. max_pad): the first pad for which a hop
  /// was found; 0 for B2 and the other tactics.
  std::uint8_t pad = 0;
  /// Successor eviction (E9Patch's T2, arch::EntryWindow::evict): the
  /// successor's address (addr + window.len), its trampoline (its relocated
  /// copy, then a jump back; where its own jump lands) and the prefixes
  /// before its jump; 0 for a site that evicts nothing. The site's hop and
  /// pad are then the ones solve_evicted() chose with it.
  std::uint64_t evict_addr = 0;
  std::uint64_t evict_hop = 0;
  std::uint8_t evict_pad = 0;
  /// The trampoline's code length (before its mark, arch::kEvictMark): a
  /// self-stepping program's steps in [evict_hop, evict_hop + evict_len)
  /// are not its own.
  std::uint8_t evict_len = 0;
  /// 1 from before the jump's tail is written until the original bytes are
  /// back and serialised (the int3 path then never resumes inside the
  /// window); read by the trap path with __atomic_load_n.
  mutable std::uint8_t jumped = 0;
  /// 1 while a batch writes this site's successor (its int3 is in:
  /// poke_successors()); registry side only.
  mutable std::uint8_t evict_poke = 0;
};

/// Immutable set of sites.
struct SiteSet {
  std::vector<Site> sites;
  const Site* find(std::uint64_t addr) const noexcept {
    for (const Site& s : sites)
      if (s.addr == addr) return &s;
    return nullptr;
  }
  /// The site whose evicted successor is at `addr` (Site::evict_addr), or
  /// nullptr. Async-signal-safe.
  const Site* find_evictor(std::uint64_t addr) const noexcept {
    for (const Site& s : sites)
      if (s.evict_hop && s.evict_addr == addr) return &s;
    return nullptr;
  }
};

/// The name a return instance gives its uprobe: an instance is pending for
/// as long as its function runs, across any number of RCU grace periods, so
/// it cannot hold the Uprobe itself. Handles are allocated by the registry
/// and never freed (reused once the uprobe they named is gone): `up` names
/// the live uprobe, and is cleared before the uprobe's grace period (with
/// the stubs' owners: forget_references()), so a reader inside a read-side
/// critical section that loads it non-null may use it until the section
/// ends. Readers also compare the uprobe's id with the one they recorded
/// (the handle may name a newer uprobe by then).
struct ProbeHandle {
  std::atomic<Uprobe*> up{nullptr};
  ProbeHandle* next_free = nullptr;  ///< registry side (probe_handle_release())
};

/// A handle naming `up` (registry mutex held). Throws std::bad_alloc.
ProbeHandle* probe_handle_acquire(Uprobe* up);
/// Gives a handle back once no reader can load the uprobe it named any more
/// (after its grace period; registry mutex held).
void probe_handle_release(ProbeHandle* h) noexcept;

}  // namespace uprobe::detail

namespace uprobe {

class Uprobe : public boost::intrusive::set_base_hook<> {
 public:
  /// Created and destroyed by the registry (its mutex held): the destructor
  /// runs after the uprobe's grace period. `id` is set before the handle
  /// names this uprobe.
  explicit Uprobe(std::uint64_t unique_id) : id(unique_id), handle(detail::probe_handle_acquire(this)) {}
  ~Uprobe() { detail::probe_handle_release(handle); }
  Uprobe(const Uprobe&) = delete;
  Uprobe& operator=(const Uprobe&) = delete;

  detail::ProbeKey key;
  const std::uint64_t id;  ///< unique for the life of the process (return instances name probes by handle + id)
  /// What return instances hold to find this uprobe again (see ProbeHandle).
  detail::ProbeHandle* const handle;
  /// The offset is the entry of a function the symbol table sizes: an ABI
  /// boundary (SaveMode::entry) rather than any other site (SaveMode::full).
  bool function_entry = false;
  /// glibc runs the site with every signal blocked somewhere
  /// (ProbeInfo::signals_blocked not empty: inside pthread_create(),
  /// posix_spawn()'s child, thread exit, ...), which the thread's tracked
  /// mask (uprobe_fault_state) does not see: its consumers' reads of unsafe
  /// memory are made with a system call, never with a load that may fault
  /// (a fault there kills the process). Immutable after registration.
  bool faults_fatal = false;
  /// How the site is patched (arch::plan()'s tactic): int3 only, or which
  /// optimized jump. Immutable after registration.
  arch::Tactic tactic = arch::Tactic::int3;
  std::uint64_t ref_ctr_offset = 0;  ///< file offset of the USDT semaphore, 0 = none
  std::string path;
  arch::Insn insn;
  /// Where the site's instructions can be displaced (arch::plan()): the
  /// window an optimized jump replaces (len 0 otherwise, with the reason in
  /// window_why). Immutable after registration.
  arch::EntryWindow window;
  std::string window_why;
  /// Why no successor eviction was planned (arch::PatchPlan::why_no_evict).
  std::string evict_why;
  /// Why the sites' last placement of a planned successor eviction failed
  /// (arch::solve_evicted()'s reason; "" when it succeeded, or was not
  /// tried: a punned jump found its own page); registry side.
  std::string evict_failure;
  /// Why the last attempt to optimize failed for a passing reason (a thread
  /// inside the window); registry side.
  std::string opt_failure;
  /// File offset of another probe inside the window (0 = none): then the
  /// window is never displaced (that probe must see its instruction run), and
  /// the int3 path does not run the window slot either. Set by the registry
  /// before that probe's breakpoint is written.
  std::atomic<std::uint64_t> window_blocker{0};
  std::atomic<detail::ConsumerSet*> consumers{nullptr};
  std::atomic<detail::SiteSet*> sites{nullptr};
  /// Serialises breakpoint writes between the registry and the trap path's
  /// Action::remove (which only ever try-locks it). Guards `applied`. The
  /// holder's thread id (current_tid()), 0 when free: a fork child frees
  /// what the threads that did not come along held (patch_locks_after_fork_child()).
  std::atomic<pid_t> patch_lock{0};
  /// Whether the sites carry the breakpoint. Written with patch_lock held;
  /// atomic because the registry also reads it without that lock (e.g.
  /// compute_sites() during a dlopen/dlclose resync) while the trap path's
  /// Action::remove may clear it.
  std::atomic<bool> applied{false};

  friend bool operator<(const Uprobe& a, const Uprobe& b) { return a.key < b.key; }
};

}  // namespace uprobe

namespace uprobe::detail {

struct KeyLess {
  bool operator()(const ProbeKey& k, const Uprobe& u) const { return k < u.key; }
  bool operator()(const Uprobe& u, const ProbeKey& k) const { return u.key < k; }
};

/// The RCU-published lookup structure of the trap path: (key -> uprobe),
/// immutable once published. `entries` is sorted by key; build() adds an
/// open-addressing hash index over it so that a hit costs one or two probes
/// of the index whatever the number of uprobes (a binary search over 100,000
/// entries is ~17 dependent cache misses).
class ProbeTable {
 public:
  std::vector<std::pair<ProbeKey, Uprobe*>> entries;

  /// Builds the hash index over `entries` (writer side, before publishing).
  void build() {
    std::size_t cap = 16;
    while (cap < entries.size() * 2) cap <<= 1;
    index_.assign(cap, kEmpty);
    mask_ = cap - 1;
    for (std::uint32_t i = 0; i < entries.size(); ++i) {
      std::size_t h = hash(entries[i].first) & mask_;
      while (index_[h] != kEmpty) h = (h + 1) & mask_;
      index_[h] = i;
    }
  }

  /// Async-signal-safe, allocation-free.
  Uprobe* find(const ProbeKey& k) const noexcept {
    if (!index_.empty()) {
      for (std::size_t h = hash(k) & mask_;; h = (h + 1) & mask_) {
        const std::uint32_t i = index_[h];
        if (i == kEmpty) return nullptr;
        if (entries[i].first == k) return entries[i].second;
      }
    }
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

 private:
  static constexpr std::uint32_t kEmpty = ~std::uint32_t{0};
  static std::size_t hash(const ProbeKey& k) noexcept {
    std::uint64_t x = k.offset * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(k.ino) * 0xC2B2AE3D27D4EB4Full ^
                      static_cast<std::uint64_t>(k.dev);
    x ^= x >> 29;
    return static_cast<std::size_t>(x * 0xBF58476D1CE4E5B9ull ^ (x >> 32));
  }
  std::vector<std::uint32_t> index_;
  std::size_t mask_ = 0;
};

}  // namespace uprobe::detail
