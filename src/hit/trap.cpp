// SPDX-License-Identifier: MIT
// The int3 path: the SIGTRAP handler (the kernel's handle_swbp() and
// handler_chain() in kernel/events/uprobes.c, plus its single-step completion
// handle_singlestep()). Async-signal-safe throughout: no allocation, no lock a
// probed thread can hold, no stdio; per-thread state only.

#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstring>
#include "raw_syscall.hpp"
#include "rcu.hpp"

#include <cerrno>

#include "arch.hpp"
#include "probe.hpp"
#include "hot.hpp"
#include "trap.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"
#include "dispatch.hpp"
#include "services.hpp"

namespace uprobe::detail {

namespace {

const std::uint64_t g_page_size = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));

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
  const std::uint64_t epoch = g_hot.mm_lock.lock_shared();
  Uprobe* up = find_uprobe(ip);
  g_hot.mm_lock.unlock_shared(epoch);
  return up;
}

/// A TF trap after a single-stepped XOL copy (XolMode::single_step, or any
/// out-of-line hit of a program that is single-stepping itself). Returns
/// true when the trap was ours; `user_step` is then set when the program had
/// TF set itself and must see this trap as the single-step of the probed
/// instruction (the kernel's arch_uprobe_post_xol() sending SIGTRAP).
/// The trap may come anywhere the instruction took the thread (a branch's
/// target), or at the copy itself between the iterations of a rep string
/// instruction (then it is still stepped, silently: the instruction steps as
/// one).
bool finish_single_step(ucontext_t* uc, bool& user_step) noexcept {
  ThreadState& ts = t_state;
  if (!ts.sstep_active) return false;
  switch (ts.sstep.ops->post_xol(ts.sstep, uc)) {
    case arch::StepEnd::foreign:
      return false;
    case arch::StepEnd::again:
      user_step = false;
      return true;
    case arch::StepEnd::done:
      break;
  }
  ts.sstep_active = false;
  user_step = ts.sstep.program_tf;
  return true;
}

/// Delivers to the program the single-step trap it would have taken after
/// the probed instruction (its TF was set at the probe): the kernel's
/// send_sigtrap() with TRAP_TRACE and the address execution continues at.
void deliver_user_step(int sig, const siginfo_t* info, ucontext_t* uc) noexcept {
  siginfo_t si = *info;
  si.si_signo = SIGTRAP;
  si.si_code = TRAP_TRACE;
  si.si_addr = reinterpret_cast<void*>(arch::ucontext_ip(uc));
  forward_foreign_trap(sig, &si, uc);
}

/// What the SIGTRAP handler does with a single-step trap it took over.
enum class StepTaken { no, deliver, silent };

/// A program single-stepping itself took the jmp of an optimized site: the
/// trap arrives at the stub's entry (at a punned site's hop, which jumps
/// there: followed). Runs the probe here, in the signal
/// handler, and continues where the stub would have (the stub itself is never
/// stepped through), so a nop5 site steps as the one instruction it replaced.
/// An entry site continues in its window slot (the displaced instructions,
/// relocated, then a jump back): the traps inside the slot are not handed to
/// the program, whose next step is the one after the jump back (the
/// displaced window steps as one instruction).
/// Reads n bytes at `ip`: directly when `mapped` (the trapping address's
/// page) and they do not cross into the next page, else with a call that
/// fails instead of faulting.
bool peek_at_trap(std::uint64_t ip, std::uint8_t* code, std::size_t n, bool mapped) noexcept {
  if (mapped && g_page_size - (ip & (g_page_size - 1)) >= n) {
    peek_text(ip, code, n);
    return true;
  }
  struct iovec local = {code, n}, remote = {reinterpret_cast<void*>(ip), n};
  // (system calls of its own: libc's wrappers are probe targets)
  return arch::raw_syscall(SYS_process_vm_readv, arch::raw_syscall(SYS_getpid), reinterpret_cast<long>(&local), 1,
                           reinterpret_cast<long>(&remote), 1, 0) == static_cast<long>(n);
}

StepTaken stepped_into_stub(ucontext_t* uc) noexcept {
  const StepTaken no = StepTaken::no;
  const std::uint64_t ip = arch::ucontext_ip(uc);
  std::uint8_t code[64];
  const std::size_t n = arch::opt_stub_probe_len();
  if (n > sizeof code || n < arch::kJumpLen) return no;
  // A punned site's jump lands on its hop, a jump to the stub: follow it
  // (the site's jump is checked below to aim at this hop). The hop is a
  // 5-byte jump that may end its page, the next one unmapped: a stub's n
  // bytes are not read there first.
  const bool whole = peek_at_trap(ip, code, n, true);
  std::uint64_t stub = ip;
  if (!whole || arch::opt_stub_desc(ip, code) == 0) {
    if (!whole && !peek_at_trap(ip, code, arch::kJumpLen, true)) return no;
    const std::uint64_t t = arch::decode_jump(ip, code, arch::kJumpLen);
    if (!t || !peek_at_trap(t, code, n, false)) return no;  // any jump of the program's: t may be unmapped
    stub = t;
  }
  const std::uint64_t desc_addr = arch::opt_stub_desc(stub, code);
  if (!desc_addr) return no;
  arch::OptSite desc;
  peek_text(desc_addr, reinterpret_cast<std::uint8_t*>(&desc), sizeof desc);
  desc.owner = 0;  // a copy read outside the RCU read lock: optimized_hit() looks the key up
  // The site's jump (a padded punned one: its prefixes first) aims here.
  std::uint8_t jmp[arch::kMaxJumpLen];
  peek_text(desc.site, jmp, arch::kJumpLen);
  const std::size_t len = arch::jump_len(jmp, arch::kJumpLen);
  if (len > arch::kJumpLen && !peek_at_trap(desc.site, jmp, len, false)) return no;
  if (len == 0 || arch::decode_jump(desc.site, jmp, len) != ip) return no;  // not the site's stub (any more)
  Regs regs;
  arch::regs_from_ucontext(uc, regs);
  regs.rip = desc.site;
  optimized_hit(desc, regs, true);
  StepTaken taken = StepTaken::deliver;
  if (regs.rip == desc.site) {
    regs.rip = desc.resume;
    if (desc.resume != desc.site + arch::kJumpLen) {  // an entry window's slot
      ThreadState& ts = t_state;
      ts.wstep_lo = desc.resume;
      ts.wstep_hi = desc.resume + arch::kWindowSlotSize;
      ts.wstep_active = true;
      taken = StepTaken::silent;
    }
  }
  arch::regs_to_ucontext(regs, uc);
  return taken;
}

/// A program single-stepping itself took an evicted successor's jump (T2):
/// the trap arrives at the successor's trampoline, whose mark (after its
/// code, arch::find_evict_mark()) names the successor; when that
/// successor's jump aims here, the trampoline becomes the thread's silent
/// region (as an entry window's slot): its steps are not the program's,
/// whose next step is the one after the relocated successor (past it, or
/// where it branched), as without the probe. Reads with a system call (the
/// trapping address may be anything the program jumped to); only once some
/// successor was evicted.
bool stepped_into_evicted(ucontext_t* uc) noexcept {
  if (!g_hot.evicted_ever.load(std::memory_order_relaxed)) return false;
  const std::uint64_t ip = arch::ucontext_ip(uc);
  std::uint8_t code[arch::kWindowSlotSize + arch::kEvictMarkLen];
  const std::size_t room = g_page_size - (ip & (g_page_size - 1));  // a trampoline and its mark share a page
  const std::size_t n = room < sizeof code ? room : sizeof code;
  if (!peek_at_trap(ip, code, n, false)) return false;
  std::uint64_t succ = 0;
  std::size_t len = 0;
  for (std::size_t from = 1; arch::find_evict_mark(code, n, ip, from, succ, len); from = len + 1) {
    std::uint8_t jmp[arch::kMaxJumpLen];
    if (!peek_at_trap(succ, jmp, arch::kJumpLen, false)) continue;
    const std::size_t jl = arch::jump_len(jmp, arch::kJumpLen);
    if (jl > arch::kJumpLen && !peek_at_trap(succ, jmp, jl, false)) continue;
    if (jl == 0 || arch::decode_jump(succ, jmp, jl) != ip) continue;
    ThreadState& ts = t_state;
    ts.wstep_lo = ip;
    ts.wstep_hi = ip + len;
    ts.wstep_active = true;
    return true;
  }
  return false;
}

/// A program single-stepping itself executed a `ret` into the return
/// trampoline (or the landing of an optimized entry's return): runs the
/// return here, in the signal handler, and continues at the real return
/// address (neither is ever stepped through).
bool stepped_into_return(ucontext_t* uc) noexcept {
  if (!arch::is_return_trampoline(arch::ucontext_ip(uc))) return false;
  if (!t_state.rstack.top) return false;
  arch::RetFrame f;
  arch::ret_frame_from_ucontext(uc, f);
  ret_dispatch(&f, arch::ucontext_sp(uc), true);
  arch::ret_frame_to_ucontext(f, uc);
  return true;
}

}  // namespace

namespace {

/// The bytes after the int3 at an entry site may be the jump's (a conversion
/// or its undoing is under way): set before the jump's tail is written, and
/// cleared only once the file's bytes are back and every core sees them.
/// Async-signal-safe.
bool window_patched(const Site& site) noexcept { return __atomic_load_n(&site.jumped, __ATOMIC_ACQUIRE) != 0; }

}  // namespace

void on_sigtrap(int sig, siginfo_t* info, void* ctx) noexcept {
  HotPathScope hot;
  const int saved_errno = errno;
  auto* uc = static_cast<ucontext_t*>(ctx);
  if (info->si_code != SI_KERNEL) {
    bool user_step = false;
    const bool trace = info->si_code == TRAP_TRACE || info->si_code == TRAP_BRKPT;
    ThreadState& ts = t_state;
    StepTaken taken = StepTaken::no;
    // Finishing a single-stepped XOL copy moves the thread back next to its
    // probe (maybe inside an entry window): a writer converting that window
    // must see it as handling that probe until it is back in the program.
    StatBlock& sst = stat_block();
    const std::uint64_t outer_trap_ip = sst.trap_ip.load(std::memory_order_relaxed);
    if (ts.sstep_active) {
      ts.trap_uc = uc;
      sst.trap_ip.store(ts.sstep.plan.ip, std::memory_order_release);
    }
    struct RestoreTrapIp {
      StatBlock& st;
      std::uint64_t ip;
      ~RestoreTrapIp() { st.trap_ip.store(ip, std::memory_order_release); }
    } restore_trap_ip{sst, outer_trap_ip};
    if (trace && ts.wstep_active) {
      const std::uint64_t ip = arch::ucontext_ip(uc);
      if (ip >= ts.wstep_lo && ip < ts.wstep_hi) {  // inside the window slot: not the program's step
        errno = saved_errno;
        return;
      }
      ts.wstep_active = false;  // left the slot: this step is the program's
    }
    if (trace && finish_single_step(uc, user_step)) {
      if (user_step && program_handles_sigtrap()) deliver_user_step(sig, info, uc);
    } else if (trace && program_handles_sigtrap() && stepped_into_return(uc)) {
      deliver_user_step(sig, info, uc);
    } else if (trace && program_handles_sigtrap() && (taken = stepped_into_stub(uc)) != StepTaken::no) {
      if (taken == StepTaken::deliver) deliver_user_step(sig, info, uc);
    } else if (trace && program_handles_sigtrap() && stepped_into_evicted(uc)) {
      // (silent: the jump to the trampoline is no instruction of the program's)
    } else {
      count(stat_block().foreign_traps);
      forward_foreign_trap(sig, info, ctx);
    }
    errno = saved_errno;
    return;
  }

  const std::uint64_t ip = arch::breakpoint_address(uc);
  StatBlock& st = stat_block();
  ThreadState& ts = t_state;
  ts.trap_uc = uc;
  const std::uint64_t outer_trap_ip = st.trap_ip.load(std::memory_order_relaxed);  // a nested hit restores it
  st.trap_ip.store(ip, std::memory_order_release);

  uprobe_rcu_read_lock();
  Uprobe* up = lookup(ip, st);
  const SiteSet* ss = up ? up->sites.load(std::memory_order_acquire) : nullptr;
  const Site* site = ss ? ss->find(ip) : nullptr;
  if (!site && ss) {
    // The int3 written at a successor while its eviction (T2) is written or
    // undone (the probe table names the evicting site's probe there): its
    // trampoline runs the successor, relocated, and jumps back past it.
    if (const Site* ev = ss->find_evictor(ip)) {
      const std::uint64_t to = ev->evict_hop;
      if (arch::ucontext_single_stepping(uc) && program_handles_sigtrap()) {
        // A self-stepping program: the trampoline's steps are not its own.
        ts.wstep_lo = to;
        ts.wstep_hi = to + ev->evict_len;
        ts.wstep_active = true;
      }
      uprobe_rcu_read_unlock();
      count(st.out_of_line);
      arch::set_ucontext_ip(uc, to);
      st.trap_ip.store(outer_trap_ip, std::memory_order_release);
      errno = saved_errno;
      return;
    }
  }
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
      st.trap_ip.store(outer_trap_ip, std::memory_order_release);
      forward_foreign_trap(sig, info, ctx);
      errno = saved_errno;
      return;
    }
    st.trap_ip.store(outer_trap_ip, std::memory_order_release);
    errno = saved_errno;
    return;
  }

  count(st.hits);
  Regs regs;
  arch::regs_from_ucontext(uc, regs);
  regs.rip = ip;
  // The program is single-stepping itself (TF set at the breakpoint, and a
  // SIGTRAP handler of its own to count the steps): it must see exactly one
  // single-step trap for the probed instruction, after it, as the kernel
  // arranges (arch_uprobe_skip_sstep / post_xol send SIGTRAP when the task's
  // TF was set).
  const arch::XolOps& ops = *up->insn.ops;  // how this instruction continues (chosen by arch::analyze())
  const bool raw_tf = arch::ucontext_single_stepping(uc);
  const bool user_tf = raw_tf && program_handles_sigtrap();
  bool emulated_step = false;
  // A consumer's mask change ends with it, as sigreturn restores the mask.
  const bool view = uprobe_view_blocked;
  // The consumers run under the trapped code's mask (plus SIGTRAP): when it
  // blocks SIGSEGV or SIGBUS, the thread's tracked state (which misses
  // glibc's own blocking, around its clone() for one) says so for them.
  const unsigned char fault_state = uprobe_fault_state;
  if (fault_state_of(uc->uc_sigmask.__val[0]) == kFaultsBlocked) uprobe_fault_state = kFaultsBlocked;
  guarded_handler_chain(up, regs);
  uprobe_fault_state = fault_state;
  if (uprobe_view_blocked != view) set_view(view);

  if (regs.rip != ip) {
    count(st.redirected);
  } else if (site->window_xol &&
             (window_patched(*site) ||
              (!user_tf && g_hot.optimize.load(std::memory_order_relaxed) &&
               window_switch_on(up->function_entry) &&
               up->window_blocker.load(std::memory_order_acquire) == 0))) {
    // The whole displaced window runs from its slot (never single-stepped):
    // no thread resumes inside bytes an optimized jump may overwrite. (A
    // thread that continues inside the window instead, while the window is
    // blocked or entry optimization is off, is runnable until it has left
    // it, and a writer converting the site waits for every thread to be
    // observed outside. Whatever the switches say, while bytes after the int3
    // are still the jump's (a conversion or its undoing in progress), the
    // window slot is the only way on. A program single-stepping itself is such a thread:
    // it runs the probed instruction alone, below, so that it sees each
    // displaced instruction step at its own address.)
    count(st.out_of_line);
    regs.rip = site->window_xol;
  } else if (ops.emulate && (ops.emulate_only || g_hot.emulate.load(std::memory_order_relaxed)) &&
             ops.emulate(up->insn, ip, regs)) {
    count(st.emulated);
    emulated_step = user_tf;
  } else if (site->xol != 0) {
    count(st.out_of_line);
    regs.rip = site->xol;
    // Under the program's own TF the copy is single-stepped too: the jump
    // back after it must not be seen as an extra step. So is a popf, which
    // may set TF (step_always): the program's first step is then after the
    // next instruction, not after our jump back.
    if (user_tf || ops.step_always || g_hot.xol.load(std::memory_order_relaxed) == XolMode::single_step) {
      ops.pre_xol(up->insn, ip, site->xol, regs, raw_tf, ts.sstep);
      ts.sstep_active = true;
    }
  } else {
    // No slot (only for emulated classes whose slot could not be placed):
    // emulate even when emulation is switched off.
    if (ops.emulate) ops.emulate(up->insn, ip, regs);
    count(st.emulated);
    emulated_step = user_tf;
  }
  arch::regs_to_ucontext(regs, uc);
  uprobe_rcu_read_unlock();
  // (After the program's own step handler: until then this thread may still
  // be about to resume inside a window.)
  if (emulated_step) deliver_user_step(sig, info, uc);
  st.trap_ip.store(outer_trap_ip, std::memory_order_release);
  errno = saved_errno;
}

}  // namespace uprobe::detail

extern "C" __attribute__((visibility("hidden"))) void uprobe_sigtrap_handler(int sig, siginfo_t* info,
                                                                           void* ctx) noexcept {
  uprobe::detail::on_sigtrap(sig, info, ctx);
}
