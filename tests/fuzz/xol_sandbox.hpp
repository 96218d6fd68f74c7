// SPDX-License-Identifier: MIT
#pragma once
// The sandbox of the differential XOL fuzzer (xol_fuzz.cpp): runs one
// instruction in a forked child, from a given register and memory state, and
// reports the state the child ended in.
//
// One child runs every variant of a plan in turn (one fork per input). It maps
// the plan's pages at fixed addresses (MAP_FIXED_NOREPLACE), installs handlers
// for SIGTRAP, SIGSEGV, SIGBUS, SIGILL and SIGFPE on an alternate stack, and
// executes int3. The handler starts a variant by loading the plan's registers
// into the signal context (every GPR, rflags, rip, xmm0-15, MXCSR, a reset x87
// state, every other XSAVE component in its init state), optionally running
// uprobe::arch::emulate() on them exactly as the runtime's SIGTRAP handler
// does (regs_from_ucontext, emulate, regs_to_ucontext), pointing fs and gs at
// the plan's bases, and returning: the kernel's rt_sigreturn starts the
// instruction. The next signal (the int3 of a landing pad, or a fault)
// records the context and the writable pages into the variant's shared
// result block; the handler then puts back the child's own fs and gs bases,
// rewrites the writable pages from the plan and starts the next variant the
// same way. A variant still running after 250 ms is killed by SIGALRM (a
// timeout); run() starts a new child for the variants after it.
//
// This file is compiled without sanitizers, coverage or stack protector and
// with -fno-builtin: after the fs base changed, the child may not touch TLS,
// libc or the sanitizer runtimes (raw system calls only).

#include <signal.h>
#include <sys/ucontext.h>

#include <cstddef>
#include <cstdint>

#include "arch.hpp"

namespace xolfuzz {

inline constexpr std::size_t kPage = 4096;
inline constexpr int kMaxPages = 32;
inline constexpr std::size_t kMaxWritable = 24 * kPage;

struct Page {
  std::uint64_t addr = 0;            ///< page-aligned
  int prot = 0;                      ///< PROT_* once filled
  std::uint8_t bytes[kPage] = {};    ///< content
};

/// What one run executes.
struct Plan {
  Page pages[kMaxPages];
  int npages = 0;
  uprobe::Regs regs{};               ///< GPRs, rflags, rip (where execution starts)
  std::uint8_t xmm[16][16] = {};
  std::uint64_t fs_base = 0, gs_base = 0;
  /// One way to run the instruction: where execution starts (regs.rip is
  /// ignored), and whether arch::emulate() runs first on the state (the
  /// runtime's trap path; the emulated rip is then where execution starts).
  struct Variant {
    std::uint64_t rip = 0;
    const uprobe::arch::Insn* emulate = nullptr;
  };
  static constexpr int kMaxVariants = 4;
  Variant variants[kMaxVariants];
  int nvariants = 0;
};

enum class Stage : std::uint32_t {
  start = 0,     ///< before the first SIGTRAP
  emulating = 1, ///< inside arch::emulate() in the first handler call
  running = 2,   ///< the instruction was started
};

/// What one run ended with (written by the child into shared memory).
struct Result {
  std::uint32_t done = 0;     ///< 1 when the child recorded a signal
  Stage stage = Stage::start; ///< when the signal came
  int sig = 0, code = 0;
  std::uint64_t addr = 0;     ///< si_addr
  greg_t gregs[NGREG] = {};
  std::uint8_t fx[512] = {};  ///< the FXSAVE image of the signal frame
  std::uint8_t mem[kMaxWritable] = {};  ///< the plan's writable pages, in plan order
};

enum class Outcome { signal, timeout, setup_failed };

/// Runs every variant of `plan` (forking once, again after a timeout) and
/// stores variant k's outcome in out[k] and its end state in results[k].
/// `results` must be MAP_SHARED memory for plan.nvariants Result blocks.
void run(const Plan& plan, Result* results, Outcome* out);

}  // namespace xolfuzz
