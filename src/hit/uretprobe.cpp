// SPDX-License-Identifier: MIT
// Return probes, entry and trampoline sides (kernel/events/uprobes.c:
// prepare_uretprobe(), cleanup_return_instances(), handle_trampoline(),
// handle_uretprobe_chain(); arch/x86/kernel/uprobes.c: arch_uretprobe_is_alive()).
// Everything here runs in signal context or in the return trampoline:
// async-signal-safe, no allocation, no system call (the return stack is a
// list in the thread's TLS; return instances come from a pool that hits
// never grow), but the gettid/sigaltstack of the stale-instance check.

#include "raw_syscall.hpp"
#include "uretprobe.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "rcu.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "arch.hpp"
#include "dispatch.hpp"
#include "ri_pool.hpp"
#include "hot.hpp"
#include "thread_state.hpp"

namespace uprobe::detail {

std::atomic<RiPool*> g_ri_pool{nullptr};
std::atomic<unsigned> g_ri_max_depth{64};
std::atomic<bool> g_ri_global_lock{false};
std::atomic<bool> g_ri_spare{true};

namespace {

/// The pool of return instances: none at start, grown before a return
/// consumer is attached to at least kPoolBase, kPoolPerThread per running thread plus
/// room for kPoolSpareThreads more (a thread caches up to 30 free objects,
/// and holds one per pending return), never by a hit.
constexpr std::size_t kPoolBase = 4096, kPoolPerThread = 64, kPoolSpareThreads = 64;

/// Threads of the process now (/proc/self/stat's num_threads), 1 if unknown.
std::size_t running_threads() {
  std::FILE* f = std::fopen("/proc/self/stat", "re");
  if (!f) return 1;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Field 20; the command name (field 2) ends at the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 1;
  int field = 2;
  for (++p; *p && field < 20; ++p)
    if (*p == ' ') ++field;
  const long t = std::strtol(p, nullptr, 10);
  return t > 0 ? static_cast<std::size_t>(t) : 1;
}
[[noreturn]] void fatal(const char* msg) noexcept {
  static const char prefix[] = "libuprobe: fatal: ";
  ssize_t r = ::write(2, prefix, sizeof prefix - 1);
  r = ::write(2, msg, std::strlen(msg));
  r = ::write(2, "\n", 1);
  (void)r;
  ::abort();
}

struct BookkeepingLock {
  BookkeepingLock() noexcept {
    if (g_ri_global_lock.load(std::memory_order_relaxed)) g_ri_pool.load(std::memory_order_relaxed)->bookkeeping_lock();
  }
  ~BookkeepingLock() {
    if (g_ri_global_lock.load(std::memory_order_relaxed)) g_ri_pool.load(std::memory_order_relaxed)->bookkeeping_unlock();
  }
};

/// put()'s way to the pool: the thread has its spare already (or keeps none).
__attribute__((noinline)) void put_to_pool(ReturnStack* rs, ReturnInstance* ri) noexcept {
  RiPool* pool = g_ri_pool.load(std::memory_order_relaxed);
  pool->put(ri);
  if (__builtin_expect(rs->exiting, 0)) pool->thread_exit();  // in its TSD destructors: nothing stays cached
}

/// Gives an instance back: as the thread's spare when it has none (and its
/// exit hook, which gives the spare back, has not run yet), else to the pool
/// (put_to_pool()). Inline: the return path's common case is the spare.
inline __attribute__((always_inline)) void put(ReturnInstance* ri) noexcept {
  ReturnStack* rs = &t_state.rstack;
  if (__builtin_expect(g_ri_spare.load(std::memory_order_relaxed), 1) && !rs->spare && rs->exit_hook &&
      arch::thread_compare_exchange(reinterpret_cast<std::uint64_t*>(&rs->spare), 0,
                                    reinterpret_cast<std::uint64_t>(ri)))
    return;
  put_to_pool(rs, ri);
}

/// The thread's return stack (in its TLS), with the thread-exit hook armed
/// on its first use: pthread_setspecific() of an inline key writes the
/// thread descriptor, no allocation, no system call. The owner is the
/// thread's cached id (a thread created through pthread_create() while
/// libuprobe is loaded has it cached before its own code runs; else this is
/// the gettid of current_tid()'s first use, documented in the README).
ReturnStack* return_stack() noexcept {
  ThreadState& ts = t_state;
  ReturnStack* rs = &ts.rstack;
  if (__builtin_expect(rs->exit_hook, 1)) return rs;
  return return_stack_first_use();
}

}  // namespace

ReturnStack* return_stack_first_use() noexcept {
  ReturnStack* rs = &t_state.rstack;
  if (rs->owner == 0) rs->owner = current_tid();
  arm_thread_exit_hook();  // thread exit drops what is left (return_stack_thread_exit())
  // (In its TSD destructors, after the hook: armed again for the next round,
  // if there is one; the spare stays unused, put() and ri_alloc() flush.)
  rs->exit_hook = !rs->exiting;
  return rs;
}

namespace {

/// Pops the innermost instance (the caller holds the bookkeeping lock when
/// one is in use). A signal handler that interrupts this pushes and pops in
/// balance, leaving top and depth as it found them.
ReturnInstance* pop(ReturnStack* rs) noexcept {
  ReturnInstance* ri = rs->top;
  rs->top = ri->next;
  rs->depth = rs->depth - 1;
  return ri;
}

/// True when `sp` and the slot at `slot` are on different stacks (one of them
/// on the sigaltstack the thread is running on, or the caller is a task
/// sharing this thread's TLS on a stack of its own: a vfork or posix_spawn
/// child, clone(CLONE_VM) without CLONE_THREAD): then their addresses say
/// nothing about frame order and nothing is stale.
}  // namespace

bool different_stacks(std::uint64_t sp, std::uint64_t slot) noexcept {
  // Only on the (rare) path where an instance looks stale: are we the task
  // that owns this return stack, or another one sharing our TLS?
  const ReturnStack& rs = t_state.rstack;
  if (rs.owner != 0 && static_cast<pid_t>(arch::raw_syscall(SYS_gettid)) != rs.owner) return true;
  stack_t ss;
  if (::sigaltstack(nullptr, &ss) != 0 || (ss.ss_flags & SS_DISABLE)) return false;
  auto lo = reinterpret_cast<std::uint64_t>(ss.ss_sp), hi = lo + ss.ss_size;
  bool sp_alt = sp >= lo && sp < hi, slot_alt = slot >= lo && slot < hi;
  return sp_alt != slot_alt;
}

namespace {

/// arch_uretprobe_is_alive(RP_CHECK_CALL / RP_CHECK_CHAIN_CALL): at an entry
/// with return slot `sp`, an instance whose slot is at or below it is gone.
bool alive_at_call(const ReturnInstance* ri, std::uint64_t sp, bool chained) noexcept {
  bool alive = chained ? sp <= ri->stack : sp < ri->stack;
  return alive || different_stacks(sp, ri->stack);
}

/// arch_uretprobe_is_alive(RP_CHECK_RET): at the trampoline with stack
/// pointer `sp` (just past the popped slot).
bool alive_at_ret(const ReturnInstance* ri, std::uint64_t sp) noexcept {
  return sp <= ri->stack || different_stacks(sp, ri->stack);
}

}  // namespace

/// The return stack's part of the thread-exit hook (thread_state.cpp): drops the thread's
/// pending return instances whose frames are gone and returns its cached
/// ones to the pool. The frames that run the thread's exit are still on the
/// stack, above this one (glibc's start_thread and __nptl_deallocate_tsd,
/// which calls the destructors): a return-probed one returns through the
/// trampoline after this, so its instance stays (the kernel frees a task's
/// instances when the task is gone, uprobe_free_utask(); the hook runs
/// before). Without the hook (the program had used up glibc's 32 inline
/// keys before libuprobe loaded: arm_thread_exit_hook()) they stay taken.
void return_stack_thread_exit(ReturnStack* rs) noexcept {
  if (RiPool* pool = g_ri_pool.load(std::memory_order_relaxed)) {
    // Below every live caller's return slot: the frame of this call. (The
    // statistics block only when one is dropped: a later round of the TSD
    // destructors, after the block was given back, claims none for nothing.)
    const auto here = reinterpret_cast<std::uint64_t>(__builtin_frame_address(0));
    while (rs->top && !alive_at_call(rs->top, here, false)) {
      pool->put(pop(rs));
      count(stat_block().return_dropped);
    }
    if (ReturnInstance* spare = take_spare(rs)) pool->put(spare);
    pool->thread_exit();
  }
  rs->exit_hook = false;
  rs->exiting = true;
}

namespace {

/// One instance's ret_handlers: their inputs.
struct RetRun {
  ReturnInstance* ri;
  Regs* regs;
  const ConsumerSet* cs;
  bool sse;  ///< only what the code read at registration clobbers is saved (ConsumerSet::ret_sse)
};

struct RetCall {
  Consumer* consumer;
  Regs* regs;
  std::uint64_t func;
};

void ret_handler_preserving(void* p) {
  auto* h = static_cast<RetCall*>(p);
  h->consumer->ret_handler(*h->regs, h->func);
}

/// `con`'s ret_handler. Under an SSE-only save, one that is not the code
/// read at registration (its class changed since) gets the return's full
/// preservation around it.
static inline __attribute__((always_inline)) void call_ret_handler(const RetRun& c, Consumer* con) noexcept {
  if (__builtin_expect(!c.sse || con->vector_state_unused() || c.cs->sse_code(ret_handler_code(*con)), 1)) {
    con->ret_handler(*c.regs, c.ri->func);
    return;
  }
  RetCall h{con, c.regs, c.ri->func};
  arch::call_preserving(arch::SaveMode::ret, ret_handler_preserving, &h);
}

/// A recorded consumer's ret_handler with its session cookie, called
/// directly (no save of its own).
static inline __attribute__((always_inline)) void call_recorded(ReturnConsumer& rc, Regs& regs,
                                                                std::uint64_t func) noexcept {
  ThreadState& ts = t_state;
  ts.cookie = &rc.cookie;
  rc.consumer->ret_handler(regs, func);
  ts.cookie = nullptr;
}

/// handle_uretprobe_chain(): the ret_handlers of one instance. Each recorded
/// consumer that is still registered: while the uprobe has the consumer set
/// of the entry hit (pointer and serial), all of them (only consumers with
/// a ret_handler are recorded), called through the pointers recorded at
/// entry; else each found by its registration's id in the set of now.
static inline __attribute__((always_inline)) void run_ret_consumers(const RetRun& c) noexcept {
  ThreadState& ts = t_state;
  if (__builtin_expect(c.cs == c.ri->cs && c.cs->serial == c.ri->cs_serial, 1)) {
    for (std::uint32_t i = 0; i < c.ri->nconsumers; ++i) {
      ReturnConsumer& rc = c.ri->consumers[i];
      ts.cookie = &rc.cookie;
      call_ret_handler(c, rc.consumer);
      ts.cookie = nullptr;
    }
    return;
  }
  for (std::uint32_t i = 0; i < c.ri->nconsumers; ++i) {
    ReturnConsumer& rc = c.ri->consumers[i];
    for (Registration* r : c.cs->regs) {
      if (r->id != rc.id) continue;
      if (r->has_ret) {
        ts.cookie = &rc.cookie;
        call_ret_handler(c, r->consumer);
        ts.cookie = nullptr;
      }
      break;
    }
  }
}

/// run_ret_consumers() inside arch::call_preserving().
void run_ret_consumers_preserving(void* c) { run_ret_consumers(*static_cast<const RetRun*>(c)); }

/// The ret_handlers of one instance, with what they may clobber preserved
/// unless the kernel saved it. The instance names its uprobe: no lookup.
static inline __attribute__((always_inline)) void run_ret_handlers(ReturnInstance* ri, Regs& regs,
                                                                   bool kernel_saved) noexcept {
  // Cleared before the uprobe's grace period (forget_references()): non-null
  // here, inside the read-side section, it stays valid until the section ends.
  // The uprobe recorded at entry is used once the handle names it (no load
  // of the handle's to wait for); the id tells it from a later uprobe at the
  // same address that got the same handle.
  Uprobe* const up = ri->up;
  if (!ri->handle || ri->handle->up.load(std::memory_order_acquire) != up || up->id != ri->uprobe_id)
    return;  // unregistered meanwhile
  const ConsumerSet* cs = up->consumers.load(std::memory_order_acquire);
  const arch::SaveMode save = kernel_saved ? arch::SaveMode::none : effective_save(cs->ret_save);
  const bool sse = save != arch::SaveMode::none && cs->ret_sse != kSseUnknown;
  const RetRun c{ri, &regs, cs, sse};
  FaultsFatalScope fatal(up->faults_fatal);
  // One consumer recorded, the set of the entry hit still the uprobe's (the
  // common case): called without the consumer loop, where that loop would
  // call it directly too (no save, or the SSE-only save of its code as
  // read; a save decided at registration stays for a consumer that declared
  // set_vector_state_unused() only since).
  ReturnConsumer* const one =
      ri->nconsumers == 1 && cs == ri->cs && cs->serial == ri->cs_serial ? &ri->consumers[0] : nullptr;
  if (sse) {
    arch::SseSave s;
    arch::sse_save(cs->ret_sse, s);
    if (one && cs->sse_code(ret_handler_code(*one->consumer)))
      call_recorded(*one, regs, ri->func);
    else
      run_ret_consumers(c);
    arch::sse_restore(cs->ret_sse, s);
  } else if (save != arch::SaveMode::none) {
    arch::call_preserving(save, run_ret_consumers_preserving, const_cast<RetRun*>(&c));
  } else if (one) {
    call_recorded(*one, regs, ri->func);
  } else {
    run_ret_consumers(c);
  }
}

}  // namespace

void uretprobe_after_fork_child() noexcept {
  if (RiPool* p = g_ri_pool.load(std::memory_order_relaxed)) p->after_fork_child();
}

void uretprobe_init() {
  if (g_ri_pool.load(std::memory_order_relaxed)) return;
  create_thread_exit_key();  // normally done already, before main()
  // (Its objects are mapped by the first uretprobe_reserve(), when a return
  // consumer is attached: ~1 MiB, 256 pages, none faulted in by a process
  // with entry probes only.)
  auto* pool = new RiPool(sizeof(ReturnInstance), 0, RiPool::kUnlimited, kPoolBase);
  pool->set_grow_on_get(false);  // a hit never maps memory: uretprobe_reserve() grows it
  g_ri_pool.store(pool, std::memory_order_release);
}

void uretprobe_reserve() {
  RiPool* pool = g_ri_pool.load(std::memory_order_acquire);
  if (!pool) return;
  pool->reserve(std::max(kPoolBase, kPoolPerThread * (running_threads() + kPoolSpareThreads)));
}


void uretprobe_configure(unsigned ri_pool, unsigned ri_lock, unsigned max_depth) noexcept {
  if (RiPool* p = g_ri_pool.load(std::memory_order_relaxed))
    p->set_modes(static_cast<RiPoolMode>(ri_pool), static_cast<RiLockMode>(ri_lock));
  g_ri_global_lock.store(ri_lock != 0, std::memory_order_relaxed);
  g_ri_spare.store(ri_pool == static_cast<unsigned>(RiPoolMode::objpool), std::memory_order_relaxed);
  g_ri_max_depth.store(max_depth < 1 ? 1 : (max_depth > kMaxReturnDepth ? kMaxReturnDepth : max_depth),
                    std::memory_order_relaxed);
}

void ri_free(ReturnInstance* ri) noexcept { put(ri); }

ReturnInstance* ri_alloc_from_pool() noexcept {
  RiPool* pool = g_ri_pool.load(std::memory_order_acquire);
  if (!pool) return nullptr;
  auto* ri = static_cast<ReturnInstance*>(pool->get());
  if (__builtin_expect(t_state.rstack.exiting, 0)) pool->thread_exit();  // (its batch back at once)
  return ri;
}

bool prepare_uretprobe_slow(Uprobe* up, const Regs& regs, ReturnInstance* ri) noexcept {
  StatBlock& st = stat_block();
  ReturnStack* rs = return_stack();
  const std::uint64_t slot = arch::return_address_slot(regs);
  std::uint64_t orig = arch::read_return_address(slot);
  const bool chained = arch::is_return_trampoline(orig);
  {
    BookkeepingLock lock;
    // cleanup_return_instances(): longjmp left these behind.
    while (rs->top && !alive_at_call(rs->top, slot, chained)) {
      put(pop(rs));
      count(st.return_dropped);
    }
    if (chained) {
      if (!rs->top) {  // our trampoline, but no instance: nothing to chain to
        count(st.return_misses);
        put(ri);
        return false;
      }
      orig = rs->top->orig_ret;
    }
    if (rs->depth >= g_ri_max_depth.load(std::memory_order_relaxed)) {
      count(st.return_misses);
      put(ri);
      return false;
    }
    push_instance(rs, ri, up, regs, orig, slot, chained);
  }
  // Chained: the slot returns to us already (the trampoline, or the landing
  // whose call the return stack buffer holds: kept, the return stays predicted).
  if (chained) return false;
  arch::hijack_return_address(slot, arch::return_trampoline_address());
  return true;
}

}  // namespace uprobe::detail

using namespace uprobe::detail;

namespace {
/// uprobe_ret_dispatch() for a frame not 8-byte aligned (returned to with
/// such an rsp by hand-written code): the handlers get an aligned copy (a
/// misaligned Regs is undefined behaviour).
__attribute__((noinline, cold)) void ret_dispatch_misaligned(uprobe::arch::RetFrame* f, std::uint64_t sp) noexcept {
  uprobe::arch::RetFrame copy;
  std::memcpy(&copy, f, sizeof copy);
  ret_dispatch(&copy, sp, false);
  std::memcpy(f, &copy, sizeof copy);
}
}  // namespace

/// Called by the return trampoline (through arch's uprobe_ret_entry()) with
/// its saved frame. The kernel's handle_trampoline().
extern "C" __attribute__((visibility("hidden"))) void uprobe_ret_dispatch(uprobe::arch::RetFrame* f) noexcept {
  const std::uint64_t sp = uprobe::arch::ret_frame_sp(f);
  if (__builtin_expect(reinterpret_cast<std::uintptr_t>(f) % alignof(uprobe::arch::RetFrame) != 0, 0))
    return ret_dispatch_misaligned(f, sp);
  ret_dispatch(f, sp, false);  // a tail call
}

namespace uprobe::detail {

namespace {

/// Runs the ret_handlers of `ri` on the frame's registers as the thread's
/// one hit in progress (depth 1: a signal's hits meanwhile are recursion
/// misses; return_xmm() reads the frame's xmm0/xmm1), and counts the return.
static inline __attribute__((always_inline)) void run_counted(ThreadState& ts, arch::RetFrame* f, ReturnInstance* ri,
                                                              Regs& regs, bool kernel_saved, StatBlock& st) noexcept {
  ts.depth = 1;
  ts.guard_sp = regs.rsp;
  ts.xmm = f->xmm0;
  run_ret_handlers(ri, regs, kernel_saved);
  ts.xmm = nullptr;
  ts.depth = 0;
  count(st.return_hits);
}

/// One instance returning (the instance below it alive, no chain, no
/// recursion, no global bookkeeping lock: every return but the rare ones):
/// ret_dispatch()'s loop for that case, the instance `top` popped before its
/// handlers run, as the kernel does.
static inline __attribute__((always_inline)) void ret_one(arch::RetFrame* f, ReturnStack* rs, ReturnInstance* top,
                                                          bool kernel_saved, StatBlock& st) noexcept {
  ThreadState& ts = t_state;
  Regs& regs = f->regs;
  const std::uint64_t target = top->orig_ret;
  f->ret_slot = target;  // unwinding from a ret_handler sees the real caller
  regs.rip = target;
  pop(rs);
  run_counted(ts, f, top, regs, kernel_saved, st);
  put(top);
}

/// ret_dispatch()'s general case: chains, stale instances, recursion, the
/// global bookkeeping lock.
__attribute__((noinline)) void ret_chain(arch::RetFrame* f, std::uint64_t sp, bool kernel_saved,
                                         StatBlock& st) noexcept {
  ThreadState& ts = t_state;
  ReturnStack* rs = &ts.rstack;
  uprobe::Regs& regs = f->regs;
  for (;;) {
    if (!rs->top) fatal("return trampoline: every pending return instance was stale");
    // The chain returning now: the innermost instance and the chained ones
    // (tail calls of probed functions) down to the first that is not.
    ReturnInstance* const top = rs->top;
    ReturnInstance* bottom = top;
    while (bottom->chained && bottom->next) bottom = bottom->next;
    // The chain returning now is valid if the instance below it is still
    // alive; otherwise longjmp skipped the chain: drop it and look again.
    bool valid = !bottom->next || alive_at_ret(bottom->next, sp);
    const std::uint64_t target = top->orig_ret;
    f->ret_slot = target;  // unwinding from a ret_handler sees the real caller
    regs.rip = target;
    for (bool last = false; !last;) {
      ReturnInstance* ri;
      {
        BookkeepingLock lock;
        ri = pop(rs);  // popped before the handlers run, as the kernel does
      }
      last = ri == bottom;
      if (valid && ts.depth == 0) {
        run_counted(ts, f, ri, regs, kernel_saved, st);
      } else if (valid) {
        recursion_miss(st, nullptr);
      } else {
        count(st.return_dropped);
      }
      put(ri);
    }
    if (valid) break;
  }
}

}  // namespace

void ret_dispatch(arch::RetFrame* f, std::uint64_t sp, bool kernel_saved) noexcept {
  HotPathScope hot;
  ThreadState& ts = t_state;
  StatBlock& st = stat_block();
  ReturnStack* rs = &ts.rstack;
  ReturnInstance* const top = rs->top;
  if (!top) fatal("return trampoline reached with no pending return instance");

  uprobe::Regs& regs = f->regs;  // in place: the handlers' writes land in the frame
  regs.rsp = sp;
  const std::uint64_t flags = regs.rflags;
  rcu_read_lock_hot();
  const ReturnInstance* const below = top->next;
  if (__builtin_expect(!top->chained && ts.depth == 0 && (!below || sp <= below->stack) &&
                           !g_ri_global_lock.load(std::memory_order_relaxed),
                       1))
    ret_one(f, rs, top, kernel_saved, st);
  else
    ret_chain(f, sp, kernel_saved, st);
  rcu_read_unlock_hot();
  regs.rflags = arch::merge_handler_flags(flags, regs.rflags);
  f->ret_slot = regs.rip;
}

}  // namespace uprobe::detail

namespace uprobe {

std::uint64_t& session_cookie() noexcept {
  static __thread std::uint64_t scratch __attribute__((tls_model("initial-exec")));
  std::uint64_t* c = t_state.cookie;
  return c ? *c : scratch;
}

std::uint8_t* return_xmm(unsigned i) noexcept {
  static __thread std::uint8_t scratch[32] __attribute__((tls_model("initial-exec")));
  std::uint8_t* x = t_state.xmm ? t_state.xmm : scratch;
  return x + (i ? 16 : 0);
}

const void* return_trampoline() noexcept { return reinterpret_cast<const void*>(&uprobe_ret_trampoline); }

bool is_return_trampoline(const void* address) noexcept {
  return arch::is_return_trampoline(reinterpret_cast<std::uint64_t>(address));
}

unsigned return_stack_depth() noexcept { return t_state.rstack.depth; }

int fixup_backtrace(void** frames, int n) noexcept {
  const ReturnInstance* ri = t_state.rstack.top;
  int fixed = 0;
  for (int i = 0; i < n && ri; ++i) {
    if (!is_return_trampoline(frames[i])) continue;
    // The innermost pending chain's return address; chained instances share
    // one slot, so the next frame's is below the chain's bottom.
    frames[i] = reinterpret_cast<void*>(ri->orig_ret);
    while (ri->chained && ri->next) ri = ri->next;
    ri = ri->next;
    ++fixed;
  }
  return fixed;
}

}  // namespace uprobe
