// SPDX-License-Identifier: MIT
#pragma once
/// @file regs.hpp
/// The register context a consumer sees at a probe hit.

#include <cstdint>

namespace uprobe {

#if defined(__x86_64__)
/// User register state at a probe hit, in the order of the kernel's x86-64
/// `struct pt_regs` (arch/x86/include/asm/ptrace.h), minus the segment and
/// orig_ax slots. `rip` is the address of the probed instruction at handler
/// time (the kernel's instruction_pointer() after uprobe_get_swbp_addr()).
///
/// Every field is readable and writable from a handler. Writes take effect
/// when the thread continues: writing `rip` redirects execution there (the
/// probed instruction is then not executed, as in the kernel when a handler
/// changes the instruction pointer); writing a GPR or `rflags` changes what
/// the probed instruction and the code after it see. Only the arithmetic,
/// direction and trap flags of `rflags` are honoured on write (the kernel
/// masks the rest on sigreturn as well).
///
/// Thread-safety: a Regs belongs to the hitting thread for the duration of
/// one handler call; do not keep a pointer to it.
struct Regs {
  std::uint64_t r15, r14, r13, r12, rbp, rbx, r11, r10;
  std::uint64_t r9, r8, rax, rcx, rdx, rsi, rdi;
  std::uint64_t rip, rflags, rsp;

  /// Instruction pointer (the probe site at handler time).
  std::uint64_t ip() const noexcept { return rip; }
  /// Stack pointer as it was when the probed instruction was reached.
  std::uint64_t sp() const noexcept { return rsp; }
  /// The n-th integer argument of the SysV x86-64 calling convention
  /// (n in 0..5: rdi, rsi, rdx, rcx, r8, r9); valid at a function's entry.
  /// Returns 0 for n > 5.
  std::uint64_t arg(unsigned n) const noexcept {
    switch (n) {
      case 0: return rdi;
      case 1: return rsi;
      case 2: return rdx;
      case 3: return rcx;
      case 4: return r8;
      case 5: return r9;
      default: return 0;
    }
  }
  /// The integer return value register (rax).
  std::uint64_t ret() const noexcept { return rax; }
};
#else
#error "libuprobe supports x86-64 only"
#endif

}  // namespace uprobe
