// SPDX-License-Identifier: MIT
#pragma once
/// @file preserve_sse.hpp
/// The save around callbacks whose code analyze_clobbers() (frames.hpp) read as
/// legacy SSE only, inline in the hit paths (src/hit/dispatch.cpp,
/// uretprobe.cpp: no call level between the save and the consumers):
/// xmm0 .. xmm(n - 1) by legacy moves (the upper halves of
/// ymm/zmm stay as they are) and the MXCSR, loaded again only when the
/// callbacks changed it (a load waits for the vector instructions in flight);
/// nothing for code that touches no xmm register (n == 0). How the MXCSR is
/// put back follows the preservation strategy (frames.hpp): read and loaded
/// only when changed (PreserveStrategy::in_use, Intel: a load waits for the
/// vector instructions in flight), or loaded unread (PreserveStrategy::wide,
/// AMD: a read right after the callbacks' floating-point work waits for it,
/// ~12 of a plain consumer's 45 ticks on Zen 4; a load of an unchanged value
/// costs nothing measurable there).
/// The callbacks start with the default MXCSR control bits, its status flags
/// as they were. For code compiled with -mgeneral-regs-only, run before
/// anything touched a vector register. Async-signal-safe.

#include <atomic>
#include <cstdint>

namespace uprobe::arch {

/// Whether sse_restore() loads the saved MXCSR without reading the current
/// one: PreserveStrategy::wide in force (preserve.cpp sets it with the
/// strategy). Either way restores the same value.
extern std::atomic<bool> g_sse_restore_unread;

/// What sse_save() keeps (256 bytes and the MXCSR).
struct SseSave {
  struct alignas(16) Xmm {
    std::uint8_t b[16];
  };
  Xmm x[16];
  std::uint32_t mxcsr;
};

#define UPROBE_SSE_SAVE_CASE(n)                                                  \
  case (n) + 1:                                                                  \
    asm volatile("movdqa %%xmm" #n ", %0" : "=m"(s.x[n]) : : "memory");         \
    [[fallthrough]];
#define UPROBE_SSE_LOAD_CASE(n)                                                  \
  case (n) + 1:                                                                  \
    asm volatile("movdqa %0, %%xmm" #n : : "m"(s.x[n]) : "memory");             \
    [[fallthrough]];

/// Saves the MXCSR and xmm0 .. xmm(n - 1) (n <= 16), then gives the callbacks
/// the default control bits (0x1f80) when the program's differ. n == 0 (code
/// read as touching no xmm register at all: integer code) saves nothing, the
/// MXCSR included: every legacy SSE instruction that reads or writes the
/// MXCSR names an xmm register, and the reading refuses ldmxcsr, fxrstor and
/// xrstor (analyze_clobbers()); two MXCSR reads were ~4 of such a hit's 40 ticks.
inline void sse_save(unsigned n, SseSave& s) noexcept {
  static constexpr std::uint32_t kDefault = 0x1f80;
  if (n == 0) return;
  asm volatile("stmxcsr %0" : "=m"(s.mxcsr) : : "memory");
  // xmm0 alone (code that touches one double: the common case) without the
  // switch's indirect jump (here and in sse_restore(): ~2 of a plain
  // consumer's ~31 ticks per optimized hit, Intel Xeon, session 31).
  if (__builtin_expect(n == 1, 1))
    asm volatile("movdqa %%xmm0, %0" : "=m"(s.x[0]) : : "memory");
  else switch (n) {
    UPROBE_SSE_SAVE_CASE(15) UPROBE_SSE_SAVE_CASE(14) UPROBE_SSE_SAVE_CASE(13) UPROBE_SSE_SAVE_CASE(12)
    UPROBE_SSE_SAVE_CASE(11) UPROBE_SSE_SAVE_CASE(10) UPROBE_SSE_SAVE_CASE(9) UPROBE_SSE_SAVE_CASE(8)
    UPROBE_SSE_SAVE_CASE(7) UPROBE_SSE_SAVE_CASE(6) UPROBE_SSE_SAVE_CASE(5) UPROBE_SSE_SAVE_CASE(4)
    UPROBE_SSE_SAVE_CASE(3) UPROBE_SSE_SAVE_CASE(2) UPROBE_SSE_SAVE_CASE(1) UPROBE_SSE_SAVE_CASE(0)
    default:
      break;
  }
  if ((s.mxcsr & ~0x3fu) != kDefault) asm volatile("ldmxcsr %0" : : "m"(kDefault) : "memory");
}

/// Puts back what sse_save() kept: the MXCSR (unread, or when it differs
/// now: g_sse_restore_unread), then the xmm registers (nothing for n == 0).
inline void sse_restore(unsigned n, const SseSave& s) noexcept {
  if (n == 0) return;
  if (g_sse_restore_unread.load(std::memory_order_relaxed)) {
    asm volatile("ldmxcsr %0" : : "m"(s.mxcsr) : "memory");
  } else {
    std::uint32_t now;
    asm volatile("stmxcsr %0" : "=m"(now) : : "memory");
    if (now != s.mxcsr) asm volatile("ldmxcsr %0" : : "m"(s.mxcsr) : "memory");
  }
  if (__builtin_expect(n == 1, 1))
    asm volatile("movdqa %0, %%xmm0" : : "m"(s.x[0]) : "memory");
  else switch (n) {
    UPROBE_SSE_LOAD_CASE(15) UPROBE_SSE_LOAD_CASE(14) UPROBE_SSE_LOAD_CASE(13) UPROBE_SSE_LOAD_CASE(12)
    UPROBE_SSE_LOAD_CASE(11) UPROBE_SSE_LOAD_CASE(10) UPROBE_SSE_LOAD_CASE(9) UPROBE_SSE_LOAD_CASE(8)
    UPROBE_SSE_LOAD_CASE(7) UPROBE_SSE_LOAD_CASE(6) UPROBE_SSE_LOAD_CASE(5) UPROBE_SSE_LOAD_CASE(4)
    UPROBE_SSE_LOAD_CASE(3) UPROBE_SSE_LOAD_CASE(2) UPROBE_SSE_LOAD_CASE(1) UPROBE_SSE_LOAD_CASE(0)
    default:
      break;
  }
}

#undef UPROBE_SSE_SAVE_CASE
#undef UPROBE_SSE_LOAD_CASE

}  // namespace uprobe::arch
