// SPDX-License-Identifier: MIT
// The C entry of an optimized-probe stub. Compiled with -mgeneral-regs-only:
// nothing here touches a vector or x87 register before the state is saved
// (xsavec of every XCR0 component, when the site's consumers may use them)
// or after it is restored.

#include <cpuid.h>

#include <cstdint>

#include "arch.hpp"

namespace uprobe::detail {
/// The core's side of an optimized hit (dispatch.cpp).
void optimized_hit(const arch::OptSite& site, Regs& regs) noexcept;
}  // namespace uprobe::detail

namespace {

constexpr std::size_t kXsaveMax = 8192;

struct XsaveInfo {
  std::uint64_t mask = 0;
  bool ok = false;
};

XsaveInfo compute_xsave_info() noexcept {
  {
    XsaveInfo i;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return i;  // OSXSAVE
    unsigned lo, hi;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    __cpuid_count(0xD, 1, a, b, c, d);
    if (!(a & (1u << 1))) return i;  // XSAVEC
    __cpuid_count(0xD, 0, a, b, c, d);
    if (b > kXsaveMax) return i;
    i.mask = (static_cast<std::uint64_t>(hi) << 32) | lo;
    i.ok = true;
    return i;
  }
}

// Computed before main(), so the entry never runs a guarded static init.
XsaveInfo g_xsave = compute_xsave_info();

}  // namespace

extern "C" __attribute__((visibility("hidden"))) void uprobe_opt_entry(std::uint64_t* frame,
                                                                       const uprobe::arch::OptSite* site) {
  alignas(64) std::uint8_t area[kXsaveMax];
  const bool save = site->needs_vector != 0;
  const XsaveInfo xi = save ? g_xsave : XsaveInfo{};
  const auto lo = static_cast<std::uint32_t>(xi.mask), hi = static_cast<std::uint32_t>(xi.mask >> 32);
  if (xi.ok) {
    for (std::size_t i = 512; i < 576; ++i) area[i] = 0;  // XSAVE header
    asm volatile("xsavec %0" : "=m"(area) : "a"(lo), "d"(hi) : "memory");
  }
  uprobe::Regs regs;
  std::uint64_t* r = &regs.r15;
  for (int i = 0; i < 15; ++i) r[i] = frame[i];
  regs.rip = site->site;
  regs.rflags = frame[15];
  regs.rsp = reinterpret_cast<std::uint64_t>(frame + 17) + 128;
  uprobe::detail::optimized_hit(*site, regs);
  for (int i = 0; i < 15; ++i) frame[i] = r[i];
  frame[15] = (frame[15] & ~0xdd5ull) | (regs.rflags & 0xdd5ull);
  frame[16] = regs.rip != site->site ? regs.rip : site->resume;
  if (xi.ok) asm volatile("xrstor %0" : : "m"(area), "a"(lo), "d"(hi) : "memory");
}
