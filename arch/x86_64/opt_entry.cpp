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

/// Copies the 18 words of a uprobe::Regs frame, either side possibly
/// misaligned: 8-byte __builtin_memcpy is one general-register move each. The
/// empty asm keeps the compiler from turning the loop into a memcpy() call
/// (libc's may use vector registers, which are not saved for every site).
inline void copy_regs(void* to, const void* from) noexcept {
  for (int i = 0; i < 18; ++i) {
    std::uint64_t w;
    __builtin_memcpy(&w, static_cast<const unsigned char*>(from) + 8 * i, 8);
    asm("" : "+r"(w));
    __builtin_memcpy(static_cast<unsigned char*>(to) + 8 * i, &w, 8);
  }
}

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
  // The stub pushed the frame in uprobe::Regs layout; 136 = red zone + target slot.
  // The frame has the site's stack alignment: hand-written code may reach a
  // site with rsp not a multiple of 8, and a misaligned Regs is undefined
  // behaviour (UBSan's alignment check), for the handlers too. Then the
  // consumers see an aligned copy, written back below (word by word with
  // general registers: no memcpy, which may use vector registers unsaved).
  static_assert(sizeof(uprobe::Regs) == 18 * 8);
  const bool misaligned = reinterpret_cast<std::uintptr_t>(frame) % alignof(uprobe::Regs) != 0;
  uprobe::Regs copy;
  if (misaligned) copy_regs(&copy, frame);
  auto& regs = misaligned ? copy : *reinterpret_cast<uprobe::Regs*>(frame);
  const std::uint64_t flags = regs.rflags;
  regs.rip = site->site;
  regs.rsp += 136;
  const std::uint64_t site_rsp = regs.rsp;
  uprobe::detail::optimized_hit(*site, regs);
  regs.rflags = (flags & ~0xdd5ull) | (regs.rflags & 0xdd5ull);
  const std::uint64_t target = regs.rip != site->site ? regs.rip : site->resume;
  // The stub ends with `pop %rsp; ret $128`: the target goes 136 bytes below
  // the stack pointer to continue with (below its red zone). A slot that
  // would fall inside this frame (a handler lowering rsp by less than the
  // frame) cannot be written before the frame is popped: rsp stays.
  std::uint64_t slot = regs.rsp - 136;
  const auto lo_frame = reinterpret_cast<std::uint64_t>(frame), hi_frame = lo_frame + 19 * 8;
  if (regs.rsp != site_rsp && slot + 8 > lo_frame && slot < hi_frame) slot = site_rsp - 136;
  __builtin_memcpy(reinterpret_cast<void*>(slot), &target, 8);  // possibly misaligned too
  regs.rsp = slot;
  if (misaligned)  // the slot is outside the 18 words (see above)
    copy_regs(frame, &copy);
  if (xi.ok) asm volatile("xrstor %0" : : "m"(area), "a"(lo), "d"(hi) : "memory");
}
