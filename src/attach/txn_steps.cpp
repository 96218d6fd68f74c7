// SPDX-License-Identifier: MIT
// The steps of the one attach path (txn_steps.hpp): the kernel's
// uprobe_register()/uprobe_unregister(), install_breakpoint()/
// remove_breakpoint() and uprobe_mmap() parts, each written once, that the
// transaction (attach_txn.cpp) runs for one request or many.

#include "txn_steps.hpp"

#include <algorithm>
#include <memory>

#include "arch.hpp"
#include "attach_txn.hpp"
#include "evict_place.hpp"
#include "fork_fresh.hpp"
#include "format.hpp"
#include "sites.hpp"
#include "uretprobe.hpp"
#include "xol.hpp"
#include "sanitize.hpp"

namespace uprobe::detail {

namespace {

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

}  // namespace

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
      // A breakpoint that is not ours may be the kernel's (a system-wide
      // uprobe on this file): the page's copy leaves it out (text_pages.hpp).
      if (!matches() && cur == arch::kBreakpoint && detach_text(s.addr, 1) && !peek_text_fresh(s.addr, &cur, 1))
        continue;
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

void insert_probe(Registry& r, Uprobe* up) {
  r.tree.insert(*up);
  if (!r.keys.empty() && !(r.keys.back().first < up->key)) r.keys_sorted = false;
  r.keys.emplace_back(up->key, up);
  if (up->window.evict.len) r.evicting.push_back(up);
}

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

std::uint64_t probe_inside_window(Registry& r, const Uprobe* up, const ProbeKey* extra) {
  const ProbeKey& k = up->key;
  // A punned jump keeps the bytes after its window: a probe there would
  // change its target (padded, it covers more of them; evicting its
  // successor, the successor's jump and what that keeps).
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  const bool evicts = ss && std::any_of(ss->sites.begin(), ss->sites.end(), [](const Site& s) { return s.evict_hop; });
  return probe_within(r, k, evicts ? arch::jump_extent(up->window) : arch::own_jump_extent(up->window), extra);
}

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

std::uint64_t next_id() {
  static std::uint64_t id = 0;
  return ++id;
}

namespace {

/// Up to `n` bytes of this process's code at `addr` (a page at a time: an
/// instruction at the end of the last mapped page reads what there is).
std::size_t read_own_code(std::uint64_t addr, std::uint8_t* out, std::size_t n) noexcept {
  std::size_t done = 0;
  while (done < n) {
    const std::uint64_t a = addr + done;
    const std::size_t in_page = static_cast<std::size_t>(4096 - (a & 4095));
    const std::size_t want = std::min(n - done, in_page);
    if (probe_read_user(out + done, static_cast<std::uint32_t>(want), reinterpret_cast<const void*>(a)) != 0) break;
    done += want;
  }
  return done;
}

/// FNV-1a of the bytes of `ranges` as they are now; false when one cannot be read.
bool hash_code(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges, std::uint64_t& h) noexcept {
  h = 0xcbf29ce484222325ull;
  std::uint8_t buf[4096];
  for (const auto& [start, end] : ranges)
    for (std::uint64_t a = start; a < end;) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buf, end - a));
      if (read_own_code(a, buf, want) != want) return false;
      for (std::size_t i = 0; i < want; ++i) h = (h ^ buf[i]) * 0x100000001b3ull;
      a += want;
    }
  return true;
}

/// The analyses of this process's consumer code, kept across transactions:
/// an entry is used again only while every byte it read is the same (a
/// library unloaded and another loaded at its address makes another
/// analysis). Registration runs one transaction at a time (the registry
/// mutex), so no lock of its own; a fork child gets a fresh one.
struct ClobbersCache {
  struct Entry {
    arch::Clobbers clobbers;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    std::uint64_t hash = 0;
  };
  std::unordered_map<const void*, Entry> by_code;
};

arch::Clobbers clobbers_of(const void* code, ClobbersMemo& memo) {
  auto [it, fresh] = memo.try_emplace(code);
  if (!fresh) return it->second;
  ClobbersCache& cache = fork_fresh<ClobbersCache>();
  if (auto c = cache.by_code.find(code); c != cache.by_code.end()) {
    std::uint64_t h = 0;
    if (hash_code(c->second.ranges, h) && h == c->second.hash) return it->second = c->second.clobbers;
    cache.by_code.erase(c);
  }
  ClobbersCache::Entry e;
  e.clobbers = arch::analyze_clobbers({code}, read_own_code, &e.ranges);
  if (hash_code(e.ranges, e.hash)) {
    if (cache.by_code.size() >= 256) cache.by_code.clear();
    cache.by_code[code] = e;
  }
  return it->second = e.clobbers;
}

}  // namespace

std::unique_ptr<Registration> make_registration(Consumer& c, ClobbersMemo& memo) {
  auto reg = std::make_unique<Registration>();
  reg->consumer = &c;
  reg->id = next_id();
  reg->has_entry = static_cast<unsigned>(c.callbacks()) & static_cast<unsigned>(Callbacks::entry);
  reg->has_ret = static_cast<unsigned>(c.callbacks()) & static_cast<unsigned>(Callbacks::ret);
  reg->trivial_filter = trivial_filter(c);
  if (!UPROBE_TSAN && !c.vector_state_unused()) {  // (TSan: everything is saved, opt_entry.cpp)
    if (reg->has_entry) {
      reg->handler_code = handler_code(c);
      reg->handler_clobbers = clobbers_of(reg->handler_code, memo);
    }
    if (reg->has_ret) {
      reg->ret_code = ret_handler_code(c);
      reg->ret_clobbers = clobbers_of(reg->ret_code, memo);
    }
  }
  return reg;
}

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

}  // namespace uprobe::detail
