// SPDX-License-Identifier: MIT
// The C++ side of user_copy.S: the calls, and the exception-table lookup the
// SIGSEGV/SIGBUS handler makes (the kernel's fixup_exception()).

#include <signal.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>

#include "arch.hpp"

// Runs in the SIGSEGV/SIGBUS wrapper, which is not instrumented
// (src/interpose/signals.cpp): nor is this.
#define UPROBE_ARCH_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))

extern "C" {
std::size_t uprobe_arch_copy_user(void* dst, const void* src, std::size_t n) noexcept;
long uprobe_arch_copy_user_str(char* dst, const void* src, std::size_t size) noexcept;
// Labels in user_copy.S (not callable): the loads that may fault, the fixups.
void uprobe_ucopy_load8();
void uprobe_ucopy_load1();
void uprobe_ucopy_fixup();
void uprobe_ustr_load8();
void uprobe_ustr_load1();
void uprobe_ustr_fixup();
}

namespace uprobe::arch {

std::size_t copy_user(void* dst, const void* src, std::size_t n) noexcept { return uprobe_arch_copy_user(dst, src, n); }

long copy_user_str(char* dst, const void* src, std::size_t size) noexcept {
  return uprobe_arch_copy_user_str(dst, src, size);
}

UPROBE_ARCH_NO_SANITIZE bool user_copy_fixup(const siginfo_t* info, ucontext_t* uc) noexcept {
  if (info->si_code <= 0) return false;  // sent (kill, tgkill, sigqueue): not a fault
  const auto ip = static_cast<std::uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const auto at = [](void (*label)()) { return reinterpret_cast<std::uint64_t>(label); };
  std::uint64_t fixup = 0;
  if (ip == at(uprobe_ucopy_load8) || ip == at(uprobe_ucopy_load1)) fixup = at(uprobe_ucopy_fixup);
  else if (ip == at(uprobe_ustr_load8) || ip == at(uprobe_ustr_load1)) fixup = at(uprobe_ustr_fixup);
  if (!fixup) return false;
  uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(fixup);
  return true;
}

}  // namespace uprobe::arch
