// SPDX-License-Identifier: MIT
// The consumer chain shared by the int3 path and the optimized path (the
// kernel's handler_chain() and unapply_uprobe() on UPROBE_HANDLER_REMOVE).

#include "dispatch.hpp"

#include "rcu.hpp"
#include "sanitize.hpp"

#include "arch.hpp"
#include "hot.hpp"

#include "services.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"

namespace uprobe::detail {

namespace {

bool all_removed(const ConsumerSet* cs) noexcept {
  if (!cs || cs->regs.empty()) return false;
  for (const Registration* r : cs->regs)
    if (!r->removed.load(std::memory_order_relaxed)) return false;
  return true;
}

/// Every consumer said Action::remove: take the breakpoint out (the kernel's
/// unapply_uprobe()). Only try-locks, so it never waits on the registry.
void try_unapply(Uprobe* up) noexcept {
  pid_t free = 0;
  if (!up->patch_lock.compare_exchange_strong(free, current_tid(), std::memory_order_acquire)) return;
  if (up->applied && all_removed(up->consumers.load(std::memory_order_acquire))) {
    const SiteSet* ss = up->sites.load(std::memory_order_acquire);
    if (ss) restore_sites(up, *ss);
    up->applied = false;
  }
  up->patch_lock.store(0, std::memory_order_release);
}

/// Arms the return probe of this hit with the registers as they were at the
/// function's entry: rip = the probed address for the while (no copy of the
/// Regs), then the handlers' rip back. prepare_uretprobe()'s answer: whether
/// it put the return trampoline into a slot that held none of ours.
static inline __attribute__((always_inline)) bool arm_return(Uprobe* up, Regs& regs, std::uint64_t func,
                                                             ReturnInstance* ri) noexcept {
  const std::uint64_t rip = regs.rip;
  regs.rip = func;
  const bool hijacked = prepare_uretprobe(up, regs, ri);
  regs.rip = rip;
  return hijacked;
}
}  // namespace

namespace {

/// A return instance for the consumers of `cs` that want this hit's return
/// (it names the set: the return calls them without a lookup), or nullptr
/// when the pool has none free.
static inline __attribute__((always_inline)) ReturnInstance* ri_for(const ConsumerSet* cs) noexcept {
  ReturnInstance* ri = ri_alloc();
  if (ri) {
    ri->cs = cs;
    ri->cs_serial = cs->serial;
  }
  return ri;
}

/// One run of the consumer loop: its inputs, and what it leaves to do after.
struct ChainRun {
  Uprobe* up;
  Regs* regs;
  const ConsumerSet* cs;
  bool saved;          ///< the vector state is saved (or the kernel saved it) around this run
  ReturnInstance* ri;  ///< the return instance to arm, if any consumer wants the return
  bool remove;         ///< every consumer said Action::remove
  /// Only what the consumers' code was read to clobber is saved
  /// (ConsumerSet::entry_sse): a handler not among the code read runs with
  /// the full save around it (run_handler()).
  bool sse = false;
};

struct FilterCall {
  Consumer* consumer;
  bool pass;
};

void filter_preserving(void* p) {
  auto* f = static_cast<FilterCall*>(p);
  f->pass = f->consumer->filter(current_tid());
}

/// Whether `r`'s consumer takes this hit: its filter() is called unless it
/// is still the `return true;` seen at registration. A consumer whose class
/// changed since (registered from a base-class constructor) may have a
/// filter of its own now, which the save decided at registration did not
/// count: it runs with the state saved around it.
static inline __attribute__((always_inline)) bool filter_passes(const ChainRun& c, const Registration& r,
                                                                Consumer* con) noexcept {
  const void* code = filter_code(*con);
  if (__builtin_expect(code == r.trivial_filter, 1)) return true;
  if (!r.trivial_filter || c.saved || con->vector_state_unused()) return con->filter(current_tid());
  FilterCall f{con, true};
  arch::call_preserving(c.up->function_entry ? arch::SaveMode::entry : arch::SaveMode::full, filter_preserving, &f);
  return f.pass;
}

struct HandlerCall {
  Consumer* consumer;
  Regs* regs;
  Action action;
};

void handler_preserving(void* p) {
  auto* h = static_cast<HandlerCall*>(p);
  h->action = h->consumer->handler(*h->regs);
}

/// `con`'s handler. Under an SSE-only save (ChainRun::sse), a consumer whose
/// handler is not the code read at registration (its class changed since:
/// registered from a base-class constructor) gets the save mode's
/// preservation around it.
static inline __attribute__((always_inline)) Action run_handler(const ChainRun& c, Consumer* con) noexcept {
  if (__builtin_expect(!c.sse || con->vector_state_unused() || c.cs->sse_code(handler_code(*con)), 1))
    return con->handler(*c.regs);
  HandlerCall h{con, c.regs, Action::keep};
  arch::call_preserving(c.up->function_entry ? arch::SaveMode::entry : arch::SaveMode::full, handler_preserving, &h);
  return h.action;
}

/// The consumers of one hit (the kernel's handler_chain() loop): filters,
/// entry handlers with their session cookies, Action::remove, and the
/// return instance for the consumers that want the return.
static inline __attribute__((always_inline)) void run_consumers(ChainRun& c) noexcept {
  ThreadState& ts = t_state;
  bool remove = !c.cs->regs.empty();
  ReturnInstance* ri = nullptr;
  bool ri_failed = false;
  for (Registration* r : c.cs->regs) {
    if (r->removed.load(std::memory_order_relaxed)) continue;
    Consumer* con = r->consumer;
    if (!filter_passes(c, *r, con)) {
      remove = false;
      continue;
    }
    std::uint64_t cookie = 0;
    Action rc = Action::keep;
    if (r->has_entry) {
      ts.cookie = &cookie;
      rc = run_handler(c, con);
      ts.cookie = nullptr;
    }
    if (rc == Action::remove)
      r->removed.store(true, std::memory_order_relaxed);
    else
      remove = false;
    if (!r->has_ret || rc == Action::remove || rc == Action::ignore) continue;
    if (!ri && !ri_failed) {
      ri = ri_for(c.cs);
      ri_failed = ri == nullptr;
    }
    if (ri && ri->nconsumers < kMaxReturnConsumers)
      ri->consumers[ri->nconsumers++] = ReturnConsumer{r->id, cookie, con};
    else
      count(stat_block().return_misses);
  }
  c.ri = ri;
  c.remove = remove;
}

/// sole_consumer()'s handler call: the cookie, the faults' state (not for
/// kMaybeFaultsFatal false: sole_entry_hit()), the SSE-only save (in its own
/// scope: an AddressSanitizer build poisons and unpoisons the save's stack
/// memory through libc's memset, whose AVX-512 form writes zmm16-31 and k
/// registers, which a consumer that saves nothing must find as the program
/// left them).
template <bool kMaybeFaultsFatal = true>
static inline __attribute__((always_inline)) Action sole_handler(Uprobe* up, Regs& regs, const ConsumerSet* cs,
                                                                 Consumer* con, bool sse,
                                                                 std::uint64_t& cookie) noexcept {
  ThreadState& ts = t_state;
  FaultsFatalScope fatal(kMaybeFaultsFatal && up->faults_fatal);
  ts.cookie = &cookie;
  Action rc;
  if (sse) {
    arch::SseSave s;
    arch::sse_save(cs->entry_sse, s);
    rc = con->handler(regs);
    arch::sse_restore(cs->entry_sse, s);
  } else {
    rc = con->handler(regs);
  }
  ts.cookie = nullptr;
  return rc;
}

/// The hit of a set of one consumer (the common case) without
/// run_consumers()'s bookkeeping: the same steps for that consumer (removed,
/// filter, cookie, handler, Action::remove, the return instance it wants)
/// when its filter is still the trivial one and nothing beyond the general
/// registers or an SSE-only save of its code as read is needed. Returns
/// false, having done nothing, when any of that does not hold:
/// run_consumers() then takes the hit. `ri`: the return instance to arm.
static inline __attribute__((always_inline)) bool sole_consumer(Uprobe* up, Regs& regs, const ConsumerSet* cs,
                                                                arch::SaveMode save, ReturnInstance*& ri) noexcept {
  Registration* const r = cs->regs.front();
  if (r->removed.load(std::memory_order_relaxed)) return false;
  Consumer* const con = r->consumer;
  if (filter_code(*con) != r->trivial_filter || !r->trivial_filter) return false;
  const bool sse = save != arch::SaveMode::none;
  if (sse && (cs->entry_sse == kSseUnknown || (!con->vector_state_unused() && !cs->sse_code(handler_code(*con)))))
    return false;
  std::uint64_t cookie = 0;
  if (__builtin_expect(!r->has_ret, 1)) {  // an entry probe (has_entry)
    if (sole_handler(up, regs, cs, con, sse, cookie) == Action::remove) {
      r->removed.store(true, std::memory_order_relaxed);
      try_unapply(up);
    }
    return true;
  }
  const Action rc = r->has_entry ? sole_handler(up, regs, cs, con, sse, cookie) : Action::keep;
  if (rc == Action::remove) {
    r->removed.store(true, std::memory_order_relaxed);
    try_unapply(up);
  } else if (rc != Action::ignore) {
    ri = ri_for(cs);
    if (ri) ri->consumers[ri->nconsumers++] = ReturnConsumer{r->id, cookie, con};
    else count(stat_block().return_misses);
  }
  return true;
}

/// The hit of a ConsumerSet::sole_entry set on the optimized path: what
/// sole_consumer() does for such a consumer (its filter still the trivial
/// one, sole_handler(): the handler with its cookie and the SSE-only save its
/// code as read needs; Action::remove), every decision that does not depend on the hit
/// taken when the set was made. Inlined into the optimized hit (a call level
/// more, or the consumer loop's code beside it, cost ~4 of its ~32 ticks).
/// Returns false, having done nothing, when the consumer was removed or its
/// class changed since (another filter, or another handler where a save is
/// needed): sole_consumer() and the consumer loop then take the hit.
static inline __attribute__((always_inline)) bool sole_entry_hit(Uprobe* up, Regs& regs,
                                                                 const ConsumerSet* cs) noexcept {
  Registration* const r = cs->sole_entry;
  Consumer* const con = r->consumer;
  if (r->removed.load(std::memory_order_relaxed) || filter_code(*con) != r->trivial_filter) return false;
  // The save decided at registration (none: a consumer of general registers
  // only, or integer code), also for a consumer that declared
  // set_vector_state_unused() only since (as sole_consumer()).
  unsigned nxmm = 0;
  if (cs->entry_save != arch::SaveMode::none) {
    if (!con->vector_state_unused() && handler_code(*con) != r->handler_code) return false;
    nxmm = cs->entry_sse;
  }
  std::uint64_t cookie = 0;
  // (A sole_entry site is not Uprobe::faults_fatal: no FaultsFatalScope,
  // whose test and live state around the call cost ~3 ticks of ~30.)
  const Action rc = sole_handler<false>(up, regs, cs, con, nxmm != 0, cookie);
  if (__builtin_expect(rc == Action::remove, 0)) {
    r->removed.store(true, std::memory_order_relaxed);
    try_unapply(up);
  }
  return true;
}

/// run_consumers() inside arch::call_preserving().
void run_consumers_preserving(void* c) { run_consumers(*static_cast<ChainRun*>(c)); }

}  // namespace

namespace {
/// chain()'s consumer loop (the kernel's handler_chain()) for a set that
/// sole_entry_hit() and sole_consumer() do not take: the consumers, with the
/// vector and x87 state they may clobber preserved around them per `save`
/// (none on the int3 path: the kernel saved it in its signal frame), then
/// the return probe armed (`func`: the probed address) and Action::remove
/// applied. Out of line: the sole consumer's paths stay small. Returns
/// whether the return probe put the return trampoline into a return slot
/// that held none of ours (prepare_uretprobe()).
__attribute__((noinline)) bool chain_consumers(Uprobe* up, Regs& regs, bool kernel_saved, const ConsumerSet* cs,
                                               arch::SaveMode save, std::uint64_t func) noexcept {
  ChainRun c{up, &regs, cs, kernel_saved || save != arch::SaveMode::none, nullptr, false};
  {
    FaultsFatalScope fatal(up->faults_fatal);
    if (save != arch::SaveMode::none && cs->entry_sse != kSseUnknown) {
      // Only what the consumers' code can clobber (their filters are the
      // trivial one, read at registration: a filter of another class is
      // preserved around, filter_passes()).
      c.saved = false;
      c.sse = true;
      arch::SseSave s;
      arch::sse_save(cs->entry_sse, s);
      run_consumers(c);
      arch::sse_restore(cs->entry_sse, s);
    } else if (save != arch::SaveMode::none) {
      arch::call_preserving(save, run_consumers_preserving, &c);
    } else {
      run_consumers(c);
    }
  }
  const bool hijacked = c.ri && arm_return(up, regs, func, c.ri);
  if (c.remove) try_unapply(up);
  return hijacked;
}
}  // namespace

/// The consumer chain of a hit (the kernel's handler_chain()): an optimized
/// hit of a ConsumerSet::sole_entry set by sole_entry_hit(), a set of one
/// consumer by sole_consumer(), any other by chain_consumers(); then the
/// return probe armed and Action::remove applied. Inlined into both hit
/// paths' callers in this file (one call level less per optimized hit).
/// `kernel_saved`: the int3 path (the kernel saved the vector state in its
/// signal frame). Returns whether the return probe put the return
/// trampoline into a return slot that held none of ours (prepare_uretprobe()).
static inline __attribute__((always_inline)) bool chain(Uprobe* up, Regs& regs, bool kernel_saved) noexcept {
  const ConsumerSet* cs = up->consumers.load(std::memory_order_acquire);
  if (!cs) return false;
  if (!kernel_saved && cs->sole_entry && __builtin_expect(sole_entry_hit(up, regs, cs), 1)) return false;
  const std::uint64_t func = regs.rip;
  const arch::SaveMode save = kernel_saved ? arch::SaveMode::none : effective_save(cs->entry_save);
  if (ReturnInstance* ri = nullptr; __builtin_expect(cs->regs.size() == 1 && sole_consumer(up, regs, cs, save, ri), 1))
    return ri && arm_return(up, regs, func, ri);
  return chain_consumers(up, regs, kernel_saved, cs, save, func);
}

/// chain() for a hit inside an interposer's call (ArgView): the consumers
/// see the program's values where the argument registers hold the
/// interposer's; a value a consumer writes becomes the program's; the
/// registers go on with the interposer's.
__attribute__((noinline, cold)) static bool chain_in_arg_view(Uprobe* up, Regs& regs, bool kernel_saved,
                                                              const ArgView& v) noexcept {
  bool shown[2] = {false, false};
  for (unsigned k = 0; k < v.n && k < 2; ++k) {
    std::uint64_t* r = arch::arg_register(regs, v.arg[k]);
    if (r && *r == v.ours[k]) *r = __atomic_load_n(v.program[k], __ATOMIC_RELAXED), shown[k] = true;
  }
  const bool hijacked = chain(up, regs, kernel_saved);
  for (unsigned k = 0; k < v.n && k < 2; ++k) {
    if (!shown[k]) continue;
    std::uint64_t* r = arch::arg_register(regs, v.arg[k]);
    if (*r != __atomic_load_n(v.program[k], __ATOMIC_RELAXED)) __atomic_store_n(v.program[k], *r, __ATOMIC_RELAXED);
    *r = v.ours[k];
  }
  return hijacked;
}

/// chain(), or chain_in_arg_view() inside an interposer's call.
static inline __attribute__((always_inline)) bool thread_chain(Uprobe* up, Regs& regs, bool kernel_saved,
                                                              const ThreadState& ts) noexcept {
  if (__builtin_expect(ts.arg_view != nullptr, 0)) return chain_in_arg_view(up, regs, kernel_saved, *ts.arg_view);
  return chain(up, regs, kernel_saved);
}

namespace {
/// The uprobe of a stub whose descriptor names none (being rebuilt, or a copy
/// read by the single-step path): the lookup by key.
__attribute__((noinline)) Uprobe* find_by_key(const arch::OptSite& site) noexcept {
  const ProbeTable* probes = g_hot.probes.load(std::memory_order_acquire);
  return probes ? probes->find(ProbeKey{static_cast<dev_t>(site.key[0]), static_cast<ino_t>(site.key[1]),
                                        site.key[2]})
                : nullptr;
}
}  // namespace

namespace {
/// Returns chain()'s answer (false when no chain ran).
static inline __attribute__((always_inline)) bool optimized_hit_inline(const arch::OptSite& site, Regs& regs,
                                                                           bool kernel_saved) noexcept {
  HotPathScope hot;
  StatBlock& st = stat_block();
  count(st.optimized);  // (Stats::hits adds it)
  rcu_read_lock_hot();
  // The stub's owner is valid inside this read-side section: the registry
  // clears it before the uprobe's grace period (forget_references()).
  Uprobe* up = reinterpret_cast<Uprobe*>(__atomic_load_n(&site.owner, __ATOMIC_ACQUIRE));
#if UPROBE_TSAN
  // The owner was written through the XOL alias (sites.cpp, after
  // tsan_publish_stub()): acquire after the load, which may see a stub rebuilt
  // for the next probe at this site while this thread was inside it.
  __tsan_acquire(const_cast<std::uint64_t*>(&site.owner));
#endif
  if (__builtin_expect(up == nullptr, 0)) up = find_by_key(site);
  bool hijacked = false;
  if (up) {
    ThreadState& ts = t_state;
    if (__builtin_expect((ts.depth | ts.runtime_calls) == 0, 1)) {
      ts.depth = 1;
      ts.guard_sp = regs.rsp;
      hijacked = thread_chain(up, regs, kernel_saved, ts);
      ts.depth = 0;
    } else if (ts.depth != 0) {
      recursion_miss(st, up);
    }  // (else libuprobe's own call: RuntimeCallScope)
  }
  if (regs.rip != site.site) count(st.redirected);
  rcu_read_unlock_hot();
  return hijacked;
}
}  // namespace

void optimized_hit(const arch::OptSite& site, Regs& regs, bool kernel_saved) noexcept {
  optimized_hit_inline(site, regs, kernel_saved);
}

void guarded_handler_chain(Uprobe* up, Regs& regs) noexcept {
  ThreadState& ts = t_state;
  if (__builtin_expect((ts.depth | ts.runtime_calls) == 0, 1)) {
    ts.depth = 1;
    ts.guard_sp = regs.rsp;
    thread_chain(up, regs, true, ts);
    ts.depth = 0;
  } else if (ts.depth != 0) {
    recursion_miss(stat_block(), up);
  }  // (else libuprobe's own call: RuntimeCallScope)
}

}  // namespace uprobe::detail

namespace {

/// uprobe_opt_hit() for a frame that is not 8-byte aligned: hand-written code
/// may reach a site with such an rsp, and the stub's frame inherits it. A
/// misaligned Regs is undefined behaviour (UBSan's alignment check), in the
/// consumers' handlers too: they get an aligned copy, written back after.
UPROBE_OPT_PATH_TEXT __attribute__((noinline, cold)) void opt_hit_misaligned(std::uint64_t* frame,
                                                        const uprobe::arch::OptSite* site) noexcept {
  using namespace uprobe;
  Regs regs;
  arch::copy_words(&regs, frame, sizeof(Regs) / 8);  // no libc memcpy: no vector register
  const arch::OptFrameSaved saved = arch::opt_frame_enter(regs, *site);
  const bool hijacked = detail::optimized_hit_inline(*site, regs, false);
  arch::opt_frame_leave(frame, regs, *site, saved, hijacked);  // the target slot is above the 18 words
  arch::copy_words(frame, &regs, sizeof(Regs) / 8);
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) UPROBE_OPT_PATH_TEXT void uprobe_opt_hit(std::uint64_t* frame,
                                                                     const uprobe::arch::OptSite* site) noexcept {
  using namespace uprobe;
  static_assert(sizeof(Regs) == 18 * 8);
  if (__builtin_expect(reinterpret_cast<std::uintptr_t>(frame) % alignof(Regs) != 0, 0))
    return opt_hit_misaligned(frame, site);
  Regs& regs = *reinterpret_cast<Regs*>(frame);
  const arch::OptFrameSaved saved = arch::opt_frame_enter(regs, *site);
  const bool hijacked = detail::optimized_hit_inline(*site, regs, false);
  arch::opt_frame_leave(frame, regs, *site, saved, hijacked);
}
