// SPDX-License-Identifier: MIT
#pragma once
// Writing and restoring probe sites: int3, and the optimized form (a jmp rel32
// into a per-site stub) with the cross-modifying protocol of the kernel's
// text_poke_bp(): int3 at byte 0, serialise every core, write the tail,
// serialise, write byte 0, serialise. Callers hold the uprobe's patch_lock.

#include <span>
#include <string>
#include <vector>

#include "patch.hpp"
#include "probe.hpp"
#include "vma.hpp"

namespace uprobe::detail {

/// Writes int3 at every site. On failure restores what it wrote and throws
/// uprobe::Error(system). Registry side.
void apply_sites(Uprobe* up, const SiteSet& ss);

// restore_sites(up, ss): declared in src/hit/services.hpp (a hit whose
// consumers all said Action::remove calls it, the kernel's unapply_uprobe()),
// defined in sites.cpp.

/// restore_sites() for many probes at once (unregister_uprobes()): the same
/// protocol with one core serialisation per step for the whole batch instead
/// of two per optimized site. Every probe's patch lock held. Registry side.
void restore_sites_batch(std::span<Uprobe* const> ups) noexcept;

/// True when why_not_optimizable() is "" (without building the reason).
/// Registry side.
bool optimizable(const Uprobe* up) noexcept;

/// Why `up` can never be optimized as things are configured ("" when its
/// shape allows it). Registry side.
std::string why_not_optimizable(const Uprobe* up);

/// Why `up` is not optimized: why_not_optimizable(), else the reason the
/// last attempt failed (a thread inside the window), else "". Registry side.
std::string why_not_optimized(const Uprobe* up);

/// Converts the int3 sites of an optimizable uprobe into jumps to stubs.
/// Sites that cannot be converted stay int3. Registry mutex held.
void optimize_sites(Uprobe* up, const SiteSet& ss, const std::vector<Vma>& vmas);

/// optimize_sites() for many probes at once (the batch API), in two steps
/// with the kernel's text_poke_bp_batch() protocol. prepare: before the
/// int3s are written, the stub of every site that may be optimized is
/// reserved and written (everything that allocates happens here, while no
/// probe of the batch can trap yet). finish: after the int3s, one core
/// serialisation, one look at the other threads for all entry windows, all
/// jump tails, one serialisation, all first bytes, one serialisation. Registry
/// mutex held; every probe's patch_lock held through finish.
struct OptBatch {
  struct Item {
    Uprobe* up;
    const Site* site;
    bool entry;
    std::uint64_t stub;
  };
  std::vector<Item> items;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> windows;  // scratch, reserved by prepare
  /// The tails, then the first bytes, as TextBatch runs (reserved by
  /// prepare) where `joinable` allows (never when null).
  TextBatch text;
  TextBatch::Joinable joinable = nullptr;
  const void* join_ctx = nullptr;
};
void prepare_optimize_batch(const std::vector<Uprobe*>& ups, const std::vector<Vma>& vmas, OptBatch& b);
void finish_optimize_batch(OptBatch& b);

/// Turns optimized sites back into int3 sites (jmp -> int3, through the same
/// protocol). Patch lock held.
void deoptimize_sites(Uprobe* up, const SiteSet& ss) noexcept;

/// The code of `c`'s filter() when it is `return true;` and nothing more
/// (Consumer's own, as an optimizing compiler emits it; filter_code()): a
/// hit need not call it. nullptr otherwise. Not hot.
const void* trivial_filter(const Consumer& c) noexcept;

/// Sets cs.entry_save and cs.ret_save for the consumers of `cs` on `up`:
/// SaveMode::none on a side where every consumer whose code runs there (at
/// the entry: a handler, or a filter that is more than `return true;`, the
/// default; at the return: a ret_handler) declared set_vector_state_unused(),
/// else what the site makes live: at a function entry (Uprobe::function_entry) SaveMode::entry, at a
/// return SaveMode::ret, elsewhere SaveMode::full. A ThreadSanitizer build
/// saves everything in the stub's and the trampoline's C entries already
/// (opt_entry.cpp): none here. Call before publishing `cs`. Not hot.
void save_modes(const Uprobe* up, ConsumerSet& cs) noexcept;

/// Clears the references to `up` that outlive it: OptSite::owner in the
/// stubs that name it (an optimized hit then looks the key up) and its
/// ProbeHandle (a pending return instance then finds no uprobe). Called under
/// the registry mutex when `up` leaves the probe tree, before its grace
/// period (hits read both under the RCU read lock). Not hot.
void forget_references(const Uprobe* up);

/// Clears OptSite::owner in the stub of one address (a site `up` drops when
/// its mapping goes away). Not hot.
void forget_stub_owner_at(const Uprobe* up, std::uint64_t addr);

/// True when the site currently jumps to its stub (not merely holds a jmp
/// rel32: a function may start with one). Patch lock held, or registry side.
/// Async-signal-safe.
bool site_is_optimized(const Site& s) noexcept;

/// The stub built for the site address `addr` in this process, 0 if none.
/// Registry mutex held.
std::uint64_t stub_of(std::uint64_t addr);

/// Retires the per-site memory of `s` (stub, hop, window slot, XOL slot:
/// XolArea::retire_site()) of a probe that left the tree and whose bytes at
/// `s.addr` are no jump to them: nothing enters them from here on. Forgets
/// the stub of the address. Registry mutex held.
void retire_site_memory(const Site& s);

/// Reuses the `n` oldest retired blocks once no thread can be inside one
/// (the kernel frees an optimized kprobe's detour buffer after
/// synchronize_rcu_tasks(); user space has no such primitive). Called right
/// after a grace period that began after those blocks were retired. The
/// rule: every other thread observed (threads_outside()) outside the blocks,
/// outside the section of the optimized path's C code run outside a
/// read-side section (UPROBE_OPT_PATH_TEXT) and not handling an int3 hit of a
/// retired site; then one more grace period; then observed so again; and no
/// thread's first read-side section (its liburcu-bp registration) began or
/// was under way meanwhile. A thread inside a block's dynamic extent is
/// either in those ranges (the stub's own code, a hop, a slot, the C entry)
/// or inside a read-side section (its consumers: a thread parked in a
/// consumer blocked in a system call is one); the grace period waits for the
/// latter to leave its section, after which it is in the ranges until it is
/// out, so the second observation sees it. Nothing enters a retired block any
/// more, so nothing can be inside one afterwards. When an observation fails
/// (a thread inside, or one that cannot be observed: see threads_outside())
/// the blocks stay retired, for the next call. Fewer than 64 blocks are
/// tried at most once per 10 ms (a storm of detaches). Registry mutex held. Not seen
/// (as by threads_outside()): a context a signal handler interrupted inside
/// a block or the C entry while the handler runs on.
void reclaim_retired(std::size_t n);

/// Registers for membarrier(SYNC_CORE) once; false when unavailable.
bool init_core_sync();

}  // namespace uprobe::detail
