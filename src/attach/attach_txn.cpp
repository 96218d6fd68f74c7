// SPDX-License-Identifier: MIT
// The one attach path (attach_txn.hpp): the transaction that runs the steps
// of the kernel's uprobe_register()/uprobe_unregister(),
// install_breakpoint()/remove_breakpoint() and uprobe_mmap() (txn_steps.cpp,
// each written once) for one request or many.

#include "attach_txn.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <tuple>

#include "arch.hpp"
#include "sites.hpp"
#include "thread_state.hpp"
#include "txn_steps.hpp"
#include "uretprobe.hpp"
#include "forbidden.hpp"
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
  const pid_t me = current_tid();
  for (pid_t free = 0; !up->patch_lock.compare_exchange_weak(free, me, std::memory_order_acquire); free = 0)
    arch::cpu_relax();
}
void PatchLock::unlock(Uprobe* up) noexcept { up->patch_lock.store(0, std::memory_order_release); }

namespace {

constexpr std::size_t kNotFresh = ~std::size_t{0};

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
  // (Never a dynamic-linker call with it held: a thread inside dlopen()
  // whose constructor registers a probe holds the dynamic linker's lock and
  // waits for the registry mutex.)
  lock_ = std::unique_lock<ForkHeldMutex>(r_.mutex, std::defer_lock);
  lock_registry(lock_);
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
  std::unique_ptr<Registration> reg = make_registration(*q.consumer, clobbers_memo_);
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
