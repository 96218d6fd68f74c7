// SPDX-License-Identifier: MIT
// Register and unregister: the kernel's uprobe_register()/uprobe_unregister()
// and install_breakpoint()/remove_breakpoint(), in process.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <elf.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "arch.hpp"
#include "format.hpp"
#include "ifunc.hpp"
#include "patch.hpp"
#include "probe.hpp"
#include "registry_steps.hpp"
#include "runtime.hpp"
#include "sites.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"
#include "validate.hpp"
#include "xol.hpp"

namespace uprobe::detail {

namespace {

void check_not_in_handler(const std::string& path, std::uint64_t offset) {
  if (t_state.depth > 0)
    throw Error(Errc::in_handler, path, offset,
                "cannot register or unregister from inside a probe handler (it would wait for itself)");
}

class PatchGuard {
 public:
  explicit PatchGuard(Uprobe* up) : up_(up) {
    while (up_->patch_lock.test_and_set(std::memory_order_acquire)) __builtin_ia32_pause();
  }
  ~PatchGuard() { up_->patch_lock.clear(std::memory_order_release); }

 private:
  Uprobe* up_;
};

/// The sites of `up` in the current address space: one per executable
/// mapping of the file that covers the offset. Prepares their XOL slots.
std::unique_ptr<SiteSet> compute_sites(Uprobe* up, const VmaSnapshot& vmas) {
  auto ss = std::make_unique<SiteSet>();
  for (const Vma& v : vmas.vmas()) {
    if (!v.executable() || v.dev != up->key.dev || v.ino != up->key.ino) continue;
    if (up->key.offset < v.pgoff || up->key.offset >= v.pgoff + (v.end - v.start)) continue;
    Site s;
    s.addr = v.start + (up->key.offset - v.pgoff);
    std::string why;
    if (up->window.len) {
      std::string wwhy;
      s.window_xol = xol_area().window_slot_for(s.addr, up->window, vmas.vmas(), wwhy);
    }
    s.xol = xol_area().slot_for(s.addr, up->insn, vmas.vmas(), why);
    s.stub = stub_of(s.addr);
    s.jumped = site_is_optimized(s) ? 1 : 0;
    if (!s.xol && !arch::is_emulated(up->insn))
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
      PatchGuard guard(up);
      if (!peek_text_fresh(s.addr, &cur, 1)) continue;
      if (!matches())
        throw Error(Errc::refused_instruction, up->path, up->key.offset,
                    "the byte in memory at " + hex(s.addr) + " is " + hex(cur) + ", not the file's " +
                        hex(up->insn.bytes[0]) + (cur == arch::kBreakpoint ? " (another breakpoint is there)" : ""));
    }
    ss->sites.push_back(s);
  }
  return ss;
}

/// Brings the sites of `up` in line with the address space: new mappings get
/// the breakpoint (when applied), vanished ones are dropped without a write.
void sync_sites(Registry& r, Uprobe* up, const VmaSnapshot& vmas) {
  std::unique_ptr<SiteSet> fresh = compute_sites(up, vmas);
  PatchGuard guard(up);
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

/// Brings one registration's semaphore increments in line with the mappings:
/// +1 where the file's semaphore is mapped and not yet counted; forgets
/// addresses that are no longer mapped (nothing to decrement there).
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

void publish_probes(Registry& r) {
  auto table = std::make_unique<ProbeTable>();
  table->entries.reserve(r.tree.size());
  for (Uprobe& u : r.tree) table->entries.emplace_back(u.key, &u);
  table->build();
  publish(r, nullptr, table.release());
}

/// The offset of a probe of the same file strictly inside the window of
/// `up` (`extra` counts as one when given), or 0.
std::uint64_t probe_inside_window(Registry& r, const Uprobe* up, const ProbeKey* extra) {
  const ProbeKey& k = up->key;
  const std::uint64_t end = k.offset + up->window.len;
  if (extra && extra->dev == k.dev && extra->ino == k.ino && extra->offset > k.offset && extra->offset < end)
    return extra->offset;
  for (auto it = r.tree.upper_bound(k, KeyLess()); it != r.tree.end(); ++it) {
    if (it->key.dev != k.dev || it->key.ino != k.ino || it->key.offset >= end) break;
    return it->key.offset;
  }
  return 0;
}

/// Re-evaluates the window of every entry probe of the file of `k` whose
/// window may cover k.offset: blocked ones go back to int3 (before a probe
/// inside them gets its breakpoint), unblocked ones are optimized again.
void refresh_windows_around(Registry& r, const ProbeKey& k, const ProbeKey* extra, const VmaSnapshot* vmas) {
  const std::uint64_t lo = k.offset > arch::kMaxWindowLen ? k.offset - arch::kMaxWindowLen : 0;
  for (auto it = r.tree.lower_bound(ProbeKey{k.dev, k.ino, lo}, KeyLess()); it != r.tree.end(); ++it) {
    Uprobe& u = *it;
    if (u.key.dev != k.dev || u.key.ino != k.ino || u.key.offset >= k.offset) break;
    if (!u.window.len) continue;
    const std::uint64_t inner = probe_inside_window(r, &u, extra);
    u.window_blocker.store(inner, std::memory_order_release);
    PatchGuard guard(&u);
    if (!u.applied) continue;
    const SiteSet& ss = *u.sites.load(std::memory_order_relaxed);
    if (inner)
      deoptimize_sites(&u, ss);
    else if (vmas)
      optimize_sites(&u, ss, vmas->vmas());
  }
}

bool is_registered(Registry& r, const Uprobe* up) {
  auto it = r.tree.find(up->key, KeyLess());
  return it != r.tree.end() && &*it == up;
}

}  // namespace

}  // namespace uprobe::detail

namespace uprobe {

using namespace detail;

Uprobe* register_uprobe(const std::string& path, std::uint64_t offset, Consumer& consumer) {
  return register_uprobe(path, offset, 0, consumer);
}

Uprobe* register_uprobe(const std::string& path, std::uint64_t offset, std::uint64_t ref_ctr_offset,
                        Consumer& consumer) {
  check_not_in_handler(path, offset);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  start_runtime(r);

  Target t;
  open_target(path, offset, t);
  check_not_forbidden(t, offset);
  if (consumer.callbacks() != Callbacks::entry) check_function_entry(t, offset);
  ProbeKey key{t.st.st_dev, t.st.st_ino, offset};
  const VmaSnapshot* vmas = refresh_vmas(r);
  static std::uint64_t next_id = 0;
  auto reg = std::make_unique<Registration>();
  reg->consumer = &consumer;
  reg->id = ++next_id;
  reg->has_entry = static_cast<unsigned>(consumer.callbacks()) & static_cast<unsigned>(Callbacks::entry);
  reg->has_ret = static_cast<unsigned>(consumer.callbacks()) & static_cast<unsigned>(Callbacks::ret);
  if (reg->has_ret) uretprobe_reserve();  // return instances for the threads running now: never allocated by a hit

  auto it = r.tree.find(key, KeyLess());
  if (it != r.tree.end()) {
    Uprobe* up = &*it;
    const ConsumerSet* old = up->consumers.load(std::memory_order_relaxed);
    for (const Registration* x : old->regs)
      if (x->consumer == &consumer)
        throw Error(Errc::conflict, path, offset, "this consumer is already registered on this probe");
    if (reg->has_ret) {
      unsigned rets = 0;
      for (const Registration* x : old->regs) rets += x->has_ret;
      if (rets >= kMaxReturnConsumers)
        throw Error(Errc::too_many_return_consumers, path, offset,
                    "this probe already has " + std::to_string(rets) +
                        " consumers with a ret_handler, the most one return instance records");
    }
    if (up->ref_ctr_offset != ref_ctr_offset)
      throw Error(Errc::ref_ctr_conflict, path, offset,
                  "the probe's USDT semaphore (ref_ctr_offset) is " + hex(up->ref_ctr_offset) + ", not " +
                      hex(ref_ctr_offset));
    sync_sites(r, up, *vmas);
    sync_ref_ctr(up, reg.get(), *vmas);
    auto cs = std::make_unique<ConsumerSet>(*old);
    cs->regs.push_back(reg.release());
    up->consumers.store(cs.release(), std::memory_order_release);
    r.deferred.emplace_back([old] { delete old; });
    {
      PatchGuard guard(up);
      const SiteSet& ss = *up->sites.load(std::memory_order_relaxed);
      if (!up->applied) {
        apply_sites(up, ss);
        up->applied = true;
      }
      refresh_stub_flags(up, ss);
      optimize_sites(up, ss, vmas->vmas());
    }
    if (r.deferred.size() > 256) synchronize_and_reclaim(r);
    return up;
  }

  // An optimized entry whose window covers this offset goes back to int3
  // first: its jump overwrote the bytes this probe needs.
  refresh_windows_around(r, key, &key, nullptr);
  auto up = std::make_unique<Uprobe>();
  up->key = key;
  up->id = ++next_id;
  up->ref_ctr_offset = ref_ctr_offset;
  up->path = path;
  try {
    analyze_target(t, offset, up->insn, &up->window, &up->window_why);
    up->window_blocker.store(probe_inside_window(r, up.get(), nullptr), std::memory_order_relaxed);
    up->sites.store(compute_sites(up.get(), *vmas).release(), std::memory_order_relaxed);
  } catch (...) {
    refresh_windows_around(r, key, nullptr, vmas);
    throw;
  }
  auto cs = std::make_unique<ConsumerSet>();
  cs->regs.push_back(reg.release());
  up->consumers.store(cs.release(), std::memory_order_relaxed);

  Uprobe* raw = up.release();
  r.tree.insert(*raw);
  publish_probes(r);
  try {
    PatchGuard guard(raw);
    apply_sites(raw, *raw->sites.load(std::memory_order_relaxed));
    raw->applied = true;
    optimize_sites(raw, *raw->sites.load(std::memory_order_relaxed), vmas->vmas());
    sync_ref_ctr(raw, raw->consumers.load(std::memory_order_relaxed)->regs[0], *vmas);
  } catch (...) {
    forget_stub_owner(raw);
    r.tree.erase(r.tree.iterator_to(*raw));
    publish_probes(r);
    refresh_windows_around(r, key, nullptr, vmas);
    synchronize_and_reclaim(r);
    delete raw->consumers.load()->regs[0];
    delete raw->consumers.load();
    delete raw->sites.load();
    delete raw;
    throw;
  }
  return raw;
}

void detail::resync_address_space() {
  if (t_state.depth > 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.started) return;
  const VmaSnapshot* vmas = refresh_vmas(r);
  for (Uprobe& u : r.tree) {
    try {
      sync_sites(r, &u, *vmas);
      PatchGuard guard(&u);
      optimize_sites(&u, *u.sites.load(std::memory_order_relaxed), vmas->vmas());
    } catch (const Error&) {
      // A new mapping we refuse to write to (its bytes differ from the
      // file): it stays unprobed.
    }
    for (Registration* reg : u.consumers.load(std::memory_order_relaxed)->regs) sync_ref_ctr(&u, reg, *vmas);
  }
  if (r.deferred.size() > 64) synchronize_and_reclaim(r);
}

void detail::reoptimize_all(Registry& r) {
  const VmaSnapshot* vmas = g_hot.vmas.load(std::memory_order_acquire);
  // Probes whose every site holds our int3 are converted together, as a
  // batch attach converts them (one protocol run, one serialisation per
  // step); the others (partly optimized, or to undo) one by one.
  std::vector<Uprobe*> together;
  PeekCache peeks;  // a read at every site: one system call per page (kept equal to memory across our writes)
  for (Uprobe& u : r.tree) {
    PatchGuard guard(&u);
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
  PokeSession poke;          // one /proc/self/mem descriptor for every write
  xol_area().begin_batch();  // one RW alias per XOL region for every stub
  for (Uprobe* up : together)
    while (up->patch_lock.test_and_set(std::memory_order_acquire)) __builtin_ia32_pause();
  try {
    OptBatch b;
    prepare_optimize_batch(together, vmas->vmas(), b);
    finish_optimize_batch(b);
  } catch (const std::exception&) {
    // Out of memory: the rest stay int3 probes, which work as well.
  }
  for (Uprobe* up : together) up->patch_lock.clear(std::memory_order_release);
  xol_area().end_batch();
}

Uprobe* register_uprobe(const void* address, Consumer& consumer) {
  FileOffset fo = resolve_address(address);
  return register_uprobe(fo.path, fo.offset, consumer);
}

void unregister_uprobe(Uprobe* up, Consumer& consumer) {
  check_not_in_handler(up ? up->path : std::string(), up ? up->key.offset : 0);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!up || !is_registered(r, up)) throw Error(Errc::conflict, "", 0, "not a registered probe");
  const ConsumerSet* old = up->consumers.load(std::memory_order_relaxed);
  auto cs = std::make_unique<ConsumerSet>();
  Registration* gone = nullptr;
  for (Registration* x : old->regs) {
    if (x->consumer == &consumer && !gone)
      gone = x;
    else
      cs->regs.push_back(x);
  }
  if (!gone) throw Error(Errc::conflict, up->path, up->key.offset, "this consumer is not registered on this probe");

  // Never write into a mapping that is gone: drop vanished sites first.
  const VmaSnapshot* vmas = refresh_vmas(r);
  try {
    sync_sites(r, up, *vmas);
  } catch (const Error&) {
    // A mapping changed under the probe in a way we refuse to write to; keep
    // the old sites and restore what we can below.
  }
  release_ref_ctr(up, gone, *vmas);
  bool last = cs->regs.empty();
  up->consumers.store(cs.release(), std::memory_order_release);
  r.deferred.emplace_back([old, gone] {
    delete old;
    delete gone;
  });
  if (!last) {
    PatchGuard guard(up);
    refresh_stub_flags(up, *up->sites.load(std::memory_order_relaxed));
  }
  if (last) {
    {
      PatchGuard guard(up);
      restore_sites(up, *up->sites.load(std::memory_order_relaxed));
      up->applied = false;
    }
    const ProbeKey gone_key = up->key;
    forget_stub_owner(up);
    r.tree.erase(r.tree.iterator_to(*up));
    publish_probes(r);
    refresh_windows_around(r, gone_key, nullptr, vmas);
    r.deferred.emplace_back([up] {
      delete up->consumers.load();
      delete up->sites.load();
      delete up;
    });
  }
  synchronize_and_reclaim(r);
}

FileOffset resolve_address(const void* address) {
  if (auto fo = file_offset_from_snapshot(reinterpret_cast<std::uint64_t>(address))) return *fo;
  VmaSnapshot snap(read_proc_maps());
  return file_offset_of(snap, reinterpret_cast<std::uint64_t>(address));
}

namespace {

ProbeInfo probe_state(const Uprobe* up);

/// ProbeInfo::symbol and ProbeInfo::ifunc: the code symbol holding the probe,
/// and the GNU indirect functions bound to it (or whose resolver it is in).
/// Reads the file's symbols (cached) and asks the dynamic linker: not under
/// the registry mutex.
void describe_code(ProbeInfo& info) {
  try {
    const std::string& path = info.where.path;
    const std::uint64_t off = info.where.offset;
    const std::optional<Symbol> at = symbol_at(path, off);
    if (at) {
      info.symbol = at->full_name();
      if (off > at->offset) info.symbol += "+" + hex(off - at->offset);
    }
    const std::vector<detail::IfuncBinding> bindings = detail::ifunc_bindings(path);
    if (bindings.empty()) return;
    // An implementation by its symbol, else by its file offset (glibc's
    // libc.so.6 as Debian ships it has no .symtab: __strlen_evex is unnamed).
    auto impl_name = [&](const std::string& p, std::uint64_t o, bool same_file) {
      const std::optional<Symbol> s = symbol_at(p, o);
      if (s && s->offset == o) return s->full_name();
      return "offset " + hex(o) + (same_file ? std::string() : " of " + p);
    };
    if (at && at->type == STT_GNU_IFUNC) {
      std::string bound;
      for (const detail::IfuncBinding& b : bindings)
        if (b.ifunc.offset == at->offset && b.ifunc.name == at->name)
          bound = impl_name(b.impl_path, b.impl_offset, b.impl_dev == info.where.dev && b.impl_ino == info.where.ino);
      info.ifunc = "resolver of IFUNC " + at->name +
                   (bound.empty() ? std::string(" (a probe here sees no calls)")
                                  : " (bound to " + bound + ": a probe here sees no calls)");
      return;
    }
    // The function holding the probe starts at the symbol; unnamed code is
    // recognised at its first byte only.
    const std::uint64_t fn = at ? at->offset : off;
    std::string names;
    for (const detail::IfuncBinding& b : bindings)
      if (b.impl_offset == fn && b.impl_dev == info.where.dev && b.impl_ino == info.where.ino)
        names += (names.empty() ? "" : ", ") + b.ifunc.full_name();
    if (!names.empty()) info.ifunc = "IFUNC " + names + " -> " + impl_name(path, fn, true);
  } catch (const Error&) {
  }
}

}  // namespace

ProbeInfo probe_info(const Uprobe* up) {
  ProbeInfo info = probe_state(up);
  describe_code(info);
  return info;
}

namespace {

/// The probe's state (everything but describe_code()), under the registry mutex.
ProbeInfo probe_state(const Uprobe* up) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!up || !is_registered(r, up)) throw Error(Errc::conflict, "", 0, "not a registered probe");
  ProbeInfo info;
  info.where = FileOffset{up->path, up->key.offset, up->key.dev, up->key.ino};
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  info.sites = up->applied && ss ? static_cast<unsigned>(ss->sites.size()) : 0;
  info.consumers = static_cast<unsigned>(up->consumers.load(std::memory_order_relaxed)->regs.size());
  info.emulated = arch::is_emulated(up->insn) &&
                  (g_hot.emulate.load(std::memory_order_relaxed) || !arch::xol_safe(up->insn));
  info.instruction = up->insn.text;
  info.why_not_optimized = why_not_optimized(up);
  bool optimized = false;
  if (ss)
    for (const Site& s : ss->sites) optimized = optimized || site_is_optimized(s);
  info.mode = info.sites == 0 ? "pending"
              : !optimized        ? "int3"
              : arch::is_nop5(up->insn) ? "optimized-nop5"
                                        : "optimized-entry";
  if (info.mode == "optimized-entry") info.displaced = up->window.len;
  if (optimized) info.why_not_optimized.clear();
  else if (info.why_not_optimized.empty() && info.sites) info.why_not_optimized = "no stub memory within reach";
  return info;
}

}  // namespace

Attachment::Attachment(const std::string& path, std::uint64_t offset, Consumer& consumer)
    : probe_(register_uprobe(path, offset, consumer)), consumer_(&consumer) {}
Attachment::Attachment(const void* address, Consumer& consumer)
    : probe_(register_uprobe(address, consumer)), consumer_(&consumer) {}
Attachment::Attachment(Attachment&& o) noexcept : probe_(o.probe_), consumer_(o.consumer_) {
  o.probe_ = nullptr;
  o.consumer_ = nullptr;
}
Attachment& Attachment::operator=(Attachment&& o) noexcept {
  if (this != &o) {
    detach();
    probe_ = o.probe_;
    consumer_ = o.consumer_;
    o.probe_ = nullptr;
    o.consumer_ = nullptr;
  }
  return *this;
}
Attachment::Attachment(const std::string& path, std::uint64_t offset, std::uint64_t ref_ctr_offset,
                       Consumer& consumer)
    : probe_(register_uprobe(path, offset, ref_ctr_offset, consumer)), consumer_(&consumer) {}
Attachment::~Attachment() {
  try {
    detach();
  } catch (...) {
  }
}
void Attachment::detach() {
  if (!probe_) return;
  Uprobe* p = probe_;
  probe_ = nullptr;
  unregister_uprobe(p, *consumer_);
}

}  // namespace uprobe

// ---- The steps above, for the batch API (registry_steps.hpp, batch.cpp).

namespace uprobe::detail {

std::unique_ptr<SiteSet> probe_sites(Uprobe* up, const VmaSnapshot& vmas) { return compute_sites(up, vmas); }
void sync_probe_sites(Registry& r, Uprobe* up, const VmaSnapshot& vmas) { sync_sites(r, up, vmas); }
void sync_probe_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas) { sync_ref_ctr(up, reg, vmas); }
void release_probe_ref_ctr(const Uprobe* up, Registration* reg, const VmaSnapshot& vmas) {
  release_ref_ctr(up, reg, vmas);
}
void publish_probe_table(Registry& r) { publish_probes(r); }
bool probe_registered(Registry& r, const Uprobe* up) { return is_registered(r, up); }
std::uint64_t probe_in_window(Registry& r, const Uprobe* up, const ProbeKey* extra) {
  return probe_inside_window(r, up, extra);
}
void refresh_entry_windows(Registry& r, const ProbeKey& k, const ProbeKey* extra, const VmaSnapshot* vmas) {
  refresh_windows_around(r, k, extra, vmas);
}

}  // namespace uprobe::detail

uprobe::Attachment uprobe::Attachment::adopt(Uprobe* probe, Consumer& consumer) noexcept {
  Attachment a;
  if (probe) {
    a.probe_ = probe;
    a.consumer_ = &consumer;
  }
  return a;
}
