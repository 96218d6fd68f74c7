// SPDX-License-Identifier: MIT
// The one attach path (attach_txn.hpp): the steps of the kernel's
// uprobe_register()/uprobe_unregister(), install_breakpoint()/
// remove_breakpoint() and uprobe_mmap(), each written once, and the
// transaction that runs them for one request or many.

#include "attach_txn.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <tuple>

#include "arch.hpp"
#include "evict_place.hpp"
#include "format.hpp"
#include "sites.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"
#include "validate.hpp"
#include "xol.hpp"

namespace uprobe::detail {

Error in_handler_error(const std::string& path, std::uint64_t offset) {
  return Error(Errc::in_handler, path, offset,
               "cannot register or unregister from inside a probe handler (it would wait for itself)");
}

PatchLock::PatchLock(Uprobe* up) noexcept : up_(up) { lock(up_); }
PatchLock::~PatchLock() { unlock(up_); }
void PatchLock::lock(Uprobe* up) noexcept {
  while (up->patch_lock.test_and_set(std::memory_order_acquire)) arch::cpu_relax();
}
void PatchLock::unlock(Uprobe* up) noexcept { up->patch_lock.clear(std::memory_order_release); }

namespace {

constexpr std::size_t kNotFresh = ~std::size_t{0};

// ---- The steps (registry mutex held by the transaction).

/// The sites of `up` in the current address space: one per executable
/// mapping of the file that covers the offset. Prepares their XOL slots.
/// @throws uprobe::Error(refused_instruction) when a site cannot be probed.
std::unique_ptr<SiteSet> compute_sites(Uprobe* up, const VmaSnapshot& vmas) {
  auto ss = std::make_unique<SiteSet>();
  // Why the sites that tried successor eviction (this time) did not get it:
  // the first one's reason, "" when every one did (Uprobe::evict_failure).
  bool evict_tried = false;
  std::string evict_failure;
  auto note_evict = [&](std::string why) {
    if (!evict_tried || evict_failure.empty()) evict_failure = std::move(why);
    evict_tried = true;
  };
  for (const Vma& v : vmas.vmas()) {
    if (!v.executable() || v.dev != up->key.dev || v.ino != up->key.ino) continue;
    if (up->key.offset < v.pgoff || up->key.offset >= v.pgoff + (v.end - v.start)) continue;
    Site s;
    s.addr = v.start + (up->key.offset - v.pgoff);
    std::string why;
    if (up->window.len) {
      std::string wwhy;
      s.window_xol = xol_area().window_slot_for(s.addr, up->window, vmas.vmas(), wwhy);
      // A punned jump: B2, else padded with 1, 2, 3 prefixes (T1), each
      // aiming at another range, the first whose hop is placed (from
      // min_pad on; B2 last when min_pad skipped it). A site this probe has
      // already keeps its form: its jump may be in memory (an earlier
      // range's pages may have become free since).
      const arch::EntryWindow& w = up->window;
      if (const SiteSet* old = up->sites.load(std::memory_order_relaxed); w.punned && old)
        if (const Site* o = old->find(s.addr)) {
          s.hop = o->hop;
          s.pad = o->pad;
          s.evict_addr = o->evict_addr;
          s.evict_hop = o->evict_hop;
          s.evict_pad = o->evict_pad;
          s.evict_len = o->evict_len;
        }
      // (SiteTactics::instruction_evicted: eviction first, for the tests.)
      if (w.punned && !s.hop && w.evict.len && w.evict_first) note_evict(place_evicting(s, w, vmas.vmas()));
      for (std::size_t i = 0; w.punned && !s.hop && i <= w.max_pad; ++i) {
        const std::size_t pad = w.min_pad + i <= w.max_pad ? w.min_pad + i : w.min_pad + i - w.max_pad - 1;
        std::uint64_t lo = 0, hi = 0;
        if (!arch::punned_jump_range(s.addr, w, lo, hi, pad)) continue;
        s.hop = xol_area().hop_in(s.addr, lo, hi, arch::kJumpLen, wwhy);
        s.pad = static_cast<std::uint8_t>(pad);
      }
      if (!s.hop) s.pad = 0;
      // No form's pages free: evict the successor (T2).
      if (w.punned && !s.hop && w.evict.len) note_evict(place_evicting(s, w, vmas.vmas()));
    }
    s.xol = xol_area().slot_for(s.addr, up->insn, vmas.vmas(), why);
    s.stub = stub_of(s.addr);
    s.jumped = site_is_optimized(s) ? 1 : 0;
    if (!s.xol && !up->insn.ops->emulate)
      throw Error(Errc::refused_instruction, up->path, up->key.offset,
                  "the instruction `" + up->insn.text + "` cannot run out of line at " + hex(s.addr) + ": " + why);
    std::uint8_t cur;
    if (!peek_text_checked(s.addr, &cur, 1)) continue;  // unmapped since the snapshot (a concurrent dlclose)
    auto matches = [&] {
      const SiteSet* old = up->sites.load(std::memory_order_relaxed);
      const bool ours = up->applied && old && old->find(s.addr);
      return cur == up->insn.bytes[0] || (ours && (cur == arch::kBreakpoint || site_is_optimized(s)));
    };
    if (!matches()) {
      // Again, as one with the probe's own writers: a handler's
      // Action::remove restores the bytes and clears `applied` under the
      // patch lock, without the registry mutex, and may have done so
      // between the read above and the check.
      PatchLock guard(up);
      if (!peek_text_fresh(s.addr, &cur, 1)) continue;
      if (!matches())
        throw Error(Errc::refused_instruction, up->path, up->key.offset,
                    "the byte in memory at " + hex(s.addr) + " is " + hex(cur) + ", not the file's " +
                        hex(up->insn.bytes[0]) + (cur == arch::kBreakpoint ? " (another breakpoint is there)" : ""));
    }
    ss->sites.push_back(s);
  }
  if (evict_tried) up->evict_failure = std::move(evict_failure);
  return ss;
}

/// Brings the sites of `up` in line with the address space: new mappings get
/// the breakpoint (when applied), vanished ones are dropped without a write.
/// @throws uprobe::Error(refused_instruction) as compute_sites().
void sync_sites(Registry& r, Uprobe* up, const VmaSnapshot& vmas) {
  std::unique_ptr<SiteSet> fresh = compute_sites(up, vmas);
  PatchLock guard(up);
  const SiteSet* old = up->sites.load(std::memory_order_relaxed);
  if (up->applied) {
    SiteSet added;
    for (const Site& s : fresh->sites) {
      if (!old || !old->find(s.addr)) {
        added.sites.push_back(s);
        continue;
      }
      // A site we wrote before, at the same address, may be a new mapping:
      // a dlclose() and a dlopen() on other threads between two resyncs can
      // unmap the file and map it again at the same place, a layout no
      // snapshot tells apart. Applied, its byte is int3 or an optimized jump;
      // the original byte there means the breakpoint is gone: write it again.
      std::uint8_t cur;
      if (peek_text_checked(s.addr, &cur, 1) && cur == up->insn.bytes[0] && cur != arch::kBreakpoint &&
          !site_is_optimized(s))
        added.sites.push_back(s);
    }
    apply_sites(up, added);
  }
  if (old)
    for (const Site& s : old->sites)
      if (!fresh->find(s.addr)) forget_stub_owner_at(up, s.addr);  // its stub must not outlive `up` naming it
  up->sites.store(fresh.release(), std::memory_order_release);
  if (old) r.deferred.emplace_back([old] { delete old; });
}

/// The addresses of the USDT semaphore of `up` in the current address space:
/// private writable mappings of the file (the kernel's valid_ref_ctr_vma()).
std::vector<std::uint64_t> ref_ctr_addresses(const Uprobe* up, const VmaSnapshot& vmas) {
  std::vector<std::uint64_t> out;
  if (!up->ref_ctr_offset) return out;
  for (const Vma& v : vmas.vmas()) {
    if (v.dev != up->key.dev || v.ino != up->key.ino || !(v.prot & 2) || v.shared) continue;
    if (up->ref_ctr_offset < v.pgoff || up->ref_ctr_offset + 2 > v.pgoff + (v.end - v.start)) continue;
    out.push_back(v.start + (up->ref_ctr_offset - v.pgoff));
  }
  return out;
}

/// Brings one registration's semaphore increments in line with the mappings
/// (the kernel's update_ref_ctr()): +1 where the file's semaphore is mapped
/// and not yet counted; forgets addresses that are no longer mapped (nothing
/// to decrement there).
void sync_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas) {
  if (!up->ref_ctr_offset) return;
  std::vector<std::uint64_t> now = ref_ctr_addresses(up, vmas), kept;
  for (std::uint64_t a : reg->ref_ctr_addrs)
    if (std::find(now.begin(), now.end(), a) != now.end()) kept.push_back(a);
  for (std::uint64_t a : now)
    if (std::find(kept.begin(), kept.end(), a) == kept.end()) {
      __atomic_fetch_add(reinterpret_cast<std::uint16_t*>(a), 1, __ATOMIC_RELAXED);
      kept.push_back(a);
    }
  reg->ref_ctr_addrs = std::move(kept);
}

/// Undoes a registration's increments where the semaphore is still mapped;
/// never below 0.
void release_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas) {
  std::vector<std::uint64_t> now = ref_ctr_addresses(up, vmas);
  for (std::uint64_t a : reg->ref_ctr_addrs) {
    if (std::find(now.begin(), now.end(), a) == now.end()) continue;
    auto* p = reinterpret_cast<std::uint16_t*>(a);
    std::uint16_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > 0 && !__atomic_compare_exchange_n(p, &v, static_cast<std::uint16_t>(v - 1), true, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
    }
  }
  reg->ref_ctr_addrs.clear();
}

/// Retires the per-site memory of `up`, which left the tree (published
/// without it) and whose sites hold the file's bytes again: reused once no
/// thread can be inside (reclaim_retired(), after the transaction's grace
/// period). Per-site memory belongs to a site address, not to a probe: a
/// site of `up` in a mapping that is no longer the file's (a stale one, when
/// another file is mapped there now) may share it with a live probe, and
/// keeps it.
void retire_sites(const Uprobe* up, const VmaSnapshot& vmas) {
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  if (!ss) return;
  for (const Site& s : ss->sites) {
    const Vma* v = vmas.find(s.addr);
    if (!v || !v->executable() || v->dev != up->key.dev || v->ino != up->key.ino ||
        v->pgoff + (s.addr - v->start) != up->key.offset)
      continue;
    retire_site_memory(s);
  }
}

/// Adds `up` to the registry's tree, keys (appended: sorted at the next
/// publish, once for a whole batch) and evicting list.
void insert_probe(Registry& r, Uprobe* up) {
  r.tree.insert(*up);
  if (!r.keys.empty() && !(r.keys.back().first < up->key)) r.keys_sorted = false;
  r.keys.emplace_back(up->key, up);
  if (up->window.evict.len) r.evicting.push_back(up);
}

/// Removes `ups` (each in the tree) from the registry's tree, keys and
/// evicting list: one compaction of each array for the whole batch.
void erase_probes(Registry& r, const std::vector<Uprobe*>& ups) {
  if (ups.empty()) return;
  for (Uprobe* up : ups) r.tree.erase(r.tree.iterator_to(*up));
  std::vector<Uprobe*> gone(ups);
  std::sort(gone.begin(), gone.end());
  const auto is_gone = [&](Uprobe* u) { return std::binary_search(gone.begin(), gone.end(), u); };
  r.keys.erase(std::remove_if(r.keys.begin(), r.keys.end(), [&](const auto& e) { return is_gone(e.second); }),
               r.keys.end());
  r.evicting.erase(std::remove_if(r.evicting.begin(), r.evicting.end(), is_gone), r.evicting.end());
}

/// Publishes a new probe table built from the registry's keys.
void publish_probes(Registry& r) {
  if (!r.keys_sorted) {
    std::sort(r.keys.begin(), r.keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    r.keys_sorted = true;
  }
  auto table = std::make_unique<ProbeTable>();
  table->entries.reserve(r.keys.size() + r.evicting.size());
  table->entries.assign(r.keys.begin(), r.keys.end());
  // The successor a site may evict (T2) names that site's probe, so that a
  // thread hitting the int3 written there while the successor's jump is
  // written or undone is sent to its trampoline (on_sigtrap()). Never over
  // a probe of its own there (which blocks the eviction: jump_extent()).
  bool alias = false;
  for (Uprobe* u : r.evicting) {
    const ProbeKey k{u->key.dev, u->key.ino, u->key.offset + u->window.len};
    if (r.tree.find(k, KeyLess()) != r.tree.end()) continue;
    table->entries.emplace_back(k, u);
    alias = true;
  }
  if (alias)
    std::sort(table->entries.begin(), table->entries.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
  table->build();
  publish(r, nullptr, table.release());
}

/// The first probe (or `extra`) at key.offset + [1, len) in the file of
/// `k`, as an offset; 0 when none.
std::uint64_t probe_within(Registry& r, const ProbeKey& k, std::size_t len, const ProbeKey* extra) {
  const std::uint64_t end = k.offset + len;
  if (extra && extra->dev == k.dev && extra->ino == k.ino && extra->offset > k.offset && extra->offset < end)
    return extra->offset;
  for (auto it = r.tree.upper_bound(k, KeyLess()); it != r.tree.end(); ++it) {
    if (it->key.dev != k.dev || it->key.ino != k.ino || it->key.offset >= end) break;
    return it->key.offset;
  }
  return 0;
}

/// The offset of a probe of the same file strictly inside the window of
/// `up` (`extra` counts as one when given), or 0.
std::uint64_t probe_inside_window(Registry& r, const Uprobe* up, const ProbeKey* extra) {
  const ProbeKey& k = up->key;
  // A punned jump keeps the bytes after its window: a probe there would
  // change its target (padded, it covers more of them; evicting its
  // successor, the successor's jump and what that keeps).
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  const bool evicts = ss && std::any_of(ss->sites.begin(), ss->sites.end(), [](const Site& s) { return s.evict_hop; });
  return probe_within(r, k, evicts ? arch::jump_extent(up->window) : arch::own_jump_extent(up->window), extra);
}

/// Re-evaluates the window of every entry probe of the file of `k` whose
/// window may cover k.offset: blocked ones go back to int3 (before a probe
/// inside them gets its breakpoint), unblocked ones are optimized again
/// (when `vmas` is given).
void refresh_windows_around(Registry& r, const ProbeKey& k, const ProbeKey* extra, const VmaSnapshot* vmas) {
  const std::uint64_t lo = k.offset > arch::kMaxWindowLen ? k.offset - arch::kMaxWindowLen : 0;
  for (auto it = r.tree.lower_bound(ProbeKey{k.dev, k.ino, lo}, KeyLess()); it != r.tree.end(); ++it) {
    Uprobe& u = *it;
    if (u.key.dev != k.dev || u.key.ino != k.ino || u.key.offset >= k.offset) break;
    if (!u.window.len) continue;
    const std::uint64_t inner = probe_inside_window(r, &u, extra);
    u.window_blocker.store(inner, std::memory_order_release);
    PatchLock guard(&u);
    if (!u.applied) continue;
    const SiteSet& ss = *u.sites.load(std::memory_order_relaxed);
    if (inner)
      deoptimize_sites(&u, ss);
    else if (vmas)
      optimize_sites(&u, ss, vmas->vmas());
  }
}

/// Ids of probes and registrations: unique for the life of the process
/// (registry mutex held).
std::uint64_t next_id() {
  static std::uint64_t id = 0;
  return ++id;
}

std::unique_ptr<Registration> make_registration(Consumer& c) {
  auto reg = std::make_unique<Registration>();
  reg->consumer = &c;
  reg->id = next_id();
  reg->has_entry = static_cast<unsigned>(c.callbacks()) & static_cast<unsigned>(Callbacks::entry);
  reg->has_ret = static_cast<unsigned>(c.callbacks()) & static_cast<unsigned>(Callbacks::ret);
  reg->trivial_filter = trivial_filter(c);
  return reg;
}

/// The refusals of one more consumer on an existing probe (errors name the
/// request's path and offset).
void check_can_add(const Uprobe* up, const ConsumerSet& cs, const Registration& reg, std::uint64_t ref_ctr_offset,
                   const std::string& path, std::uint64_t offset) {
  for (const Registration* x : cs.regs)
    if (x->consumer == reg.consumer)
      throw Error(Errc::conflict, path, offset, "this consumer is already registered on this probe");
  if (reg.has_ret) {
    unsigned rets = 0;
    for (const Registration* x : cs.regs) rets += x->has_ret;
    if (rets >= kMaxReturnConsumers)
      throw Error(Errc::too_many_return_consumers, path, offset,
                  "this probe already has " + std::to_string(rets) +
                      " consumers with a ret_handler, the most one return instance records");
  }
  if (up->ref_ctr_offset != ref_ctr_offset)
    throw Error(Errc::ref_ctr_conflict, path, offset,
                "the probe's USDT semaphore (ref_ctr_offset) is " + hex(up->ref_ctr_offset) + ", not " +
                    hex(ref_ctr_offset));
}

/// The executable file mappings of a snapshot by (dev, ino), to tell without
/// allocating whether a probe's sites still match the address space.
class ExecIndex {
 public:
  explicit ExecIndex(const VmaSnapshot& s) {
    for (const Vma& v : s.vmas())
      if (v.executable() && v.ino != 0) exec_.push_back(&v);
    std::sort(exec_.begin(), exec_.end(), [](const Vma* a, const Vma* b) {
      return std::tie(a->dev, a->ino, a->start) < std::tie(b->dev, b->ino, b->start);
    });
  }
  /// True when the sites of `up` are exactly where compute_sites() would put
  /// them in this snapshot (one per executable mapping of the file that
  /// covers the offset).
  bool sites_current(const Uprobe* up) const noexcept {
    const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
    auto lo = std::lower_bound(exec_.begin(), exec_.end(), up, [](const Vma* v, const Uprobe* u) {
      return std::tie(v->dev, v->ino) < std::tie(u->key.dev, u->key.ino);
    });
    std::size_t n = 0;
    for (auto it = lo; it != exec_.end() && (*it)->dev == up->key.dev && (*it)->ino == up->key.ino; ++it) {
      const Vma& v = **it;
      if (up->key.offset < v.pgoff || up->key.offset >= v.pgoff + (v.end - v.start)) continue;
      if (!ss || !ss->find(v.start + (up->key.offset - v.pgoff))) return false;
      ++n;
    }
    return n == (ss ? ss->sites.size() : 0);
  }

 private:
  std::vector<const Vma*> exec_;
};

/// What the removals of a transaction free after its grace period.
struct Garbage {
  std::vector<Registration*> regs;
  std::vector<const ConsumerSet*> sets;
  std::vector<Uprobe*> probes;  // erased from the tree; their last consumer set is in `sets`
  void free() {
    for (Registration* x : regs) delete x;
    for (const ConsumerSet* x : sets) delete x;
    for (Uprobe* up : probes) {
      delete up->sites.load();
      delete up;
    }
  }
};

/// What TextBatch::write() asks (TextBatch::Joinable): whether the text
/// [lo, hi) of one page holds no site of a probe outside `mine` (sorted),
/// whose patch locks the transaction holds. Any probe of the file within
/// kReach bytes before lo counts (a site's writes, its jump and pads, reach
/// less far past it).
struct JoinScope {
  const Registry* r;
  const VmaSnapshot* vmas;
  std::span<Uprobe* const> mine;
};

bool only_mine(std::uint64_t lo, std::uint64_t hi, const void* p) noexcept {
  constexpr std::uint64_t kReach = 32;
  static_assert(kReach > arch::kMaxJumpLen && kReach > arch::kMaxWindowLen);
  const auto& c = *static_cast<const JoinScope*>(p);
  const Vma* v = c.vmas->find(lo);
  if (!v || hi > v->end) return false;
  const std::uint64_t off = v->pgoff + (lo - v->start), off_end = off + (hi - lo);
  for (auto it = c.r->tree.lower_bound(ProbeKey{v->dev, v->ino, off > kReach ? off - kReach : 0}, KeyLess());
       it != c.r->tree.end(); ++it) {
    if (it->key.dev != v->dev || it->key.ino != v->ino || it->key.offset >= off_end) break;
    if (!std::binary_search(c.mine.begin(), c.mine.end(), &*it, std::less<const Uprobe*>())) return false;
  }
  return true;
}

}  // namespace

bool probe_registered(Registry& r, const Uprobe* up) {
  auto it = r.tree.find(up->key, KeyLess());
  return it != r.tree.end() && &*it == up;
}

/// The files of one transaction, each opened once.
class Transaction::Files {
 public:
  explicit Files(bool windowed) : windowed_(windowed) {}
  /// The opened target for (path, offset); throws what open_target() does
  /// (file_not_found, not_executable, bad_offset).
  const Target& open(const std::string& path, std::uint64_t offset) {
    auto [it, fresh] = files_.try_emplace(path);
    if (fresh) {
      auto t = std::make_unique<Target>();
      try {
        open_target(path, 0, *t);
        t->batch = windowed_;
        it->second = std::move(t);
      } catch (const Error&) {
        // Left null: each request on this path gets its own exact error below.
      }
    }
    if (!it->second) {
      auto t = std::make_unique<Target>();
      open_target(path, offset, *t);  // throws the request's error
      it->second = std::move(t);
    }
    const Target& t = *it->second;
    if (offset >= static_cast<std::uint64_t>(t.st.st_size))
      throw Error(Errc::bad_offset, path, offset,
                  "offset is past the end of the file (size " + std::to_string(t.st.st_size) + " bytes)");
    return t;
  }

 private:
  bool windowed_;
  std::unordered_map<std::string, std::unique_ptr<Target>> files_;
};

Transaction::Transaction(std::size_t expected) : Transaction(expected, HeldLock{}) {
  // This thread holds it already only inside its own fork(): a program's
  // pthread_atfork handler run after libuprobe's prepare handler took the
  // registry (runtime.cpp before_fork()). Waiting would be forever.
  if (r_.mutex.held_by_this_thread())
    throw Error(Errc::in_handler, "", 0,
                "cannot register or unregister while this thread's fork() holds libuprobe's registry (from a "
                "pthread_atfork handler?): it would wait for itself");
  lock_ = std::unique_lock<ForkHeldMutex>(r_.mutex);
}

Transaction::Transaction(std::size_t expected, HeldLock)
    : r_(detail::registry()),
      expected_(expected),
      arena_(std::max<std::size_t>(expected * 96, 64)),
      fresh_(&arena_),
      fresh_index_(&arena_) {
  adds_.reserve(expected);
  fresh_of_.reserve(expected);
  removes_.reserve(expected);
  fresh_.reserve(expected);
  fresh_index_.reserve(expected);
}

Transaction::~Transaction() {
  if (xol_batch_) xol_area().end_batch();
}

const VmaSnapshot& Transaction::snapshot() {
  if (!vmas_) vmas_ = refresh_vmas(r_);  // the one read of the address space
  return *vmas_;
}

void Transaction::writing() {
  // One /proc/self/mem descriptor for every text write, one RW alias per XOL
  // region for every slot and stub; with many requests, reads of the text
  // one system call per page (the copy stays equal to memory across this
  // thread's writes, and any other thread's text write makes it read the
  // page again).
  if (!poke_) poke_.emplace();
  if (!xol_batch_) {
    xol_area().begin_batch(expected_ > 1);
    xol_batch_ = true;
  }
  if (expected_ > 1 && !peeks_) peeks_.emplace();
}

void Transaction::begin_attach() {
  start_runtime(r_);
  snapshot();
  if (!files_) files_ = std::make_unique<Files>(expected_ > 1);
}

std::size_t Transaction::add(const ProbeRequest& q) {
  const std::size_t ticket = adds_.size();
  adds_.emplace_back();
  fresh_of_.push_back(kNotFresh);
  std::string path = q.path;
  std::uint64_t offset = q.offset;
  try {
    adds_[ticket].probe = add_checked(q, ticket, path, offset);
  } catch (...) {
    Added& a = adds_[ticket];
    a.error = std::current_exception();
    a.path = std::move(path);
    a.offset = offset;
  }
  return ticket;
}

Uprobe* Transaction::add_checked(const ProbeRequest& q, std::size_t ticket, std::string& path,
                                 std::uint64_t& offset) {
  const VmaSnapshot& vmas = snapshot();
  if (q.address) {
    const auto a = reinterpret_cast<std::uint64_t>(q.address);
    std::optional<FileOffset> known = file_offset_if_unchanged(vmas, a);
    FileOffset fo = known ? std::move(*known) : file_offset_of(VmaSnapshot(read_proc_maps()), a);
    path = std::move(fo.path);
    offset = fo.offset;
  }
  if (!q.consumer) throw Error(Errc::invalid_argument, path, offset, "the request names no consumer");
  const Target& t = files_->open(path, offset);
  check_not_forbidden(t, offset, &vmas);
  if (q.consumer->callbacks() != Callbacks::entry) check_function_entry(t, offset);
  const ProbeKey key{t.st.st_dev, t.st.st_ino, offset};
  std::unique_ptr<Registration> reg = make_registration(*q.consumer);
  if (reg->has_ret && !ri_reserved_) {
    uretprobe_reserve();  // return instances for the threads running now: never allocated by a hit
    ri_reserved_ = true;
  }

  auto it = r_.tree.find(key, KeyLess());
  if (it != r_.tree.end()) {
    Uprobe* up = &*it;
    ConsumerSet* cs = up->consumers.load(std::memory_order_relaxed);
    check_can_add(up, *cs, *reg, q.ref_ctr_offset, path, offset);
    if (auto f = fresh_index_.find(up); f != fresh_index_.end()) {
      cs->regs.push_back(reg.release());  // not published yet: edited in place
      fresh_of_[ticket] = f->second;
    } else {
      writing();
      add_to_published(up, std::move(reg));
    }
    return up;
  }

  // An optimized entry whose window covers this offset goes back to int3
  // first: its jump overwrote the bytes this probe needs.
  refresh_windows_around(r_, key, &key, nullptr);
  writing();
  auto up = std::make_unique<Uprobe>(next_id());
  up->key = key;
  up->ref_ctr_offset = q.ref_ctr_offset;
  up->path = path;
  try {
    arch::PatchPlan plan;
    analyze_target(t, offset, up->insn, &plan, &up->function_entry);
    up->faults_fatal = !signals_blocked_windows(key.dev, key.ino, key.offset, &snapshot()).empty();
    up->tactic = plan.tactic;
    up->window = std::move(plan.window);
    up->window_why = std::move(plan.why_no_window);
    up->evict_why = std::move(plan.why_no_evict);
    if (up->window.evict.len) {
      // A probe in the bytes the successor's jump would change or keep (past
      // the site's own jump's): no eviction for this probe (a probe
      // arriving there later blocks it while it evicts: probe_inside_window()).
      if (const std::uint64_t in = probe_within(r_, key, arch::jump_extent(up->window), nullptr);
          in && in >= key.offset + arch::own_jump_extent(up->window)) {
        up->window.evict = arch::Insn{};
        up->window.evict_max_pad = 0;
        up->evict_why = "a probe at +" + std::to_string(in - key.offset) + " is inside the successor's jump";
      }
    }
    up->window_blocker.store(probe_inside_window(r_, up.get(), nullptr), std::memory_order_relaxed);
    up->sites.store(compute_sites(up.get(), vmas).release(), std::memory_order_relaxed);
  } catch (...) {
    refresh_windows_around(r_, key, nullptr, &vmas);
    throw;
  }
  auto cs = std::make_unique<ConsumerSet>();
  cs->regs.push_back(reg.release());
  up->consumers.store(cs.release(), std::memory_order_relaxed);
  Uprobe* raw = up.release();
  insert_probe(r_, raw);
  fresh_of_[ticket] = fresh_.size();
  fresh_index_.emplace(raw, fresh_.size());
  fresh_.push_back(Fresh{raw, optimizable(raw)});
  return raw;
}

void Transaction::add_to_published(Uprobe* up, std::unique_ptr<Registration> reg) {
  const VmaSnapshot& vmas = snapshot();
  sync_sites(r_, up, vmas);
  const ConsumerSet* old = up->consumers.load(std::memory_order_relaxed);
  auto cs = std::make_unique<ConsumerSet>(*old);
  Registration* raw = reg.release();
  cs->regs.push_back(raw);
  save_modes(up, *cs);
  ConsumerSet* added = cs.release();
  up->consumers.store(added, std::memory_order_release);
  try {
    PatchLock guard(up);
    const SiteSet& ss = *up->sites.load(std::memory_order_relaxed);
    if (!up->applied) {
      apply_sites(up, ss);  // restores what it wrote before it throws
      up->applied = true;
    }
    optimize_sites(up, ss, vmas.vmas());
  } catch (...) {
    up->consumers.store(const_cast<ConsumerSet*>(old), std::memory_order_release);
    r_.deferred.emplace_back([added, raw] {
      delete added;
      delete raw;
    });
    throw;
  }
  sync_ref_ctr(up, raw, vmas);
  r_.deferred.emplace_back([old] { delete old; });
}

std::size_t Transaction::remove(const ProbeConsumer& pc) {
  removes_.push_back(Removal{pc, nullptr});
  return removes_.size() - 1;
}

void Transaction::commit() {
  commit_adds();
  commit_removals();
  if (must_sync_ || r_.deferred.size() > reclaim_over_) synchronize_and_reclaim(r_);
}

void Transaction::commit_adds() {
  if (fresh_.empty()) return;
  const VmaSnapshot& vmas = snapshot();

  // 1. One publication: from here on a hit at any new site finds its probe
  //    (with its consumer set complete: what it saves is known now).
  for (const Fresh& f : fresh_) save_modes(f.up, *f.up->consumers.load(std::memory_order_relaxed));
  publish_probes(r_);

  // 2. The breakpoints of the new probes; then their optimized jumps, all
  //    with one protocol run (prepare/finish_optimize_batch()); then the USDT
  //    semaphores. Each probe's patch_lock is held from its int3 until its
  //    jump is in (the trap path's Action::remove only try-locks it).
  std::pmr::vector<ProbeKey> dropped_keys(&arena_);
  dropped_keys.reserve(fresh_.size());
  std::vector<Uprobe*> applied, to_optimize;
  applied.reserve(fresh_.size());
  to_optimize.reserve(fresh_.size());
  for (const Fresh& f : fresh_)
    if (f.optimizable) to_optimize.push_back(f.up);
  OptBatch opt;
  try {
    prepare_optimize_batch(to_optimize, vmas.vmas(), opt);  // stubs, before any int3: it allocates
  } catch (const std::exception&) {
    opt.items.clear();  // out of memory: int3 probes only
  }
  // Every breakpoint, in runs per page of text (TextBatch), each probe's
  // patch lock taken first; a probe with a write that failed goes through
  // apply_sites() on its own (below).
  std::vector<Uprobe*> mine;
  TextBatch breakpoints;
  std::vector<std::uint8_t> failed;
  bool batched = true;
  try {
    mine.reserve(fresh_.size());
    std::size_t sites = 0;
    for (const Fresh& f : fresh_) {
      mine.push_back(f.up);
      sites += f.up->sites.load(std::memory_order_relaxed)->sites.size();
    }
    std::sort(mine.begin(), mine.end(), std::less<const Uprobe*>());
    breakpoints.reserve(sites);
    failed.assign(fresh_.size(), 0);
  } catch (const std::bad_alloc&) {
    batched = false;  // (each probe on its own)
  }
  const JoinScope scope{&r_, &vmas, mine};
  opt.joinable = batched ? only_mine : nullptr;
  opt.join_ctx = &scope;
  for (const Fresh& f : fresh_) PatchLock::lock(f.up);
  if (batched) {
    const std::uint8_t bp = arch::kBreakpoint;
    for (std::size_t k = 0; k < fresh_.size(); ++k)
      for (const Site& s : fresh_[k].up->sites.load(std::memory_order_relaxed)->sites)
        breakpoints.add(s.addr, &bp, arch::kBreakpointLen, static_cast<std::uint32_t>(k));
    if (!breakpoints.write(only_mine, &scope))
      for (const TextBatch::Write& w : breakpoints.writes()) failed[w.owner] |= w.err != 0;
  }
  for (std::size_t k = 0; k < fresh_.size(); ++k) {
    Uprobe* up = fresh_[k].up;
    try {
      if (!batched || failed[k]) {
        // As on its own: what was written put back, then apply_sites(), which
        // skips a site unmapped since the snapshot and on any other failure
        // restores what it wrote and throws.
        for (const TextBatch::Write& w : breakpoints.writes())
          if (w.owner == k && w.err == 0) poke_text(w.addr, up->insn.bytes, arch::kBreakpointLen);
        apply_sites(up, *up->sites.load(std::memory_order_relaxed));
      }
      up->applied = true;
      applied.push_back(up);
      continue;
    } catch (...) {
      PatchLock::unlock(up);
      const std::exception_ptr err = std::current_exception();
      for (std::size_t i = 0; i < adds_.size(); ++i) {
        if (fresh_of_[i] != k) continue;
        adds_[i].probe = nullptr;
        adds_[i].error = err;
        adds_[i].path = up->path;
        adds_[i].offset = up->key.offset;
      }
      forget_references(up);
      erase_probes(r_, {up});
      dropped_keys.push_back(up->key);
      r_.deferred.emplace_back([up] {
        for (Registration* reg : up->consumers.load()->regs) delete reg;
        delete up->consumers.load();
        delete up->sites.load();
        delete up;
      });
    }
  }
  // Items of probes dropped above fail finish's int3 check (their bytes are
  // the original ones again) and are skipped.
  try {
    finish_optimize_batch(opt);
  } catch (const std::exception&) {
    // Out of memory: the probes stay int3 probes, which work as well.
  }
  for (Uprobe* up : applied) {
    PatchLock::unlock(up);
    for (Registration* reg : up->consumers.load(std::memory_order_relaxed)->regs) sync_ref_ctr(up, reg, vmas);
  }
  if (!dropped_keys.empty()) {
    publish_probes(r_);
    for (const Fresh& f : fresh_)
      if (!f.up->applied) retire_sites(f.up, vmas);  // (dropped: erased above, its bytes restored)
    for (const ProbeKey& k : dropped_keys) refresh_windows_around(r_, k, nullptr, &vmas);
    must_sync_ = true;
  }
}

void Transaction::commit_removals() {
  const std::size_t n = removes_.size();
  if (n == 0) return;
  const VmaSnapshot* vmas = nullptr;
  try {
    vmas = &snapshot();
  } catch (...) {
    for (Removal& x : removes_) x.error = std::current_exception();
    return;
  }
  // The pairs grouped by probe, in request order within a probe (so the
  // first of two identical pairs is the one that succeeds). Everything this
  // needs is allocated up front: the probed functions may include malloc().
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::less<const Uprobe*>()(removes_[a].pc.probe, removes_[b].pc.probe);
  });
  Garbage garbage;
  garbage.regs.reserve(n);
  garbage.sets.reserve(n);
  garbage.probes.reserve(n);
  std::vector<Registration*> remaining;
  remaining.reserve(16);
  const ExecIndex exec(*vmas);
  writing();

  for (std::size_t g = 0; g < n;) {
    Uprobe* up = removes_[order[g]].pc.probe;
    std::size_t end = g;
    while (end < n && removes_[order[end]].pc.probe == up) ++end;
    if (!up || !probe_registered(r_, up)) {
      for (std::size_t k = g; k < end; ++k)
        removes_[order[k]].error = std::make_exception_ptr(Error(Errc::conflict, "", 0, "not a registered probe"));
      g = end;
      continue;
    }
    const ConsumerSet* old = up->consumers.load(std::memory_order_relaxed);
    remaining.assign(old->regs.begin(), old->regs.end());
    const std::size_t gone_from = garbage.regs.size();
    for (std::size_t k = g; k < end; ++k) {
      auto it = std::find_if(remaining.begin(), remaining.end(),
                             [&](const Registration* x) { return x->consumer == removes_[order[k]].pc.consumer; });
      if (it == remaining.end()) {
        removes_[order[k]].error = std::make_exception_ptr(
            Error(Errc::conflict, up->path, up->key.offset, "this consumer is not registered on this probe"));
        continue;
      }
      garbage.regs.push_back(*it);
      remaining.erase(it);
    }
    g = end;
    if (garbage.regs.size() == gone_from) continue;
    // Never write into a mapping that is gone: drop vanished sites first
    // (only when the mappings of the file changed since they were computed).
    if (!exec.sites_current(up)) {
      try {
        sync_sites(r_, up, *vmas);
      } catch (const Error&) {
        // A mapping changed under the probe in a way we refuse to write
        // to; keep the old sites and restore what we can.
      }
    }
    for (std::size_t k = gone_from; k < garbage.regs.size(); ++k) release_ref_ctr(up, garbage.regs[k], *vmas);
    garbage.sets.push_back(old);
    if (remaining.empty()) {
      // The last consumers: no new consumer set. Until the breakpoints are
      // gone (below) a hit still finds the old one, as a hit that trapped
      // before the removal may; none runs after the grace period. Their text
      // is restored below, all together (restore_sites_batch()), each under
      // its patch lock from here on.
      PatchLock::lock(up);
      garbage.probes.push_back(up);
    } else {
      auto* cs = new ConsumerSet{remaining};
      save_modes(up, *cs);
      up->consumers.store(cs, std::memory_order_release);
    }
  }
  restore_sites_batch(garbage.probes);
  for (Uprobe* up : garbage.probes) {
    up->applied = false;
    PatchLock::unlock(up);
  }
  for (Uprobe* up : garbage.probes) forget_references(up);
  erase_probes(r_, garbage.probes);
  if (!garbage.probes.empty()) {
    publish_probes(r_);
    for (const Uprobe* up : garbage.probes) retire_sites(up, *vmas);
    // Entry probes whose window held one of the probes gone may be optimized now.
    for (const Uprobe* up : garbage.probes) refresh_windows_around(r_, up->key, nullptr, vmas);
  }
  if (garbage.regs.empty()) return;
  r_.deferred.emplace_back([g = std::make_shared<Garbage>(std::move(garbage))] { g->free(); });
  must_sync_ = true;  // the one grace period
}

void Transaction::resync() {
  reclaim_over_ = 64;
  const VmaSnapshot& vmas = snapshot();
  if (!r_.tree.empty()) writing();
  for (Uprobe& u : r_.tree) {
    try {
      sync_sites(r_, &u, vmas);
      PatchLock guard(&u);
      optimize_sites(&u, *u.sites.load(std::memory_order_relaxed), vmas.vmas());
    } catch (const Error&) {
      // A new mapping we refuse to write to (its bytes differ from the
      // file): it stays unprobed.
    }
    for (Registration* reg : u.consumers.load(std::memory_order_relaxed)->regs) sync_ref_ctr(&u, reg, vmas);
  }
}

void Transaction::reoptimize() {
  const VmaSnapshot* vmas = g_hot.vmas.load(std::memory_order_acquire);
  // Probes whose every site holds our int3 are converted together, as a
  // transaction's new probes are (one protocol run, one serialisation per
  // step); the others (partly optimized, or to undo) one by one.
  std::vector<Uprobe*> together;
  PeekCache peeks;  // a read at every site: one system call per page (kept equal to memory across our writes)
  if (!r_.tree.empty()) writing();
  for (Uprobe& u : r_.tree) {
    PatchLock guard(&u);
    if (!u.applied) continue;
    const SiteSet& ss = *u.sites.load(std::memory_order_relaxed);
    if (!why_not_optimizable(&u).empty()) {
      deoptimize_sites(&u, ss);
      continue;
    }
    if (!vmas) continue;
    bool all_int3 = !ss.sites.empty();
    for (const Site& s : ss.sites) {
      std::uint8_t cur;
      if (!peek_text_checked(s.addr, &cur, 1) || cur != arch::kBreakpoint || site_is_optimized(s)) all_int3 = false;
    }
    if (!all_int3) {
      optimize_sites(&u, ss, vmas->vmas());
      continue;
    }
    try {
      together.push_back(&u);
    } catch (const std::bad_alloc&) {
      optimize_sites(&u, ss, vmas->vmas());
    }
  }
  if (together.empty()) return;
  for (Uprobe* up : together) PatchLock::lock(up);
  try {
    OptBatch b;
    prepare_optimize_batch(together, vmas->vmas(), b);
    finish_optimize_batch(b);
  } catch (const std::exception&) {
    // Out of memory: the rest stay int3 probes, which work as well.
  }
  for (Uprobe* up : together) PatchLock::unlock(up);
}

}  // namespace uprobe::detail
