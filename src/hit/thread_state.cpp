// SPDX-License-Identifier: MIT
#include "raw_syscall.hpp"
#include "thread_state.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rcu.hpp"
#include "sanitize.hpp"
#include "uprobe/config.hpp"
#include "uretprobe.hpp"

namespace uprobe::detail {

__thread ThreadState t_state __attribute__((tls_model("initial-exec"))) = {};

namespace {
// A static pool: claiming a block is a few atomic operations per thread
// lifetime; a thread's exit gives its block back (its counts added to
// g_retired first), so that stats() keeps them and the next thread reuses it.
constexpr unsigned kBlocks = 4096;
StatBlock g_blocks[kBlocks];
StatBlock g_overflow;  // shared by threads beyond the pool (plain increments: they may lose counts to each other)
StatBlock g_retired;   // the counts of the blocks given back (atomic adds, at thread exit only)
std::atomic<unsigned> g_next_block{0};                // blocks [0, this) were claimed at least once
std::atomic<std::uint64_t> g_free_blocks[kBlocks / 64];  // bit i: g_blocks[i] was given back, free

pthread_key_t g_exit_key;
/// Whether arm_thread_exit_hook() may call pthread_setspecific(g_exit_key)
/// on a hot path: glibc keeps the values of keys 0..31
/// (PTHREAD_KEY_2NDLEVEL_SIZE) in the thread descriptor, but for a later key
/// pthread_setspecific() callocs a second-level block on a thread's first
/// use of it: an allocation in the SIGTRAP handler or a stub (found by
/// tests/asafe). The key is therefore created by a constructor that runs
/// before most others (libuprobe.so's run before the program's), which makes
/// it one of the first 32 in practice; if it is not, the thread-exit hook
/// is not installed (blocks and return instances then stay taken).
bool g_exit_key_inline = false;

/// The counters of a StatBlock (all but trap_ip) and the Stats field each adds to.
struct Counter {
  std::atomic<std::uint64_t> StatBlock::*block;
  std::uint64_t Stats::*total;
};
constexpr Counter kCounters[] = {
    {&StatBlock::hits, &Stats::hits},
    {&StatBlock::recursion_misses, &Stats::recursion_misses},
    {&StatBlock::emulated, &Stats::emulated},
    {&StatBlock::out_of_line, &Stats::out_of_line},
    {&StatBlock::redirected, &Stats::redirected},
    {&StatBlock::restarts, &Stats::restarts},
    {&StatBlock::locked_lookups, &Stats::locked_lookups},
    {&StatBlock::foreign_traps, &Stats::foreign_traps},
    {&StatBlock::return_hits, &Stats::return_hits},
    {&StatBlock::return_misses, &Stats::return_misses},
    {&StatBlock::return_dropped, &Stats::return_dropped},
    {&StatBlock::optimized, &Stats::optimized},
};

/// A block an exited thread gave back, or nullptr. (Inlined into
/// claim_stat_block(), in the optimized path's section.)
UPROBE_OPT_PATH_TEXT __attribute__((always_inline)) inline StatBlock* take_free_block() noexcept {
  for (unsigned w = 0; w < kBlocks / 64; ++w) {
    std::uint64_t v = g_free_blocks[w].load(std::memory_order_relaxed);
    while (v) {
      const std::uint64_t bit = v & -v;
      v = g_free_blocks[w].fetch_and(~bit, std::memory_order_acquire);
      if (v & bit) return &g_blocks[w * 64 + static_cast<unsigned>(__builtin_ctzll(bit))];
      v &= ~bit;
    }
  }
  return nullptr;
}

/// Gives the calling thread's block back (its thread-exit hook): its counts
/// added to g_retired, the block zeroed and free (a stats() in between may
/// miss them for that moment). A hit after this (a later TSD destructor)
/// counts in the overflow block (ThreadState::stats_given_back).
void give_back_stat_block() noexcept {
  ThreadState& ts = t_state;
  StatBlock* b = ts.stats;
  if (!b || b == &g_overflow) return;
  ts.stats = nullptr;  // (a signal handler's hit from here on claims another)
  for (const Counter& c : kCounters) {
    const std::uint64_t v = (b->*c.block).load(std::memory_order_relaxed);
    (b->*c.block).store(0, std::memory_order_relaxed);
    (g_retired.*c.block).fetch_add(v, std::memory_order_relaxed);
  }
  b->trap_ip.store(0, std::memory_order_relaxed);
  const auto i = static_cast<unsigned>(b - g_blocks);
  g_free_blocks[i / 64].fetch_or(std::uint64_t{1} << (i % 64), std::memory_order_release);
}

/// The thread-exit hook (g_exit_key's destructor).
void thread_exit_hook(void*) {
  ThreadState& ts = t_state;
  ts.stats_given_back = true;  // (before: a hit in the return stack's part counts in the overflow block)
  if (ts.rstack.exit_hook || ts.rstack.exiting) return_stack_thread_exit(&ts.rstack);  // (armed in this round or an earlier one)
  give_back_stat_block();
}

__attribute__((constructor(101))) void create_thread_exit_key_early() { create_thread_exit_key(); }
}  // namespace

void create_thread_exit_key() noexcept {
  constexpr pthread_key_t kInlineKeys = 32;  // glibc's PTHREAD_KEY_2NDLEVEL_SIZE
  if (g_exit_key_inline) return;
  if (pthread_key_create(&g_exit_key, thread_exit_hook) != 0) return;
  if (g_exit_key < kInlineKeys)
    g_exit_key_inline = true;
  else
    pthread_key_delete(g_exit_key);
}

// (Not instrumented: a thread's first hit may come in its exit path, after a
// sanitizer's own per-thread state is gone; see rcu_read.c.)
UPROBE_NO_SANITIZE void arm_thread_exit_hook() noexcept {
  if (g_exit_key_inline) pthread_setspecific(g_exit_key, &t_state);
}

}  // namespace uprobe::detail

extern "C" __attribute__((visibility("hidden"))) UPROBE_NO_SANITIZE void uprobe_arm_thread_exit_hook(void) {
  uprobe::detail::arm_thread_exit_hook();
}

namespace uprobe::detail {

UPROBE_OPT_PATH_TEXT StatBlock& claim_stat_block() noexcept {  // (called before the stub's read-side section)
  ThreadState& ts = t_state;
  if (ts.stats) return *ts.stats;
  StatBlock* b = nullptr;
  if (!ts.stats_given_back) {  // (a hit after the exit hook: the overflow block, never leaked)
    if (g_next_block.load(std::memory_order_relaxed) < kBlocks) {  // (so that it never wraps around)
      const unsigned i = g_next_block.fetch_add(1, std::memory_order_relaxed);
      if (i < kBlocks) b = &g_blocks[i];
    }
    if (!b) b = take_free_block();
  }
  ts.stats = b ? b : &g_overflow;
  return *ts.stats;
}

std::vector<std::uint64_t> trap_ips_in_flight() {
  std::vector<std::uint64_t> out;
  unsigned n = g_next_block.load(std::memory_order_relaxed);
  if (n > kBlocks) n = kBlocks;
  for (unsigned i = 0; i < n; ++i)
    if (std::uint64_t ip = g_blocks[i].trap_ip.load(std::memory_order_acquire)) out.push_back(ip);
  if (std::uint64_t ip = g_overflow.trap_ip.load(std::memory_order_acquire)) out.push_back(ip);
  return out;
}

pid_t fetch_current_tid() noexcept {
  ThreadState& ts = t_state;
  if (ts.tid == 0) ts.tid = static_cast<pid_t>(arch::raw_syscall(SYS_gettid));  // not libc's syscall(): a probe target
  return ts.tid;
}

std::uint64_t main_stack_lo(std::uint64_t hi) noexcept {
  rlimit r{};
  std::uint64_t grow = 1ull << 30;
  if (arch::raw_syscall(SYS_prlimit64, 0, RLIMIT_STACK, 0, reinterpret_cast<long>(&r)) == 0 &&
      r.rlim_cur != RLIM_INFINITY)
    grow = r.rlim_cur;
  return hi > grow ? hi - grow : 0;
}

void leave_abandoned_hit(std::uint64_t target_sp) noexcept {
  ThreadState& ts = t_state;
  if (ts.depth == 0) return;
  if (ts.stack_grows) ts.stack_lo = main_stack_lo(ts.stack_hi);  // (the program may have raised the limit)
  const std::uint64_t guard = ts.guard_sp;
  const auto own = [&ts](std::uint64_t a) { return a >= ts.stack_lo && a < ts.stack_hi; };
  if (!own(guard) || !own(target_sp) || target_sp < guard) return;
  // (Its frames are below the target on this stack: the program's next
  // calls overwrite them, it never resumes, so its section ends here.)
  // A task sharing this thread's TLS (a vfork child) jumps on its own.
  if (ts.tid != 0 && static_cast<pid_t>(arch::raw_syscall(SYS_gettid)) != ts.tid) return;
  ts.depth = 0;
  ts.xmm = nullptr;
  ts.cookie = nullptr;
  ts.hot = 0;
  stat_block().trap_ip.store(0, std::memory_order_release);
  uprobe_rcu_read_unlock();  // the hit's read-side section
}

void thread_state_after_fork_child() noexcept {
  t_state.tid = 0;
  // The forking thread's return stack now belongs to the child's thread.
  if (t_state.rstack.owner != 0) t_state.rstack.owner = static_cast<pid_t>(arch::raw_syscall(SYS_gettid));
}

}  // namespace uprobe::detail

namespace uprobe::detail {
std::atomic<RecursionMissHook> g_recursion_miss_hook{nullptr};
}  // namespace uprobe::detail

namespace uprobe {

void set_recursion_miss_hook(RecursionMissHook hook) noexcept {
  detail::g_recursion_miss_hook.store(hook, std::memory_order_release);
}

Stats stats() noexcept {
  using namespace detail;
  Stats s;
  unsigned n = g_next_block.load(std::memory_order_relaxed);
  if (n > kBlocks) n = kBlocks;
  auto add = [&s](const StatBlock& b) {
    for (const Counter& c : kCounters) s.*c.total += (b.*c.block).load(std::memory_order_relaxed);
  };
  for (unsigned i = 0; i < n; ++i) add(g_blocks[i]);
  add(g_overflow);
  add(g_retired);
  s.hits += s.optimized;  // (an optimized hit counts in StatBlock::optimized only)
  return s;
}

bool in_handler() noexcept { return detail::t_state.depth > 0; }

}  // namespace uprobe
