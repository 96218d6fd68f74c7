// SPDX-License-Identifier: MIT
#pragma once
/// @file lab.hpp
/// The "before" designs of the seed patches (../shared/seeds/, the kernel
/// patches that made uprobes scale), kept behind Config switches so that
/// uprobe-bench can draw each technique's before/after curve. Every enum's
/// first value is the scalable design and the default; the other values
/// model what the kernel did before the patch. A program has no reason to
/// choose them: they are slower by design, and each says what it costs.
/// Selected through Config (config.hpp) and configure().

#include <cstdint>

namespace uprobe {

/// How a hit finds its uprobe. Models seed 000 (the kernel's speculative,
/// mmap_lock-free uprobe lookup: find_active_uprobe_speculative()).
enum class LookupMode : std::uint8_t {
  speculative,  ///< sequence count + RCU VMA/probe lookup, locked fallback on change (default)
  locked,       ///< before: every hit takes the global reader-writer lock (the mmap_lock analog)
};

/// How the probed instruction runs when it is neither emulated nor a window.
/// single_step models the kernel's own design (arch/x86/kernel/uprobes.c:
/// arch_uprobe_pre_xol() sets TF, arch_uprobe_post_xol() fixes up after the
/// second trap): two signals per hit instead of one.
enum class XolMode : std::uint8_t {
  jump_back,    ///< relocated copy followed by a jump back: no second trap (default)
  single_step,  ///< kernel-faithful: set TF, run the copy, fix up on the second SIGTRAP (at the copy's end, at a
                ///< ret's or jmp *'s target, after every iteration of a rep string instruction, after the jump
                ///< back for a syscall)
};

/// How the SIGTRAP handler is installed. Models seed 001.
enum class SignalMask : std::uint8_t {
  nodefer,  ///< SA_NODEFER and an empty sa_mask: delivery and sigreturn leave the blocked mask alone (default)
  defer,    ///< before: the classic handler: SIGTRAP blocked during the handler, so every hit changes the mask.
            ///< With SIGTRAP blocked, an int3 probe hit from inside a handler (a consumer calling a probed
            ///< function) is fatal, where nodefer counts a recursion miss.
};

/// Where return instances come from. Models seed 002 (the kernel's switch
/// from a global freelist to objpool for return_instances).
enum class RiPool : std::uint8_t {
  objpool,   ///< per-thread cache backed by per-CPU rings: no shared write in the steady state (default)
  freelist,  ///< before: one global lock-free LIFO: a CAS on a shared head on every get and put
};

/// Locking of return-instance bookkeeping. Models seed 004 (per-task
/// return_instance lists instead of a global lock).
enum class RiLock : std::uint8_t {
  none,    ///< per-thread return stacks, no lock (default)
  global,  ///< before: one process-wide spinlock around every push and pop of a return instance.
           ///< Re-entrancy hazard: it is the one lock on the return path a thread can hold when a signal
           ///< arrives, and taking it again on the same thread would spin forever. libuprobe holds it only
           ///< inside a hit, so a hit from a signal handler that interrupted the holder is a recursion miss
           ///< (Stats::recursion_misses: its consumers do not run); nothing else takes it.
};

/// How a probe past a function's entry is planned (issue 16). Not a seed:
/// the two ways of putting a jump at any instruction side by side, for the
/// bench and for running the whole test suite through punned jumps.
enum class SiteTactics : std::uint8_t {
  windows,           ///< the kprobes optimizer's window (the instructions from the site on, after the function's
                     ///< checks), else E9Patch's B1/B2 on the instruction alone (default)
  instruction_only,  ///< E9Patch's way, with no control-flow analysis: only the instruction's own bytes change, as
                     ///< a jump when it is at least 5 bytes long (B1), else a punned jump (B2); function entries
                     ///< are planned as before. Costs: a hop page per punned site's address range, more sites left
                     ///< on int3 where the punned bytes select no free address. Applies to probes created after
                     ///< configure() (a probe keeps the plan it was analysed with).
  /// instruction_only, with every punned jump padded when the instruction allows (E9Patch's T1 first: one to
  /// three redundant prefixes before the jump's opcode, the fewest whose target range has a free page;
  /// ProbeMode::optimized_padded), B2 only for a 1-byte instruction or where no padded form's pages are free. By
  /// default a padded jump is taken only
  /// when B2's range has no free page; this exercises it at every site (the test suites' padded mode).
  instruction_padded,
  /// instruction_only, with every punned jump placed by successor eviction (E9Patch's T2,
  /// ProbeMode::optimized_evicted) wherever the instruction after it can be evicted, without looking for a free
  /// page of the plain or padded forms first (by default eviction is taken only when none has one); B2 where the
  /// successor cannot be evicted or both jumps find no place. The test suites' evicted mode (needs
  /// Config::optimize_evicted).
  instruction_evicted,
};

}  // namespace uprobe
