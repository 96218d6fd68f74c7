// SPDX-License-Identifier: MIT
// The C entry of an optimized-probe stub. Compiled with -mgeneral-regs-only:
// nothing here touches a vector or x87 register before the state is saved
// (xsavec of every XCR0 component, when the site's consumers may use them)
// or after it is restored.

#include <cpuid.h>

#include <cstdint>

#include "arch.hpp"

extern "C" {
/// The core's side of an optimized hit (dispatch.cpp).
void uprobe_opt_hit(std::uint64_t* frame, const uprobe::arch::OptSite* site) noexcept;
}

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

namespace {

/// A hit whose consumers may use vector or x87 registers: xsavec of every
/// XCR0 component around it (an 8 KiB area on this stack).
__attribute__((noinline)) void hit_saving_vector_state(std::uint64_t* frame, const uprobe::arch::OptSite* site) {
  alignas(64) std::uint8_t area[kXsaveMax];
  const XsaveInfo xi = g_xsave;
  const auto lo = static_cast<std::uint32_t>(xi.mask), hi = static_cast<std::uint32_t>(xi.mask >> 32);
  if (xi.ok) {
    for (std::size_t i = 512; i < 576; ++i) area[i] = 0;  // XSAVE header
    asm volatile("xsavec %0" : "=m"(area) : "a"(lo), "d"(hi) : "memory");
  }
  uprobe_opt_hit(frame, site);
  if (xi.ok) asm volatile("xrstor %0" : : "m"(area), "a"(lo), "d"(hi) : "memory");
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) void uprobe_opt_entry(std::uint64_t* frame,
                                                                       const uprobe::arch::OptSite* site) {
  if (site->needs_vector != 0)
    hit_saving_vector_state(frame, site);
  else
    uprobe_opt_hit(frame, site);  // a tail call
}
