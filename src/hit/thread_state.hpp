// SPDX-License-Identifier: MIT
#pragma once
// Per-thread state of the trap path: recursion guard, cached tid, single-step
// bookkeeping and a pointer to the thread's own statistics cache line. All of
// it lives in initial-exec TLS so that the SIGTRAP handler reaches it with no
// allocation and no lock (the kernel keeps the same in struct uprobe_task).

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "arch.hpp"
#include "services.hpp"
#include "uprobe/config.hpp"

namespace uprobe::detail {

/// One thread's counters, alone in its cache line. Only the owning thread
/// writes (one unlocked increment, count()); readers sum all blocks and the
/// counts of exited threads (given back at their exit: claim_stat_block()).
struct alignas(64) StatBlock {
  /// Hits of the int3 path (Stats::hits adds `optimized`: an optimized hit
  /// counts there only, one increment a hit).
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> recursion_misses{0};
  std::atomic<std::uint64_t> emulated{0};
  std::atomic<std::uint64_t> out_of_line{0};
  std::atomic<std::uint64_t> redirected{0};
  std::atomic<std::uint64_t> restarts{0};
  std::atomic<std::uint64_t> locked_lookups{0};
  std::atomic<std::uint64_t> foreign_traps{0};
  std::atomic<std::uint64_t> return_hits{0};
  std::atomic<std::uint64_t> return_misses{0};
  std::atomic<std::uint64_t> return_dropped{0};
  std::atomic<std::uint64_t> optimized{0};
  /// The probe address the SIGTRAP handler is handling on this thread, 0 when
  /// it is not in it: read by a writer converting an entry (a thread stopped
  /// in our handler has not decided yet whether it resumes inside a window).
  /// Threads beyond the pool share one block: there it is approximate.
  std::atomic<std::uint64_t> trap_ip{0};
};

struct ReturnInstance;

/// A thread's pending return instances (the kernel's
/// utask->return_instances): a list through ReturnInstance::next, innermost
/// first, in the thread's own TLS, so that a hit has nothing to allocate.
struct ReturnStack {
  ReturnInstance* top;  ///< innermost pending instance; nullptr when none
  std::uint32_t depth;  ///< instances on the list
  /// Kernel thread id of the thread that owns these instances (0 until its
  /// first one). A task that shares our memory and TLS without being this
  /// thread (a vfork/posix_spawn child, clone(CLONE_VM) without
  /// CLONE_THREAD) sees the owner's instances but must never drop them as
  /// stale: its stack says nothing about theirs.
  pid_t owner;
  bool exit_hook;  ///< the thread-exit hook (uretprobe.cpp) is armed for this thread
  /// The exit hook has run: the thread is in its TSD destructors, whose
  /// last round no hook follows. Its instances skip the spare and the
  /// pool's thread cache (each get and put flushes it), so that a return
  /// probe a later destructor hits leaves nothing cached behind.
  bool exiting;
  /// One free return instance kept by the thread for its next entry hit
  /// (taken and given back by arch::thread_compare_exchange(): a signal
  /// handler's hit in between finds it taken or not, never both), before the
  /// pool's per-thread cache; nullptr when none. uretprobe.hpp, ri_alloc().
  ReturnInstance* spare;
};

/// Increments a counter owned by the calling thread, in one instruction: a
/// signal handler's hit on the same thread, between the read and the write of
/// a load-add-store, would otherwise lose its increment (or this one).
/// Async-signal-safe.
inline void count(std::atomic<std::uint64_t>& c) noexcept {
  static_assert(sizeof(std::atomic<std::uint64_t>) == sizeof(std::uint64_t));
  arch::thread_counter_increment(reinterpret_cast<std::uint64_t*>(&c));
}

/// The RecursionMissHook (config.hpp), nullptr when none.
extern std::atomic<RecursionMissHook> g_recursion_miss_hook;

/// A hit not run because its thread is inside another: counted in `st`, and
/// the hook told (`probe`: nullptr for a return). Async-signal-safe.
inline void recursion_miss(StatBlock& st, const Uprobe* probe) noexcept {
  count(st.recursion_misses);
  if (const RecursionMissHook hook = g_recursion_miss_hook.load(std::memory_order_acquire)) hook(probe);
}

/// Arguments a call made by one of libuprobe's interposers passes in place
/// of the program's own (interpose/thread_start.cpp: the start routine and
/// argument its pthread_create() hands on): while a thread has one
/// (ThreadState::arg_view), its hits show their consumers the program's
/// values in the argument registers that hold the interposer's -- what the
/// kernel's uprobes show, with no interposer in between -- and a consumer's
/// write to one becomes the program's value (`*program[k]`, which the
/// interposer's call reads). Set and cleared by the interposer around its
/// call, on its own thread: async-signal-safe (a signal handler's nested
/// call keeps the outer one's and puts it back).
struct ArgView {
  unsigned n;                  ///< substitutions (at most 2)
  unsigned arg[2];             ///< SysV integer argument numbers
  std::uint64_t ours[2];       ///< what the interposer passes
  std::uint64_t* program[2];   ///< what the program passed (__atomic accesses)
};

struct ThreadState {
  int depth;                 ///< >0 while a handler of ours runs on this thread
  int hot;                   ///< >0 while this thread is on a hot path (HotPathScope)
  int runtime_calls;         ///< >0 while libuprobe's own work runs on this thread (RuntimeCallScope)
  const ArgView* arg_view;   ///< an interposer's call in progress on this thread (ArgView), else nullptr
  const void* trap_uc;       ///< ucontext of the last int3 hit (live until its sigreturn; stale after)
  pid_t tid;                 ///< cached gettid(), 0 = not yet known (reset in a fork child)
  StatBlock* stats;          ///< this thread's counters, claimed on first use
  bool stats_given_back;     ///< the thread-exit hook gave its block back: later hits count in the overflow block
  bool sstep_active;         ///< single-step of an XOL copy in flight
  bool wstep_active;         ///< a self-stepping program runs an entry probe's window slot
  std::uint64_t wstep_lo;    ///< that window slot [wstep_lo, wstep_hi): its steps are not the program's
  std::uint64_t wstep_hi;
  ReturnStack rstack;        ///< pending return instances
  std::uint64_t* cookie;     ///< session cookie of the running callback, if any
  std::uint8_t* xmm;         ///< saved xmm0/xmm1 while ret_handlers run
  /// The probed code's rsp at the hit that set `depth` (Regs::rsp): every
  /// frame of the program alive at that hit lies at or above it, on its
  /// stack. A longjmp there, or to another stack off the sigaltstack it is
  /// on, leaves the hit (leave_abandoned_hit()).
  std::uint64_t guard_sp;
  /// The thread's own stack, [stack_lo, stack_hi) (the main thread's below
  /// glibc's __libc_stack_end, as far as RLIMIT_STACK lets it grow; a thread
  /// started through the interposed pthread_create() from its start and its
  /// attributes' stack size); 0, 0 when unknown. A hit there can be left for
  /// good by a longjmp above it on the same stack (leave_abandoned_hit()); one
  /// on another stack (a coroutine's, a sigaltstack) may be resumed.
  std::uint64_t stack_lo, stack_hi;
  /// The main thread's: stack_lo follows RLIMIT_STACK as the program sets
  /// it (read again when a longjmp asks, main_stack_lo()).
  bool stack_grows;
  // The program's signal mask (src/interpose/masks.cpp); the view bit itself is
  // uprobe_view_blocked, which arch code reads.
  bool trap_held;            ///< a SIGTRAP sent to this thread while its view blocked it
  bool ctx_view_set;         ///< setcontext() set the view for the context it resumes
  std::uint32_t holds;       ///< SIGTRAPs held on this thread so far
  std::uint32_t handler_runs;  ///< program signal handlers run on this thread so far
  siginfo_t held_info;       ///< the held SIGTRAP's siginfo
  // (Last: the int3 path's single-step only, after what every hit reads.)
  arch::XolStep sstep;       ///< the stepped copy (its ops' pre_xol filled it): probe address, slot, fix-ups
};

extern __thread ThreadState t_state __attribute__((tls_model("initial-exec")));

/// A longjmp (any of the interposed ones) to a context with stack pointer
/// `target_sp` while a hit runs on this thread (t_state.depth set: the
/// program's signal handler that interrupted its consumers jumps out of it,
/// or a consumer does): when the hit's frame (guard_sp) and the target are
/// both on the thread's own stack (stack_lo, stack_hi) and the target at or
/// above the hit's frame, the hit can never go on (the program's next calls
/// overwrite its frames): its state is undone as its end would have (the
/// recursion guard, the read-side section, the int3 hit's in-flight
/// address, the return handlers' xmm and cookie pointers), so that the
/// thread's later hits run their consumers. A jump inside a consumer, a hit
/// on another stack (a coroutine's, whose scheduler may resume it by a
/// longjmp back; a sigaltstack) and a thread whose stack is not known keep
/// the hit as it is. Its return instance, if a return handler was running,
/// is not given back (one instance of the pool). setcontext()/swapcontext()
/// are not checked. Async-signal-safe; rare (a longjmp while a hit runs: one
/// gettid).
void leave_abandoned_hit(std::uint64_t target_sp) noexcept;

/// The lowest address the main thread's stack, whose frames lie below
/// `hi`, can reach under RLIMIT_STACK as it is now (1 GiB when unlimited).
/// Async-signal-safe (one prlimit64 system call).
std::uint64_t main_stack_lo(std::uint64_t hi) noexcept;

/// Marks the calling thread as inside a hot path (the SIGTRAP handler, an
/// optimized stub's entry, the return trampoline's dispatch) for its lifetime:
/// t_state.hot counts the nesting. The runtime does not read it; the
/// async-signal-safety audit test (tests/asafe) does, to catch allocations and
/// locks on these paths. Two plain TLS stores. Async-signal-safe.
struct HotPathScope {
  HotPathScope() noexcept { ++t_state.hot; }
  ~HotPathScope() { --t_state.hot; }
  HotPathScope(const HotPathScope&) = delete;
  HotPathScope& operator=(const HotPathScope&) = delete;
};

/// Marks libuprobe's own work on a program's thread, done on the program's
/// behalf where the kernel's uprobes would do none in user space (an
/// interposer's own libc calls: pthread_create()'s queries of the thread's
/// attributes, the new thread's preparation, dlopen()'s search of the
/// caller's path and the resync after it): probes hit there are not the
/// program's; their consumers do not run and nothing counts them (not even
/// as a recursion miss). Never around the call of libc's function the
/// interposer stands for (that one is the program's). Nests. Two plain TLS
/// accesses. Async-signal-safe.
struct RuntimeCallScope {
  RuntimeCallScope() noexcept { ++t_state.runtime_calls; }
  ~RuntimeCallScope() { --t_state.runtime_calls; }
  RuntimeCallScope(const RuntimeCallScope&) = delete;
  RuntimeCallScope& operator=(const RuntimeCallScope&) = delete;
};

/// While the consumers of `up` run: uprobe_fault_state says SIGSEGV and
/// SIGBUS may be blocked when `fatal` (Uprobe::faults_fatal), and is as it
/// was afterwards (what a consumer's mask change did to it ends with it, as
/// its mask change does). Two TLS accesses when `fatal`, none else.
/// Async-signal-safe.
struct FaultsFatalScope {
  const bool fatal;
  unsigned char saved = 0;
  explicit FaultsFatalScope(bool f) noexcept : fatal(f) {
    if (__builtin_expect(fatal, 0)) saved = uprobe_fault_state, uprobe_fault_state = kFaultsBlocked;
  }
  ~FaultsFatalScope() {
    if (__builtin_expect(fatal, 0)) uprobe_fault_state = saved;
  }
  FaultsFatalScope(const FaultsFatalScope&) = delete;
  FaultsFatalScope& operator=(const FaultsFatalScope&) = delete;
};

/// Claims the calling thread's StatBlock (stat_block()'s first use): one
/// never used, else one an exited thread gave back, else (more than the
/// pool's 4096 threads at once, or a hit after the thread's exit hook ran)
/// the overflow block the rest share, whose plain increments may lose counts
/// to each other. The thread-exit hook, armed when the thread became an RCU
/// reader (rcu_read.c: uprobe_arm_thread_exit_hook()), gives the block back
/// with its counts kept. Runs in the optimized path's section and calls
/// nothing outside it (it runs before the hit's read-side section: a stub
/// is reused only once no thread is seen there). Async-signal-safe.
StatBlock& claim_stat_block() noexcept;

/// Creates the thread-exit hook's key (before main(), from a constructor
/// that runs before most others; uretprobe_init() again). The hook runs the
/// return stack's part (return_stack_thread_exit()) and gives the thread's
/// StatBlock back. Not thread-safe (start-up).
void create_thread_exit_key() noexcept;

/// Arms the thread-exit hook for the calling thread (again in its TSD
/// destructors: one more round). Nothing when the key is not one of glibc's
/// 32 inline ones (the program used them up before libuprobe loaded): a
/// later key's pthread_setspecific() allocates. Async-signal-safe then
/// (stores in the thread descriptor). Not from code that runs in a stub
/// before its read-side section (pthread_setspecific() is outside the
/// optimized path's section): the RCU registration (uprobe_arm_thread_exit_hook())
/// and a hit's first return probe call it.
void arm_thread_exit_hook() noexcept;

/// The calling thread's StatBlock (claims one on first use). Async-signal-safe.
inline StatBlock& stat_block() noexcept {
  StatBlock* s = t_state.stats;
  return __builtin_expect(s != nullptr, 1) ? *s : claim_stat_block();
}

/// The probe addresses threads are handling in the SIGTRAP handler right now
/// (StatBlock::trap_ip != 0). Writer side.
std::vector<std::uint64_t> trap_ips_in_flight();

/// Asks the kernel for the calling thread's id and caches it (current_tid()'s
/// first use on a thread).
pid_t fetch_current_tid() noexcept;

/// gettid() of the calling thread, cached. Async-signal-safe.
inline pid_t current_tid() noexcept {
  const pid_t t = t_state.tid;
  return __builtin_expect(t != 0, 1) ? t : fetch_current_tid();
}

/// Makes the calling thread ready for hits: caches its thread id and
/// registers it as liburcu-bp reader, so that its hits make no system call
/// of ours (thread_start.cpp). `new_thread`: called by the first code of a
/// thread the interposed pthread_create() started, before a sanitizer's own
/// thread set-up (not instrumented; in ThreadSanitizer builds the
/// registration is then left to the first hit). Not async-signal-safe (the
/// registration takes liburcu-bp's registry mutex).
void prepare_thread_for_hits(bool new_thread) noexcept;

/// Forgets cached per-thread values in the child of fork().
void thread_state_after_fork_child() noexcept;

/// Registers liburcu-bp's fork handlers (its registry lock held across a
/// fork, the child's thread id first), once, before the process's first
/// RCU reader registers: called by the interposed pthread_create() before
/// it starts a thread (which registers at its start, probes or not) and by
/// the runtime's start. Another thread's registration waits until they are
/// in (a fork then, without them, would leave the child a registry lock of
/// a thread it does not have). Thread-safe; not async-signal-safe
/// (thread_start.cpp).
void install_rcu_fork_handlers() noexcept;

}  // namespace uprobe::detail
