// SPDX-License-Identifier: MIT
// The batch API (include/uprobe/batch.hpp): register_uprobe() and
// unregister_uprobe() for many probes under one registry lock, with one
// address-space snapshot, one open and ELF read per file, one publication of
// the probe table and one RCU grace period per batch. The per-probe steps are
// registry.cpp's (registry_steps.hpp), in the same order, so a batch behaves
// as the same calls made one by one.

#include "uprobe/batch.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <tuple>
#include <memory>
#include <memory_resource>
#include <optional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "patch.hpp"
#include "probe.hpp"
#include "registry_steps.hpp"
#include "runtime.hpp"
#include "sites.hpp"
#include "format.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"
#include "validate.hpp"
#include "xol.hpp"

namespace uprobe::detail {
namespace {

constexpr const char kInHandler[] =
    "cannot register or unregister from inside a probe handler (it would wait for itself)";

/// The files of one batch, each opened once.
class Files {
 public:
  /// The opened target for (path, offset); throws what register_uprobe()
  /// would (file_not_found, not_executable, bad_offset).
  const Target& open(const std::string& path, std::uint64_t offset) {
    auto [it, fresh] = files_.try_emplace(path);
    if (fresh) {
      auto t = std::make_unique<Target>();
      try {
        open_target(path, 0, *t);
        t->batch = true;
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
  std::unordered_map<std::string, std::unique_ptr<Target>> files_;
};

/// Ids of the probes and registrations made here: unique for the life of the
/// process, like registry.cpp's, from a range of their own (registry mutex held).
std::uint64_t next_id() {
  static std::uint64_t id = 1ull << 62;
  return ++id;
}

std::unique_ptr<Registration> make_registration(Consumer& c) {
  auto reg = std::make_unique<Registration>();
  reg->consumer = &c;
  reg->id = next_id();
  reg->has_entry = static_cast<unsigned>(c.callbacks()) & static_cast<unsigned>(Callbacks::entry);
  reg->has_ret = static_cast<unsigned>(c.callbacks()) & static_cast<unsigned>(Callbacks::ret);
  return reg;
}

/// register_uprobe()'s refusals for one more consumer on an existing probe.
void check_can_add(const Uprobe* up, const ConsumerSet& cs, const Registration& reg, std::uint64_t ref_ctr_offset) {
  for (const Registration* x : cs.regs)
    if (x->consumer == reg.consumer)
      throw Error(Errc::conflict, up->path, up->key.offset, "this consumer is already registered on this probe");
  if (reg.has_ret) {
    unsigned rets = 0;
    for (const Registration* x : cs.regs) rets += x->has_ret;
    if (rets >= kMaxReturnConsumers)
      throw Error(Errc::too_many_return_consumers, up->path, up->key.offset,
                  "this probe already has " + std::to_string(rets) +
                      " consumers with a ret_handler, the most one return instance records");
  }
  if (up->ref_ctr_offset != ref_ctr_offset)
    throw Error(Errc::ref_ctr_conflict, up->path, up->key.offset,
                "the probe's USDT semaphore (ref_ctr_offset) is " + hex(up->ref_ctr_offset) + ", not " +
                    hex(ref_ctr_offset));
}

/// A consumer added to a probe that is published already (register_uprobe()'s
/// path for an existing probe). On failure nothing is left changed.
void add_to_published(Registry& r, Uprobe* up, std::unique_ptr<Registration> reg, const VmaSnapshot& vmas) {
  sync_probe_sites(r, up, vmas);
  const ConsumerSet* old = up->consumers.load(std::memory_order_relaxed);
  auto cs = std::make_unique<ConsumerSet>(*old);
  Registration* raw = reg.release();
  cs->regs.push_back(raw);
  ConsumerSet* added = cs.release();
  up->consumers.store(added, std::memory_order_release);
  try {
    PatchLock guard(up);
    const SiteSet& ss = *up->sites.load(std::memory_order_relaxed);
    if (!up->applied) {
      apply_sites(up, ss);  // restores what it wrote before it throws
      up->applied = true;
    }
    refresh_stub_flags(up, ss);
    optimize_sites(up, ss, vmas.vmas());
  } catch (...) {
    up->consumers.store(const_cast<ConsumerSet*>(old), std::memory_order_release);
    r.deferred.emplace_back([added, raw] {
      delete added;
      delete raw;
    });
    throw;
  }
  sync_probe_ref_ctr(up, raw, vmas);
  r.deferred.emplace_back([old] { delete old; });
}

/// A probe created by this batch, not yet applied.
struct Fresh {
  Uprobe* up;
  bool optimizable = false;  // optimizable() when it was made
};

/// What an unregister batch frees after its grace period.
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

/// The executable file mappings of a snapshot by (dev, ino), to tell without
/// allocating whether a probe's sites still match the address space.
class ExecIndex {
 public:
  explicit ExecIndex(const VmaSnapshot& s) {
    for (const Vma& v : s.vmas())
      if (v.executable() && v.ino != 0) exec_.push_back(&v);
    std::sort(exec_.begin(), exec_.end(),
              [](const Vma* a, const Vma* b) { return std::tie(a->dev, a->ino, a->start) < std::tie(b->dev, b->ino, b->start); });
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

/// XolArea::begin_batch()/end_batch() for a scope.
struct XolBatch {
  XolBatch() noexcept { xol_area().begin_batch(); }
  ~XolBatch() { xol_area().end_batch(); }
  XolBatch(const XolBatch&) = delete;
  XolBatch& operator=(const XolBatch&) = delete;
};

Error as_error(const std::exception& e, const std::string& path, std::uint64_t offset) {
  if (auto* err = dynamic_cast<const Error*>(&e)) return *err;
  return Error(Errc::system, path, offset, e.what());
}

}  // namespace
}  // namespace uprobe::detail

namespace uprobe {

using namespace detail;

std::vector<RegisterResult> register_uprobes(std::span<const ProbeRequest> requests) {
  std::vector<RegisterResult> out(requests.size());
  auto fail_all = [&](const Error& e) {
    for (std::size_t i = 0; i < requests.size(); ++i) {
      out[i].probe = nullptr;
      out[i].error = e.code() == Errc::in_handler ? Error(e.code(), requests[i].path, requests[i].offset, kInHandler) : e;
    }
    return out;
  };
  if (requests.empty()) return out;
  if (t_state.depth > 0) return fail_all(Error(Errc::in_handler, "", 0, kInHandler));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const VmaSnapshot* vmas = nullptr;
  try {
    start_runtime(r);
    vmas = refresh_vmas(r);  // the one read of the address space
  } catch (const Error& e) {
    return fail_all(e);
  }
  for (const ProbeRequest& q : requests)
    if (q.consumer && q.consumer->callbacks() != Callbacks::entry) {
      uretprobe_reserve();  // return instances for the threads running now: never allocated by a hit
      break;
    }

  XolBatch xol_batch;
  PokeSession poke;
  Files files;
  // The batch's own bookkeeping comes from one arena, freed at once at the
  // end: once the breakpoints are in, every free() of a probed free() traps.
  std::pmr::monotonic_buffer_resource arena(requests.size() * 96);
  std::pmr::vector<Fresh> fresh(&arena);
  fresh.reserve(requests.size());
  std::pmr::unordered_map<const Uprobe*, std::size_t> fresh_index(&arena);
  fresh_index.reserve(requests.size());
  constexpr std::size_t kNotFresh = ~std::size_t{0};
  std::pmr::vector<std::size_t> fresh_of(requests.size(), kNotFresh, &arena);  // request -> its fresh probe

  // 1. Every request, in order: checks, and either a consumer added to a
  //    published probe (as register_uprobe() does) or a new probe put in the
  //    tree, unpublished and unapplied.
  std::optional<PeekCache> peeks(std::in_place);  // step 1 reads a byte at every site: a system call per page
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const ProbeRequest& q = requests[i];
    std::string path = q.path;
    std::uint64_t offset = q.offset;
    try {
      if (q.address) {
        FileOffset fo = file_offset_of(*vmas, reinterpret_cast<std::uint64_t>(q.address));
        path = std::move(fo.path);
        offset = fo.offset;
      }
      if (!q.consumer) throw Error(Errc::invalid_argument, path, offset, "the request names no consumer");
      const Target& t = files.open(path, offset);
      check_not_forbidden(t, offset);
      if (q.consumer->callbacks() != Callbacks::entry) check_function_entry(t, offset);
      const ProbeKey key{t.st.st_dev, t.st.st_ino, offset};
      std::unique_ptr<Registration> reg = make_registration(*q.consumer);

      auto it = r.tree.find(key, KeyLess());
      if (it != r.tree.end()) {
        Uprobe* up = &*it;
        ConsumerSet* cs = up->consumers.load(std::memory_order_relaxed);
        check_can_add(up, *cs, *reg, q.ref_ctr_offset);
        if (auto f = fresh_index.find(up); f != fresh_index.end()) {
          cs->regs.push_back(reg.release());  // not published yet: edited in place
          fresh_of[i] = f->second;
        } else {
          add_to_published(r, up, std::move(reg), *vmas);
        }
        out[i].probe = up;
        continue;
      }

      // An optimized entry whose window covers this offset goes back to
      // int3 first: its jump overwrote the bytes this probe needs.
      refresh_entry_windows(r, key, &key, nullptr);
      auto up = std::make_unique<Uprobe>();
      up->key = key;
      up->id = next_id();
      up->ref_ctr_offset = q.ref_ctr_offset;
      up->path = path;
      try {
        analyze_target(t, offset, up->insn, &up->window, &up->window_why);
        up->window_blocker.store(probe_in_window(r, up.get(), nullptr), std::memory_order_relaxed);
        up->sites.store(probe_sites(up.get(), *vmas).release(), std::memory_order_relaxed);
      } catch (...) {
        refresh_entry_windows(r, key, nullptr, vmas);
        throw;
      }
      auto cs = std::make_unique<ConsumerSet>();
      cs->regs.push_back(reg.release());
      up->consumers.store(cs.release(), std::memory_order_relaxed);
      Uprobe* raw = up.release();
      r.tree.insert(*raw);
      fresh_of[i] = fresh.size();
      fresh_index.emplace(raw, fresh.size());
      fresh.push_back(Fresh{raw, optimizable(raw)});
      out[i].probe = raw;
    } catch (const std::exception& e) {
      out[i].error = as_error(e, path, offset);
    }
  }

  // (The page copy stays: this thread's writes below keep it equal to
  // memory, and any other thread's text write makes it read the page again.)

  // 2. One publication: from here on a hit at any new site finds its probe.
  if (!fresh.empty()) publish_probe_table(r);

  // 3. The breakpoints of the new probes; then their optimized jumps, all
  //    with one protocol run (optimize_sites_batch()); then the USDT
  //    semaphores. Each probe's patch_lock is held from its int3 until its
  //    jump is in (the trap path's Action::remove only try-locks it).
  std::pmr::vector<ProbeKey> dropped_keys(&arena);
  dropped_keys.reserve(fresh.size());
  std::vector<Uprobe*> applied, to_optimize;
  applied.reserve(fresh.size());
  to_optimize.reserve(fresh.size());
  for (const Fresh& f : fresh)
    if (f.optimizable) to_optimize.push_back(f.up);
  OptBatch opt;
  try {
    prepare_optimize_batch(to_optimize, vmas->vmas(), opt);  // stubs, before any int3: it allocates
  } catch (const std::exception&) {
    opt.items.clear();  // out of memory: int3 probes only
  }
  for (std::size_t k = 0; k < fresh.size(); ++k) {
    const Fresh& f = fresh[k];
    Uprobe* up = f.up;
    while (up->patch_lock.test_and_set(std::memory_order_acquire)) __builtin_ia32_pause();
    try {
      apply_sites(up, *up->sites.load(std::memory_order_relaxed));  // restores what it wrote before it throws
      up->applied = true;
      applied.push_back(up);
      continue;
    } catch (const std::exception& e) {
      up->patch_lock.clear(std::memory_order_release);
      const Error err = as_error(e, up->path, up->key.offset);
      for (std::size_t i = 0; i < requests.size(); ++i) {
        if (fresh_of[i] != k) continue;
        out[i].probe = nullptr;
        out[i].error = err;
      }
      forget_stub_owner(up);
      r.tree.erase(r.tree.iterator_to(*up));
      dropped_keys.push_back(up->key);
      r.deferred.emplace_back([up] {
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
    up->patch_lock.clear(std::memory_order_release);
    for (Registration* reg : up->consumers.load(std::memory_order_relaxed)->regs) sync_probe_ref_ctr(up, reg, *vmas);
  }
  if (!dropped_keys.empty()) {
    publish_probe_table(r);
    for (const ProbeKey& k : dropped_keys) refresh_entry_windows(r, k, nullptr, vmas);
    synchronize_and_reclaim(r);
  } else if (r.deferred.size() > 256) {
    synchronize_and_reclaim(r);
  }
  return out;
}

std::vector<std::optional<Error>> unregister_uprobes(std::span<const ProbeConsumer> registrations) {
  const std::size_t n = registrations.size();
  std::vector<std::optional<Error>> out(n);
  if (n == 0) return out;
  if (t_state.depth > 0) {
    for (std::size_t i = 0; i < n; ++i) {
      const Uprobe* up = registrations[i].probe;
      out[i] = Error(Errc::in_handler, up ? up->path : std::string(), up ? up->key.offset : 0, kInHandler);
    }
    return out;
  }
  // The pairs grouped by probe, in request order within a probe (so the
  // first of two identical pairs is the one that succeeds). Everything this
  // needs is allocated up front: the probed functions may include malloc().
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::less<const Uprobe*>()(registrations[a].probe, registrations[b].probe);
  });
  Garbage garbage;
  garbage.regs.reserve(n);
  garbage.sets.reserve(n);
  garbage.probes.reserve(n);
  std::vector<Uprobe*> kept;  // probes that keep consumers: stub flags to refresh
  kept.reserve(n);
  std::vector<Registration*> remaining;
  remaining.reserve(16);

  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const VmaSnapshot* vmas = nullptr;
  try {
    vmas = refresh_vmas(r);
  } catch (const Error& e) {
    for (auto& o : out) o = e;
    return out;
  }
  const ExecIndex exec(*vmas);
  PokeSession poke;
  PeekCache peeks;     // reads at every site: one system call per page (kept equal to memory across our writes)
  XolBatch xol_batch;  // the stubs' owner fields and vector flags: one RW alias per region, not one mmap per write

  for (std::size_t g = 0; g < n;) {
    Uprobe* up = registrations[order[g]].probe;
    std::size_t end = g;
    while (end < n && registrations[order[end]].probe == up) ++end;
    if (!up || !probe_registered(r, up)) {
      for (std::size_t k = g; k < end; ++k) out[order[k]] = Error(Errc::conflict, "", 0, "not a registered probe");
      g = end;
      continue;
    }
    const ConsumerSet* old = up->consumers.load(std::memory_order_relaxed);
    remaining.assign(old->regs.begin(), old->regs.end());
    const std::size_t gone_from = garbage.regs.size();
    for (std::size_t k = g; k < end; ++k) {
      auto it = std::find_if(remaining.begin(), remaining.end(),
                             [&](const Registration* x) { return x->consumer == registrations[order[k]].consumer; });
      if (it == remaining.end()) {
        out[order[k]] = Error(Errc::conflict, up->path, up->key.offset, "this consumer is not registered on this probe");
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
        sync_probe_sites(r, up, *vmas);
      } catch (const Error&) {
        // A mapping changed under the probe in a way we refuse to write
        // to; keep the old sites and restore what we can.
      }
    }
    for (std::size_t k = gone_from; k < garbage.regs.size(); ++k) release_probe_ref_ctr(up, garbage.regs[k], *vmas);
    garbage.sets.push_back(old);
    if (remaining.empty()) {
      // The last consumers: no new consumer set. Until the breakpoints are
      // gone (below) a hit still finds the old one, as a hit that trapped
      // before an unregister_uprobe() may; none runs after the grace period.
      // Their text is restored below, all together (restore_sites_batch()),
      // each under its patch lock from here on.
      while (up->patch_lock.test_and_set(std::memory_order_acquire)) __builtin_ia32_pause();
      garbage.probes.push_back(up);
    } else {
      up->consumers.store(new ConsumerSet{remaining}, std::memory_order_release);
      kept.push_back(up);
    }
  }
  restore_sites_batch(garbage.probes);
  for (Uprobe* up : garbage.probes) {
    up->applied = false;
    up->patch_lock.clear(std::memory_order_release);
  }
  for (Uprobe* up : kept) {
    PatchLock guard(up);
    refresh_stub_flags(up, *up->sites.load(std::memory_order_relaxed));
  }
  for (Uprobe* up : garbage.probes) {
    forget_stub_owner(up);
    r.tree.erase(r.tree.iterator_to(*up));
  }
  if (!garbage.probes.empty()) {
    publish_probe_table(r);
    // Entry probes whose window held one of the probes gone may be optimized now.
    for (const Uprobe* up : garbage.probes) refresh_entry_windows(r, up->key, nullptr, vmas);
  }
  r.deferred.emplace_back([g = std::make_shared<Garbage>(std::move(garbage))] { g->free(); });
  synchronize_and_reclaim(r);  // the one grace period
  return out;
}

std::vector<AttachResult> attach_all(std::span<const ProbeRequest> requests) {
  std::vector<RegisterResult> regs = register_uprobes(requests);
  std::vector<AttachResult> out(regs.size());
  for (std::size_t i = 0; i < regs.size(); ++i) {
    if (regs[i].probe)
      out[i].attachment = Attachment::adopt(regs[i].probe, *requests[i].consumer);
    else
      out[i].error = std::move(regs[i].error);
  }
  return out;
}

std::vector<std::optional<Error>> detach_all(std::span<Attachment> attachments) {
  std::vector<ProbeConsumer> pairs;
  std::vector<std::size_t> where;
  pairs.reserve(attachments.size());
  for (std::size_t i = 0; i < attachments.size(); ++i) {
    if (!attachments[i].probe()) continue;
    pairs.push_back(ProbeConsumer{attachments[i].probe(), attachments[i].consumer()});
    where.push_back(i);
  }
  std::vector<std::optional<Error>> errs = unregister_uprobes(pairs);
  std::vector<std::optional<Error>> out(attachments.size());
  for (std::size_t k = 0; k < where.size(); ++k) {
    attachments[where[k]].release();
    out[where[k]] = std::move(errs[k]);
  }
  return out;
}

}  // namespace uprobe
