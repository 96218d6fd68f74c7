// SPDX-License-Identifier: MIT
#include "raw_syscall.hpp"
#include "thread_state.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rcu.hpp"
#include "uprobe/config.hpp"
#include "uretprobe.hpp"

namespace uprobe::detail {

__thread ThreadState t_state __attribute__((tls_model("initial-exec"))) = {};

namespace {
// A static pool: claiming a block is one atomic add per thread lifetime, and
// the blocks survive their threads so that stats() keeps their counts.
constexpr unsigned kBlocks = 4096;
StatBlock g_blocks[kBlocks];
StatBlock g_overflow;  // shared by threads beyond the pool (counts stay right, speed does not)
std::atomic<unsigned> g_next_block{0};
}  // namespace

UPROBE_OPT_PATH_TEXT StatBlock& claim_stat_block() noexcept {  // (called before the stub's read-side section)
  ThreadState& ts = t_state;
  if (ts.stats) return *ts.stats;
  unsigned i = g_next_block.fetch_add(1, std::memory_order_relaxed);
  ts.stats = i < kBlocks ? &g_blocks[i] : &g_overflow;
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

namespace uprobe {

Stats stats() noexcept {
  using namespace detail;
  Stats s;
  unsigned n = g_next_block.load(std::memory_order_relaxed);
  if (n > kBlocks) n = kBlocks;
  auto add = [&s](const StatBlock& b) {
    s.hits += b.hits.load(std::memory_order_relaxed);
    s.recursion_misses += b.recursion_misses.load(std::memory_order_relaxed);
    s.emulated += b.emulated.load(std::memory_order_relaxed);
    s.out_of_line += b.out_of_line.load(std::memory_order_relaxed);
    s.redirected += b.redirected.load(std::memory_order_relaxed);
    s.restarts += b.restarts.load(std::memory_order_relaxed);
    s.locked_lookups += b.locked_lookups.load(std::memory_order_relaxed);
    s.foreign_traps += b.foreign_traps.load(std::memory_order_relaxed);
    s.return_hits += b.return_hits.load(std::memory_order_relaxed);
    s.return_misses += b.return_misses.load(std::memory_order_relaxed);
    s.return_dropped += b.return_dropped.load(std::memory_order_relaxed);
    s.optimized += b.optimized.load(std::memory_order_relaxed);
  };
  for (unsigned i = 0; i < n; ++i) add(g_blocks[i]);
  add(g_overflow);
  return s;
}

bool in_handler() noexcept { return detail::t_state.depth > 0; }

}  // namespace uprobe
