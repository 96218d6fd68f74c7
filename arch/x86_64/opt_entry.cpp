// SPDX-License-Identifier: MIT
// The C entry of an optimized-probe stub. Compiled with -mgeneral-regs-only:
// nothing here touches a vector or x87 register before the state is saved
// (xsavec of every XCR0 component, when the site's consumers may use them)
// or after it is restored.

#include <cpuid.h>

#include <cstdint>

#include "arch.hpp"

// ThreadSanitizer builds (the runtime's src/sanitize.hpp says the same).
#if defined(__SANITIZE_THREAD__)
#define UPROBE_OPT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UPROBE_OPT_TSAN 1
#endif
#endif
#ifdef UPROBE_OPT_TSAN
#include <sanitizer/tsan_interface.h>
#endif
// Not instrumented by ThreadSanitizer: there every access calls into the
// TSan runtime, which uses vector registers, before they are saved. (TSan
// builds always save them: sites.cpp, needs_vector().)
#define UPROBE_OPT_NO_TSAN __attribute__((no_sanitize("thread")))

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
__attribute__((noinline)) UPROBE_OPT_NO_TSAN void hit_saving_vector_state(std::uint64_t* frame, const uprobe::arch::OptSite* site) {
  alignas(64) std::uint8_t area[kXsaveMax];
  const XsaveInfo xi = g_xsave;
  const auto lo = static_cast<std::uint32_t>(xi.mask), hi = static_cast<std::uint32_t>(xi.mask >> 32);
  if (xi.ok) {
    for (std::size_t i = 512; i < 576; ++i) area[i] = 0;  // XSAVE header
    asm volatile("xsavec %0" : "=m"(area) : "a"(lo), "d"(hi) : "memory");
  }
#ifdef UPROBE_OPT_TSAN
  // The descriptor was written through the XOL alias before the jump here
  // was patched in (sites.cpp, tsan_publish_stub()): tell TSan.
  __tsan_acquire(const_cast<std::uint32_t*>(&site->needs_vector));
#endif
  uprobe_opt_hit(frame, site);
  if (xi.ok) asm volatile("xrstor %0" : : "m"(area), "a"(lo), "d"(hi) : "memory");
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) UPROBE_OPT_NO_TSAN void uprobe_opt_entry(std::uint64_t* frame,
                                                                       const uprobe::arch::OptSite* site) {
  if (site->needs_vector != 0)
    hit_saving_vector_state(frame, site);
  else
    uprobe_opt_hit(frame, site);  // a tail call
}
