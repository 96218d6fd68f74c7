// SPDX-License-Identifier: MIT
/// @file kernel_uprobes.cpp
/// What the kernel's own uprobes write into a process's code on x86-64, and
/// how to take it out of a copy of that code (src/attach/text_pages.cpp).
#include "arch.hpp"

namespace uprobe::arch {

namespace {
/// The 5-byte nop the kernel optimizes (arch/x86/kernel/uprobes.c: x86_nops[5]).
constexpr std::uint8_t kKernelNop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
constexpr std::uint8_t kCallRel32 = 0xe8;
}  // namespace

std::size_t take_out_kernel_uprobes(std::uint8_t* mem, const std::uint8_t* file, std::size_t n) noexcept {
  std::size_t changed = 0;
  for (std::size_t k = 0; k < n; ++k) {
    if (mem[k] == file[k]) continue;
    if (mem[k] == kBreakpoint && file[k] != kBreakpoint) {
      mem[k] = file[k];
      ++changed;
      continue;
    }
    if (mem[k] == kCallRel32 && k + sizeof kKernelNop5 <= n) {
      bool nop5 = true;
      for (std::size_t i = 0; i < sizeof kKernelNop5; ++i) nop5 = nop5 && file[k + i] == kKernelNop5[i];
      if (nop5) {
        for (std::size_t i = 0; i < sizeof kKernelNop5; ++i) mem[k + i] = file[k + i];
        ++changed;
        k += sizeof kKernelNop5 - 1;
      }
    }
  }
  return changed;
}

}  // namespace uprobe::arch
