// SPDX-License-Identifier: MIT
#pragma once
// Return probes: return_instances on a per-thread return stack, the entry-side
// return-address hijack (the kernel's prepare_uretprobe()) and the trampoline
// side (handle_trampoline(), handle_uretprobe_chain()), with the kernel's
// stale-instance rules (arch_uretprobe_is_alive()) for longjmp, and the
// unwinder hand-off for C++ exceptions and backtraces.

#include <cstddef>
#include <cstdint>

#include <atomic>

#include "arch.hpp"
#include "probe.hpp"
#include "ri_pool.hpp"
#include "thread_state.hpp"
#include "uprobe/regs.hpp"

namespace uprobe::detail {

/// Most return consumers recorded for one invocation.
inline constexpr unsigned kMaxReturnConsumers = 10;
/// Hard cap of Config::max_uretprobe_depth.
inline constexpr unsigned kMaxReturnDepth = 4096;

/// One return consumer of one invocation: which consumer (its registration's
/// id, and the consumer itself: called directly while the instance's
/// ConsumerSet is still the uprobe's), and its session cookie.
struct ReturnConsumer {
  std::uint64_t id;
  std::uint64_t cookie;
  Consumer* consumer;
};

/// The kernel's struct return_instance. Allocated from the RiPool.
struct alignas(64) ReturnInstance {
  /// The RiPool's link word (see ri_pool.hpp): never read or written here.
  std::uint64_t pool_link;
  ReturnInstance* next = nullptr;  ///< the next older pending instance of the thread (ReturnStack)
  ProbeHandle* handle = nullptr;  ///< the uprobe, found again at return time without a lookup
  std::uint64_t uprobe_id = 0;    ///< ... and checked to be the same one
  /// The uprobe at entry: used at the return only once the handle still
  /// names it and the id matches (it has no other load to wait for).
  Uprobe* up = nullptr;
  /// The consumer set of the entry hit and its serial: when the uprobe still
  /// has that set at the return, the recorded consumers are called directly.
  const ConsumerSet* cs = nullptr;
  std::uint64_t cs_serial = 0;
  std::uint64_t func = 0;       ///< probed address
  std::uint64_t orig_ret = 0;   ///< the real return address
  std::uint64_t stack = 0;      ///< address of the return-address slot (rsp at entry)
  bool chained = false;         ///< entered through the trampoline (a tail call of a probed function)
  /// While an unwinder runs, the slot holds orig_ret: the return address of
  /// ours it held before (arch::is_return_trampoline()), put back after; 0
  /// otherwise.
  std::uint64_t unhijacked = 0;
  std::uint32_t nconsumers = 0;
  ReturnConsumer consumers[kMaxReturnConsumers];
};
static_assert(sizeof(ReturnInstance) == 384, "one more cache line per instance: check the pool's object size");


/// The pool of return instances (uretprobe_init()), Config::max_uretprobe_depth,
/// and Config::ri_lock = RiLock::global (uretprobe_configure()): what the
/// entry side's inline fast path below reads.
extern std::atomic<RiPool*> g_ri_pool;
extern std::atomic<unsigned> g_ri_max_depth;
extern std::atomic<bool> g_ri_global_lock;
/// Whether a thread keeps a spare instance (ReturnStack::spare): with
/// Config::ri_pool = RiPool::objpool, not with the "before" design's freelist.
extern std::atomic<bool> g_ri_spare;

/// Takes the thread's spare instance, nullptr when it has none. AS-safe.
inline ReturnInstance* take_spare(ReturnStack* rs) noexcept {
  ReturnInstance* ri = rs->spare;
  if (ri && arch::thread_compare_exchange(reinterpret_cast<std::uint64_t*>(&rs->spare),
                                          reinterpret_cast<std::uint64_t>(ri), 0))
    return ri;
  return nullptr;
}

/// An instance from the pool (ri_alloc() when the thread has no spare), or
/// nullptr (pool exhausted). AS-safe.
ReturnInstance* ri_alloc_from_pool() noexcept;

/// A fresh instance for an entry hit, or nullptr (pool exhausted): the
/// thread's spare, else one from the pool. AS-safe.
inline ReturnInstance* ri_alloc() noexcept {
  ReturnInstance* ri = take_spare(&t_state.rstack);
  if (__builtin_expect(!ri, 0)) ri = ri_alloc_from_pool();
  if (ri) {
    ri->nconsumers = 0;
    ri->chained = false;
    ri->unhijacked = 0;
  }
  return ri;
}
/// Gives back an instance that was not pushed. AS-safe.
void ri_free(ReturnInstance* ri) noexcept;

/// The thread's return stack on its first use (arms the thread-exit hook).
/// AS-safe.
ReturnStack* return_stack_first_use() noexcept;
/// The thread-exit hook's part for `rs`, the exiting thread's return stack
/// (armed: ReturnStack::exit_hook): drops its instances whose frames are
/// gone, gives its cached ones back. Called by thread_state.cpp's hook.
void return_stack_thread_exit(ReturnStack* rs) noexcept;
/// True when `sp` and the slot at `slot` are on different stacks (the
/// sigaltstack, or another task sharing this thread's TLS): their addresses
/// then say nothing about frame order. AS-safe (two system calls).
bool different_stacks(std::uint64_t sp, std::uint64_t slot) noexcept;

/// Fills `ri` for the hit of `up` at the entry `regs` (the real return
/// address `orig`, read at `slot`; `chained`: a tail call's) and pushes it on
/// `rs`: prepare_uretprobe()'s fast path and prepare_uretprobe_slow() (under
/// its bookkeeping lock). AS-safe.
inline void push_instance(ReturnStack* rs, ReturnInstance* ri, Uprobe* up, const Regs& regs, std::uint64_t orig,
                          std::uint64_t slot, bool chained) noexcept {
  ri->handle = up->handle;
  ri->uprobe_id = up->id;
  ri->up = up;
  ri->func = regs.rip;
  ri->orig_ret = orig;
  ri->stack = slot;
  ri->chained = chained;
  ri->next = rs->top;
  std::atomic_signal_fence(std::memory_order_release);
  rs->top = ri;  // (a signal handler's hits in between push and pop in balance)
  rs->depth = rs->depth + 1;
}

/// prepare_uretprobe() in every case (stale instances, chains, the depth
/// limit, the global bookkeeping lock, the thread's first instance).
bool prepare_uretprobe_slow(Uprobe* up, const Regs& regs, ReturnInstance* ri) noexcept;

/// Hijacks the return address at regs.rsp and pushes `ri` (filled with its
/// consumers) on the thread's return stack; frees it and counts a miss when
/// the depth limit is reached. A slot that holds one of our return addresses
/// already (a tail call of a probed function: the instance is chained) is
/// left as it is. Returns true when it wrote the return trampoline into the
/// slot (an optimized entry may then turn that into its predicted return:
/// arch::opt_frame_leave()). Inline for the common case (no instance to drop,
/// no chain, below the depth limit); the others go to
/// prepare_uretprobe_slow(). Entry side, signal context. AS-safe.
inline bool prepare_uretprobe(Uprobe* up, const Regs& regs, ReturnInstance* ri) noexcept {
  ReturnStack* rs = &t_state.rstack;
  const std::uint64_t slot = arch::return_address_slot(regs);
  const std::uint64_t orig = arch::read_return_address(slot);
  ReturnInstance* const top = rs->top;
  // (An instance below is alive: its slot above this one, the kernel's
  // arch_uretprobe_is_alive(RP_CHECK_CALL).)
  if (__builtin_expect(!rs->exit_hook || arch::is_return_trampoline(orig) || (top && slot >= top->stack) ||
                           rs->depth >= g_ri_max_depth.load(std::memory_order_relaxed) ||
                           g_ri_global_lock.load(std::memory_order_relaxed),
                       0))
    return prepare_uretprobe_slow(up, regs, ri);
  push_instance(rs, ri, up, regs, orig, slot, false);
  arch::hijack_return_address(slot, arch::return_trampoline_address());
  return true;
}

/// The kernel's handle_trampoline(): pops the returning invocation's return
/// instance(s), runs the ret_handlers on f->regs (rip = the real return
/// address, rsp = `sp`), preserving the vector and x87 state around those
/// that may use it (ConsumerSet::ret_save) unless `kernel_saved`, and puts
/// the address to continue at in f->ret_slot. `sp` is the stack pointer
/// after the return (the trampoline's frame: &f->ret_slot + 8; the SIGTRAP
/// handler, for a program single-stepping into the trampoline: the
/// ucontext's, with `kernel_saved`). AS-safe.
void ret_dispatch(arch::RetFrame* f, std::uint64_t sp, bool kernel_saved) noexcept;

/// In a fork child: release pool locks a vanished thread may have held.
void uretprobe_after_fork_child() noexcept;

/// Process-wide set-up (pool, thread-exit key). Registry mutex held.
void uretprobe_init();

/// Before a consumer with a ret_handler is attached: grows the pool of
/// return instances (never grown by a hit) to 64 per thread running now,
/// plus room for 64 more threads, at least 4096. Registry mutex held; not
/// async-signal-safe (reads /proc/self/stat, may mmap).
void uretprobe_reserve();

/// Applies Config::ri_pool / ri_lock / max_uretprobe_depth.
void uretprobe_configure(unsigned ri_pool, unsigned ri_lock, unsigned max_depth) noexcept;

}  // namespace uprobe::detail
