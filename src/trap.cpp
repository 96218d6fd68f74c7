// SPDX-License-Identifier: MIT
// The int3 path: the SIGTRAP handler (the kernel's handle_swbp() and
// handler_chain() in kernel/events/uprobes.c, plus its single-step completion
// handle_singlestep()). Async-signal-safe throughout: no allocation, no lock a
// probed thread can hold, no stdio; per-thread state only.

#include <signal.h>
#include <ucontext.h>
#include "rcu.hpp"

#include <cerrno>

#include "arch.hpp"
#include "patch.hpp"
#include "probe.hpp"
#include "runtime.hpp"
#include "thread_state.hpp"
#include "dispatch.hpp"

namespace uprobe::detail {

namespace {

/// (dev, ino, offset) of `ip` through the current snapshots, then the uprobe.
/// Caller is in an RCU read-side critical section.
Uprobe* find_uprobe(std::uint64_t ip) noexcept {
  const VmaSnapshot* vmas = g_hot.vmas.load(std::memory_order_acquire);
  if (!vmas) return nullptr;
  const Vma* v = vmas->find(ip);
  if (!v || !v->executable() || v->ino == 0) return nullptr;
  const ProbeTable* probes = g_hot.probes.load(std::memory_order_acquire);
  if (!probes) return nullptr;
  return probes->find(ProbeKey{v->dev, v->ino, v->pgoff + (ip - v->start)});
}

/// Speculative lookup under the address-space sequence count; falls back to
/// the global lock when a writer published meanwhile (seed 000). In
/// LookupMode::locked every hit takes the lock.
Uprobe* lookup(std::uint64_t ip, StatBlock& st) noexcept {
  if (g_hot.lookup.load(std::memory_order_relaxed) == LookupMode::speculative) {
    std::uint64_t seq = g_hot.mm_seq.load(std::memory_order_acquire);
    if (!(seq & 1)) {
      Uprobe* up = find_uprobe(ip);
      // No fence needed before the re-check: find_uprobe() reads the two
      // snapshot pointers with acquire loads, which keep this later load
      // after them; if either pointer is one a writer published after `seq`,
      // the acquire synchronises with its release exchange and this load sees
      // the writer's odd count or later (ThreadSanitizer, which does not
      // model fences, checks exactly this ordering).
      if (g_hot.mm_seq.load(std::memory_order_relaxed) == seq) return up;
    }
    count(st.locked_lookups);
  }
  g_hot.mm_lock.lock_shared();
  Uprobe* up = find_uprobe(ip);
  g_hot.mm_lock.unlock_shared();
  return up;
}

/// A TF trap after a single-stepped XOL copy (XolMode::single_step).
bool finish_single_step(ucontext_t* uc) noexcept {
  ThreadState& ts = t_state;
  if (!ts.sstep_active || arch::ucontext_ip(uc) != ts.sstep_slot + ts.sstep_len) return false;
  ts.sstep_active = false;
  arch::set_ucontext_ip(uc, ts.sstep_ip + ts.sstep_len);
  if (!ts.sstep_user_tf) arch::set_ucontext_flags(uc, arch::ucontext_flags(uc) & ~arch::kTrapFlag);
  return true;
}

}  // namespace

void on_sigtrap(int sig, siginfo_t* info, void* ctx) noexcept {
  HotPathScope hot;
  const int saved_errno = errno;
  auto* uc = static_cast<ucontext_t*>(ctx);
  if (info->si_code != SI_KERNEL) {
    if (!(info->si_code == TRAP_TRACE || info->si_code == TRAP_BRKPT) || !finish_single_step(uc)) {
      count(stat_block().foreign_traps);
      forward_foreign_trap(sig, info, ctx);
    }
    errno = saved_errno;
    return;
  }

  const std::uint64_t ip = arch::breakpoint_address(uc);
  StatBlock& st = stat_block();
  uprobe_rcu_read_lock();
  Uprobe* up = lookup(ip, st);
  const SiteSet* ss = up ? up->sites.load(std::memory_order_acquire) : nullptr;
  const Site* site = ss ? ss->find(ip) : nullptr;
  if (!site) {
    uprobe_rcu_read_unlock();
    std::uint8_t byte;
    peek_text(ip, &byte, 1);
    if (byte != arch::kBreakpoint) {
      // Raced with unregister: the original byte is back. Run it.
      count(st.restarts);
      arch::set_ucontext_ip(uc, ip);
    } else {
      count(st.foreign_traps);
      forward_foreign_trap(sig, info, ctx);
    }
    errno = saved_errno;
    return;
  }

  count(st.hits);
  Regs regs;
  arch::regs_from_ucontext(uc, regs);
  regs.rip = ip;
  guarded_handler_chain(up, regs);
  ThreadState& ts = t_state;

  if (regs.rip != ip) {
    count(st.redirected);
  } else if ((g_hot.emulate.load(std::memory_order_relaxed) || !arch::xol_safe(up->insn)) &&
             arch::emulate(up->insn, ip, regs)) {
    count(st.emulated);
  } else if (site->xol != 0) {
    count(st.out_of_line);
    regs.rip = site->xol;
    if (g_hot.xol.load(std::memory_order_relaxed) == XolMode::single_step) {
      ts.sstep_user_tf = regs.rflags & arch::kTrapFlag;
      ts.sstep_len = up->insn.len;
      ts.sstep_ip = ip;
      ts.sstep_slot = site->xol;
      ts.sstep_active = true;
      regs.rflags |= arch::kTrapFlag;
    }
  } else {
    // No slot (only for emulated classes whose slot could not be placed):
    // emulate even when emulation is switched off.
    arch::emulate(up->insn, ip, regs);
    count(st.emulated);
  }
  arch::regs_to_ucontext(regs, uc);
  uprobe_rcu_read_unlock();
  errno = saved_errno;
}

}  // namespace uprobe::detail
