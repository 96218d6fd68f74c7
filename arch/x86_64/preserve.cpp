// SPDX-License-Identifier: MIT
// What a probe site makes live, preserved around consumers compiled normally:
// call_preserving(). Compiled with -mgeneral-regs-only: nothing here touches
// a vector or x87 register except the inline assembly that saves and
// restores them.
//
// Measured on the development machine (AMD Zen 4, AVX-512; TSC ticks for a
// save + restore around an empty call): every zmm0-31 and k0-7 by plain
// moves 27, zmm0-7 only 18, xsavec/xrstor of the components in use 275-300,
// fxsave/fxrstor 155, xgetbv(1) alone 29, stmxcsr 9, fnstsw 10, popfq 10. So the state
// is moved by hand, never by xsave: at a function entry or a return
// zmm0-15 cost a few ticks more than the argument registers zmm0-7, which
// also covers callers that keep values in caller-saved registers across a
// call (arch.hpp, SaveMode::entry); zmm16-31 and k0-7 would cost 13 more.
// How wide the moves are:
//  - PreserveStrategy::in_use (every CPU but AMD's): the width the CPU says is in use (XINUSE,
//    xgetbv(1)): 512-bit moves only when zmm state is in use (a 512-bit
//    instruction can lower the clock of an Intel core for milliseconds), and
//    vzeroupper before the restore when the upper halves were clean (dirty
//    upper state makes Intel's SSE code slower, or pay a transition).
//  - PreserveStrategy::wide (AMD): the widest registers the CPU has, always; no xgetbv (AMD
//    has neither the AVX-512 clock penalty nor the SSE/AVX transition).
// The strategy also picks how the SSE-only save (preserve_sse.hpp) puts the
// MXCSR back: read and loaded only when changed (in_use), or loaded unread
// (wide: on Zen 4 an stmxcsr right after the callbacks' floating-point work
// waited ~12 ticks for it, an ldmxcsr of an unchanged value ~0).
// Any site that is not a function entry or return reads XINUSE whatever the
// strategy: the x87 state is saved (fxsave64) only when it is in use.

#include <cpuid.h>
#include <sys/platform/x86.h>

#include <atomic>
#include <cstdint>

#include "arch.hpp"
#include "preserve_sse.hpp"

// Not instrumented by ThreadSanitizer: its runtime, called on every access of
// instrumented code, uses SSE registers before they are saved.
#define UPROBE_NO_TSAN __attribute__((no_sanitize("thread")))

namespace uprobe::arch {
namespace {

// XCR0 / XINUSE components.
constexpr unsigned kX87 = 1u << 0, kYmm = 1u << 2, kOpmask = 1u << 5, kZmmHi256 = 1u << 6,
                   kHi16Zmm = 1u << 7;

// What one call saves and restores (a plan, computed per call).
constexpr unsigned kPXmm = 1u << 0;         // xmm0-15, 128 bits (legacy SSE moves)
constexpr unsigned kPYmm = 1u << 1;         // ymm0-15, 256 bits (VEX)
constexpr unsigned kPZmm = 1u << 2;         // zmm0-15, 512 bits (EVEX)
constexpr unsigned kPHi16 = 1u << 3;        // zmm16-31, 512 bits
constexpr unsigned kPK = 1u << 4;           // k0-7, 64 bits (AVX512BW)
constexpr unsigned kPKw = 1u << 5;          // k0-7, 16 bits (AVX512F without BW)
constexpr unsigned kPVzeroupper = 1u << 6;  // the upper halves were clean: vzeroupper before the restore
constexpr unsigned kPZeroHi16 = 1u << 7;    // zmm16-31 were in their initial state: zero them after
constexpr unsigned kPZeroK = 1u << 8;       // k0-7 were: zero them after
constexpr unsigned kPX87Save = 1u << 9;     // the x87 state is in use: fxsave64, fninit, fxrstor64
constexpr unsigned kPX87Init = 1u << 10;    // it was in its initial state: back to it if the callback left it otherwise
constexpr unsigned kPX87Ret = 1u << 11;     // a return: st0/st1 (the x87 stack depth) set aside

/// What the CPU and the kernel enable, as flag bits (kC*), computed once.
constexpr unsigned kCAvx = 1u << 0;       // ymm enabled (CPUID AVX, XCR0 SSE|YMM)
constexpr unsigned kCAvx512 = 1u << 1;    // zmm and k enabled (CPUID AVX512F, XCR0 opmask|ZMM_Hi256|Hi16_ZMM)
constexpr unsigned kCAvx512bw = 1u << 2;  // 64-bit k registers
constexpr unsigned kCAvx512vl = 1u << 3;  // 128-bit forms of the EVEX instructions
constexpr unsigned kCXgetbv1 = 1u << 4;   // xgetbv with ecx = 1 (XINUSE)
constexpr unsigned kCAmd = 1u << 5;       // AuthenticAMD / HygonGenuine
constexpr unsigned kCReady = 1u << 31;

/// What the CPU and the kernel enable. The features from what glibc's
/// dynamic linker found at start-up (<sys/platform/x86.h>, no cpuid here),
/// the vendor from one cpuid: in a VM each cpuid is a trap to the hypervisor
/// (~12 us on the 2-vCPU KVM guests here), and this runs in every process
/// that loads libuprobe (uprobe-trace's CLI and each traced process).
UPROBE_NO_TSAN unsigned detect() noexcept {
  unsigned c = kCReady;
  unsigned a, b, cx, d;
  __cpuid(0, a, b, cx, d);
  if ((b == 0x68747541 && d == 0x69746e65 && cx == 0x444d4163) ||  // "AuthenticAMD"
      (b == 0x6f677948 && d == 0x6e65476e && cx == 0x656e6975))    // "HygonGenuine"
    c |= kCAmd;
  if (!CPU_FEATURE_ACTIVE(OSXSAVE)) return c;  // SSE only
  // (ACTIVE: the CPU has it and XCR0 enables its state: SSE|YMM for AVX,
  // opmask|ZMM_Hi256|Hi16_ZMM for AVX512F.)
  if (CPU_FEATURE_ACTIVE(AVX)) c |= kCAvx;
  if ((c & kCAvx) && CPU_FEATURE_ACTIVE(AVX512F)) {
    c |= kCAvx512;
    if (CPU_FEATURE_ACTIVE(AVX512BW)) c |= kCAvx512bw;
    if (CPU_FEATURE_ACTIVE(AVX512VL)) c |= kCAvx512vl;
  }
  if (CPU_FEATURE_PRESENT(XGETBV_ECX_1)) c |= kCXgetbv1;
  return c;
}

// Filled in by the first call (or before main(), below): cpuid and xgetbv,
// async-signal-safe and the same every time, so a race only repeats them.
std::atomic<unsigned> g_caps{0};
std::atomic<int> g_strategy{-1};  // PreserveStrategy, -1 until known

UPROBE_NO_TSAN inline unsigned caps() noexcept {
  unsigned c = g_caps.load(std::memory_order_relaxed);
  if (__builtin_expect(!(c & kCReady), 0)) {
    c = detect();
    g_caps.store(c, std::memory_order_relaxed);
  }
  return c;
}

UPROBE_NO_TSAN inline PreserveStrategy strategy(unsigned c) noexcept {
  const int s = g_strategy.load(std::memory_order_relaxed);
  if (__builtin_expect(s >= 0, 1)) return static_cast<PreserveStrategy>(s);
  return (c & kCXgetbv1) && !(c & kCAmd) ? PreserveStrategy::in_use : PreserveStrategy::wide;
}

[[maybe_unused]] const bool g_detected_early = (caps(), true);

UPROBE_NO_TSAN unsigned xinuse() noexcept {
  unsigned lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  (void)hi;
  return lo;
}

/// The plan of each mode when it needs no XINUSE (0 when it does), kept
/// for the strategy in force: a hit at an entry or a return on AMD reads
/// its plan in one load.
std::atomic<unsigned> g_fixed_plan[4];

}  // namespace

std::atomic<bool> g_sse_restore_unread{false};

namespace {

UPROBE_NO_TSAN unsigned plan_for(SaveMode mode) noexcept;

UPROBE_NO_TSAN void refresh_fixed_plans() noexcept {
  g_fixed_plan[0].store(0, std::memory_order_relaxed);
  g_sse_restore_unread.store(strategy(caps()) == PreserveStrategy::wide, std::memory_order_relaxed);
  for (SaveMode m : {SaveMode::entry, SaveMode::ret, SaveMode::full}) {
    const unsigned c = caps();
    const bool needs_xinuse = (m == SaveMode::full || strategy(c) == PreserveStrategy::in_use) && (c & kCXgetbv1);
    g_fixed_plan[static_cast<int>(m)].store(needs_xinuse ? 0 : plan_for(m), std::memory_order_relaxed);
  }
}

[[maybe_unused]] const bool g_plans_early = (refresh_fixed_plans(), true);

UPROBE_NO_TSAN unsigned plan_for(SaveMode mode) noexcept {
  const unsigned c = caps();
  const bool full = mode == SaveMode::full;
  const unsigned k = c & kCAvx512bw ? kPK : kPKw;
  if ((full || strategy(c) == PreserveStrategy::in_use) && (c & kCXgetbv1)) {
    const unsigned u = xinuse();
    unsigned p = 0;
    if (u & kZmmHi256)
      p |= kPZmm;
    else
      p |= (u & kYmm ? kPYmm : kPXmm) | (c & kCAvx ? kPVzeroupper : 0);
    if ((c & kCAvx512) && full) {  // zmm16-31 and k0-7 at an entry or return: see SaveMode::entry
      p |= u & kHi16Zmm ? kPHi16 : kPZeroHi16;
      p |= u & kOpmask ? k : kPZeroK;
    }
    if (full) p |= u & kX87 ? kPX87Save : kPX87Init;
    if (mode == SaveMode::ret) p |= kPX87Ret;
    return p;
  }
  // The widest registers there are (and, without XINUSE, the whole x87 state
  // at a site that is not an entry or a return).
  const unsigned wide = c & kCAvx512 ? kPZmm | (full ? kPHi16 | k : 0) : c & kCAvx ? kPYmm : kPXmm;
  return wide | (full ? kPX87Save : mode == SaveMode::ret ? kPX87Ret : 0);
}

/// The save area: vector registers at a 64-byte stride (whatever the width
/// saved), the k registers, the fxsave64 image, st0/st1, the control words.
struct alignas(64) Area {
  std::uint8_t vec[32][64];
  std::uint64_t k[8];
  alignas(16) std::uint8_t fx[512];
  alignas(16) std::uint8_t st[2][16];
  std::uint32_t mxcsr;
  std::uint16_t fcw;
};

constexpr std::uint32_t kDefaultMxcsr = 0x1f80;  // all exceptions masked, round to nearest
constexpr std::uint16_t kDefaultFcw = 0x037f;    // the same, 64-bit precision

#define UPROBE_V16(op, base)                                                                                        \
  op(0, base) op(1, base) op(2, base) op(3, base) op(4, base) op(5, base) op(6, base) op(7, base) op(8, base)       \
      op(9, base) op(10, base) op(11, base) op(12, base) op(13, base) op(14, base) op(15, base)
#define UPROBE_V16HI(op, base)                                                                                       \
  op(16, base) op(17, base) op(18, base) op(19, base) op(20, base) op(21, base) op(22, base) op(23, base)          \
      op(24, base) op(25, base) op(26, base) op(27, base) op(28, base) op(29, base) op(30, base) op(31, base)
#define UPROBE_K8(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)

#define SAVE_X(n, b) "movdqa %%xmm" #n ", " #n "*64(%0)\n\t"
#define SAVE_Y(n, b) "vmovdqa %%ymm" #n ", " #n "*64(%0)\n\t"
#define SAVE_Z(n, b) "vmovdqa64 %%zmm" #n ", " #n "*64(%0)\n\t"
#define LOAD_X(n, b) "movdqa " #n "*64(%0), %%xmm" #n "\n\t"
#define LOAD_Y(n, b) "vmovdqa " #n "*64(%0), %%ymm" #n "\n\t"
#define LOAD_Z(n, b) "vmovdqa64 " #n "*64(%0), %%zmm" #n "\n\t"
#define ZERO_HI(n, b) "vpxord %%xmm" #n ", %%xmm" #n ", %%xmm" #n "\n\t"  /* AVX512VL: zeroes all 512 bits */
#define ZERO_HIZ(n, b) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
#define SAVE_KQ(n) "kmovq %%k" #n ", " #n "*8(%0)\n\t"
#define SAVE_KW(n) "kmovw %%k" #n ", " #n "*8(%0)\n\t"
#define LOAD_KQ(n) "kmovq " #n "*8(%0), %%k" #n "\n\t"
#define LOAD_KW(n) "kmovw " #n "*8(%0), %%k" #n "\n\t"
#define ZERO_K(n) "kxorw %%k" #n ", %%k" #n ", %%k" #n "\n\t"

UPROBE_NO_TSAN inline void save_vectors(unsigned p, Area& a) noexcept {
  std::uint8_t* v = &a.vec[0][0];
  if (p & kPZmm)
    asm volatile(UPROBE_V16(SAVE_Z, 0) : : "r"(v) : "memory");
  else if (p & kPYmm)
    asm volatile(UPROBE_V16(SAVE_Y, 0) : : "r"(v) : "memory");
  else
    asm volatile(UPROBE_V16(SAVE_X, 0) : : "r"(v) : "memory");
  if (p & kPHi16) asm volatile(UPROBE_V16HI(SAVE_Z, 0) : : "r"(v) : "memory");
  if (p & kPK)
    asm volatile(UPROBE_K8(SAVE_KQ) : : "r"(a.k) : "memory");
  else if (p & kPKw)
    asm volatile(UPROBE_K8(SAVE_KW) : : "r"(a.k) : "memory");
}

UPROBE_NO_TSAN inline void restore_vectors(unsigned p, const Area& a) noexcept {
  const std::uint8_t* v = &a.vec[0][0];
  if (p & kPVzeroupper) asm volatile("vzeroupper" : : : "memory");
  if (p & kPZmm)
    asm volatile(UPROBE_V16(LOAD_Z, 0) : : "r"(v) : "memory");
  else if (p & kPYmm)
    asm volatile(UPROBE_V16(LOAD_Y, 0) : : "r"(v) : "memory");
  else
    asm volatile(UPROBE_V16(LOAD_X, 0) : : "r"(v) : "memory");
  if (p & kPHi16)
    asm volatile(UPROBE_V16HI(LOAD_Z, 0) : : "r"(v) : "memory");
  else if ((p & kPZeroHi16) && (caps() & kCAvx512vl))
    asm volatile(UPROBE_V16HI(ZERO_HI, 0) : : : "memory");
  else if (p & kPZeroHi16)
    asm volatile(UPROBE_V16HI(ZERO_HIZ, 0) : : : "memory");
  if (p & kPK)
    asm volatile(UPROBE_K8(LOAD_KQ) : : "r"(a.k) : "memory");
  else if (p & kPKw)
    asm volatile(UPROBE_K8(LOAD_KW) : : "r"(a.k) : "memory");
  else if (p & kPZeroK)
    asm volatile(UPROBE_K8(ZERO_K) : : : "memory");
}

/// The x87 side before the callback; returns how many st registers a
/// return set aside (0..2), or -1 when the whole state went to a.fx.
UPROBE_NO_TSAN inline int save_x87(unsigned p, Area& a) noexcept {
  if (p & kPX87Save) {
    asm volatile("fxsave64 %0\n\tfninit" : "=m"(a.fx) : : "memory");
    return -1;
  }
  if (!(p & kPX87Ret)) return 0;
  // A return leaves 0, 1 or 2 values on the x87 stack (long double, complex
  // long double): TOP is 0, 7 or 6. They are popped (fstpt: exact, raises
  // nothing) so that the callbacks find the empty stack the ABI promises
  // them, and pushed back after.
  std::uint16_t sw;
  asm volatile("fnstsw %0" : "=a"(sw));
  switch ((sw >> 11) & 7) {
    case 0:
      return 0;
    case 7:
      asm volatile("fstpt %0" : "=m"(a.st[0]) : : "memory");
      return 1;
    case 6:
      asm volatile("fstpt %0\n\tfstpt %1" : "=m"(a.st[0]), "=m"(a.st[1]) : : "memory");
      return 2;
    default:  // deeper than the ABI allows: all of it
      asm volatile("fxsave64 %0\n\tfninit" : "=m"(a.fx) : : "memory");
      return -1;
  }
}

UPROBE_NO_TSAN inline void restore_x87(unsigned p, int depth, const Area& a) noexcept {
  if (depth < 0) {
    asm volatile("fxrstor64 %0" : : "m"(a.fx) : "memory");
    return;
  }
  if (depth == 2)
    asm volatile("fldt %0\n\tfldt %1" : : "m"(a.st[1]), "m"(a.st[0]) : "memory");
  else if (depth == 1)
    asm volatile("fldt %0" : : "m"(a.st[0]) : "memory");
  // At a return the x87 status word is not kept (the SysV ABI does not keep
  // it across a call: a callee may raise exceptions in it), only its TOP,
  // with the values: a second fnstsw to compare it costs 10 ticks a return.
  if (p & kPX87Init) {
    // The x87 state was in its initial configuration (FSW 0, stack empty):
    // a callback that used it leaves flags or TOP behind; fninit puts the
    // initial state back (the control word is restored below).
    std::uint16_t sw;
    asm volatile("fnstsw %0" : "=a"(sw));
    if (sw != 0) asm volatile("fninit" : : : "memory");
  }
}

}  // namespace

// (In the optimized path's section: a ThreadSanitizer build's stub entry calls it before its read-side section.)
UPROBE_OPT_PATH_TEXT UPROBE_NO_TSAN void call_preserving(SaveMode mode, void (*fn)(void*), void* ctx) noexcept {
  Area a;
  unsigned p = g_fixed_plan[static_cast<int>(mode) & 3].load(std::memory_order_relaxed);
  if (!p) p = plan_for(mode);
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(a.mxcsr), "=m"(a.fcw) : : "memory");
  const int depth = save_x87(p, a);  // (its fnstsw then waits for none of the vector stores)
  save_vectors(p, a);
  // The callbacks run with the default floating-point controls, as a signal
  // handler does (the kernel gives one the initial FPU state); most programs
  // run with them already. The status flags stay as they are: loading a
  // different MXCSR waits for every vector instruction in flight (the saves
  // above), 40-70 ticks here, and the flags change nothing a callback computes.
  if ((a.mxcsr & ~0x3fu) != kDefaultMxcsr) asm volatile("ldmxcsr %0" : : "m"(kDefaultMxcsr) : "memory");
  if (a.fcw != kDefaultFcw) asm volatile("fldcw %0" : : "m"(kDefaultFcw) : "memory");
  fn(ctx);
  // The MXCSR first: an ldmxcsr that changes it (the callbacks raised a
  // flag) waits for the vector instructions in flight, and the restore's
  // loads would be 32 more of them.
  asm volatile("ldmxcsr %0" : : "m"(a.mxcsr) : "memory");
  restore_x87(p, depth, a);
  asm volatile("fldcw %0" : : "m"(a.fcw) : "memory");
  restore_vectors(p, a);
}

bool returns_true_only(const void* code) noexcept {
  const auto* b = static_cast<const std::uint8_t*>(code);
  std::size_t i = 0;
  auto next = [&](std::uint8_t want) { return b[i] == want ? (++i, true) : false; };
  if (b[0] == 0xf3 && b[1] == 0x0f && b[2] == 0x1e && b[3] == 0xfa) i = 4;  // endbr64
  if (next(0xb8)) {                                                        // mov $1, %eax
    if (!next(0x01) || !next(0x00) || !next(0x00) || !next(0x00)) return false;
  } else if (next(0xb0)) {  // mov $1, %al
    if (!next(0x01)) return false;
  } else {
    return false;
  }
  return next(0xc3) || (next(0xf3) && next(0xc3));  // ret, rep ret
}

PreserveStrategy preserve_strategy() noexcept { return strategy(caps()); }

bool set_preserve_strategy(PreserveStrategy s) noexcept {
  if (s == PreserveStrategy::in_use && !(caps() & kCXgetbv1)) return false;
  g_strategy.store(static_cast<int>(s), std::memory_order_relaxed);
  refresh_fixed_plans();
  return true;
}

}  // namespace uprobe::arch
