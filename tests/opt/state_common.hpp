// SPDX-License-Identifier: MIT
#pragma once
// What tests/opt's vector-state tests share (state_test.cpp, sse_state_test.cpp):
// the fixtures' state layout and entry points (state_fixtures.S), the levels,
// random inputs, the comparison of two states by what a site promises, and
// the floating-point environment a consumer starts with.

#include <immintrin.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "opt_common.hpp"

#if defined(UPROBE_STATE_OTHER_STRATEGY)
#include "arch.hpp"  // the *_other builds (linked with libuprobe.a): the strategy the CPU does not choose
#endif

using namespace opttest;

namespace {

#if defined(UPROBE_STATE_OTHER_STRATEGY)
/// For a test's life, the other vendor's way of preserving (arch::
/// PreserveStrategy::in_use: XINUSE-sized moves, vzeroupper, the MXCSR read
/// before it is loaded again, every CPU but AMD's; wide: the widest moves,
/// the MXCSR loaded unread, AMD's), so that one machine runs both.
class OtherStrategy {
 public:
  /// False (nothing changed) where the other is in_use and the CPU has no xgetbv(1).
  bool engage() {
    using uprobe::arch::PreserveStrategy;
    saved_ = uprobe::arch::preserve_strategy();
    const PreserveStrategy other =
        saved_ == PreserveStrategy::wide ? PreserveStrategy::in_use : PreserveStrategy::wide;
    if (!uprobe::arch::set_preserve_strategy(other)) return false;
    engaged_ = true;
    return true;
  }
  ~OtherStrategy() {
    if (engaged_) uprobe::arch::set_preserve_strategy(saved_);
  }

 private:
  bool engaged_ = false;
  uprobe::arch::PreserveStrategy saved_ = uprobe::arch::PreserveStrategy::wide;
};
#endif

/// See state_fixtures.S.
struct alignas(64) AbiState {
  std::uint8_t vec[32][64];
  std::uint64_t k[8];
  std::uint32_t mxcsr;
  std::uint16_t fcw;
  std::uint16_t fsw;
  std::uint32_t depth;
  std::uint32_t flags;
  std::uint8_t st[3][16];
  alignas(64) std::uint8_t fx[512];
};
static_assert(offsetof(AbiState, k) == 2048 && offsetof(AbiState, mxcsr) == 2112 && offsetof(AbiState, fsw) == 2118 &&
              offsetof(AbiState, st) == 2128 && offsetof(AbiState, fx) == 2176 && sizeof(AbiState) == 2688);

}  // namespace

extern "C" {
extern AbiState state_in, state_seen, state_after;
void state_call_entry_0();
void state_call_entry_1();
void state_call_entry_2();
void state_entry_fn_0();
void state_entry_fn_1();
void state_entry_fn_2();
void state_call_ret_0();
void state_call_ret_1();
void state_call_ret_2();
void state_ret_fn_0();
void state_ret_fn_1();
void state_ret_fn_2();
void state_mid_0();
void state_mid_1();
void state_mid_2();
extern const std::uint64_t state_mid_0_site, state_mid_1_site, state_mid_2_site;
}

namespace {

enum class Level { sse, avx, avx512 };
const char* level_name(Level l) { return l == Level::sse ? "sse" : l == Level::avx ? "avx" : "avx512"; }
int idx(Level l) { return static_cast<int>(l); }

bool cpu_has(Level l) {
  __builtin_cpu_init();
  switch (l) {
    case Level::sse: return true;
    case Level::avx: return __builtin_cpu_supports("avx");
    case Level::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
}

void (*const kCallEntry[3])() = {state_call_entry_0, state_call_entry_1, state_call_entry_2};
void (*const kEntryFn[3])() = {state_entry_fn_0, state_entry_fn_1, state_entry_fn_2};
void (*const kCallRet[3])() = {state_call_ret_0, state_call_ret_1, state_call_ret_2};
void (*const kRetFn[3])() = {state_ret_fn_0, state_ret_fn_1, state_ret_fn_2};
void (*const kMid[3])() = {state_mid_0, state_mid_1, state_mid_2};
const void* mid_site(Level l) {
  const std::uint64_t off[3] = {state_mid_0_site, state_mid_1_site, state_mid_2_site};
  return at(kMid[idx(l)], off[idx(l)]);
}

constexpr std::uint32_t kMxcsrIn = 0xbfe0 | 0x11;  // FTZ, round down, masks, DAZ; PE, UE, IE raised
constexpr std::uint16_t kFcwIn = 0x0c7f;           // x87: round toward zero, 24-bit precision

std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Random vectors and k registers, the control words, `depth` x87 values
/// (a normal number, a denormal, a NaN with a payload: fldt/fstpt must move
/// their 80 bits untouched).
void fill_input(std::uint64_t seed, std::uint32_t depth, bool raise_pe, std::uint16_t fcw = kFcwIn) {
  std::memset(&state_in, 0, sizeof state_in);
  std::uint64_t s = seed;
  for (auto& v : state_in.vec)
    for (std::size_t i = 0; i < sizeof v; i += 8) {
      const std::uint64_t w = mix(s);
      std::memcpy(v + i, &w, 8);
    }
  for (auto& k : state_in.k) k = mix(s);
  state_in.mxcsr = kMxcsrIn;
  state_in.fcw = fcw;
  state_in.depth = depth;
  state_in.flags = raise_pe ? 1 : 0;
  const long double vals[3] = {1.0L / 3 + static_cast<long double>(seed), -3.0L * static_cast<long double>(seed + 1),
                               0};
  std::memcpy(state_in.st[0], &vals[0], 10);
  std::memcpy(state_in.st[1], &vals[1], 10);
  // A quiet NaN with a payload (sign 1, exponent all ones, integer bit, quiet bit).
  const std::uint64_t mant = 0xC000000000000000ull | (mix(s) & 0x3fffffffffffffffull);
  const std::uint16_t se = 0xffff;
  std::memcpy(state_in.st[2], &mant, 8);
  std::memcpy(state_in.st[2] + 8, &se, 2);
}

std::string hexs(const std::uint8_t* p, std::size_t n) {
  std::string out;
  char b[4];
  for (std::size_t i = n; i-- > 0;) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    out += b;
  }
  return out;
}

/// What of a state to compare (the promises: kAll, kEntry, kRet, kFull below).
struct What {
  bool vec = true;     // the vector registers of the level (0-15; 16-31 and k0-7 at avx512 with hi16)
  bool hi16 = true;    // zmm16-31 and k0-7 (not kept at entries and returns: SiteState::abi)
  bool ctl = true;     // MXCSR, x87 control word
  bool x87 = false;    // TOP, tags, the valid st registers
  bool fsw_all = false;  // the whole FSW (exception flags and condition codes too)
};
/// The registers the fixtures load (the unprobed runs' sanity checks).
constexpr What kAll{true, true, true, false, false};
/// A function entry (SiteState::abi): vectors 0-15, MXCSR, x87 control word.
constexpr What kEntry{true, false, true, false, false};
/// A return: the same, and the x87 stack (TOP, tags, values).
constexpr What kRet{true, false, true, true, false};
/// Anywhere else, or SiteState::full: everything.
constexpr What kFull{true, true, true, true, true};


/// "" if `got` equals `want` in what `w` names (at level `l`); else the differences.
std::string diff(Level l, const AbiState& want, const AbiState& got, What w) {
  std::string d;
  int n = 0;
  auto add = [&](const std::string& s) {
    if (n++ < 10) d += s + "; ";
  };
  if (w.vec) {
    const int regs = l == Level::avx512 && w.hi16 ? 32 : 16;
    const std::size_t width = l == Level::sse ? 16 : l == Level::avx ? 32 : 64;
    const char* name = l == Level::sse ? "xmm" : l == Level::avx ? "ymm" : "zmm";
    for (int r = 0; r < regs; ++r)
      if (std::memcmp(want.vec[r], got.vec[r], width) != 0)
        add(std::string(name) + std::to_string(r) + " " + hexs(got.vec[r], width) + " want " +
            hexs(want.vec[r], width));
    if (l == Level::avx512 && w.hi16)
      for (int k = 0; k < 8; ++k)
        if (want.k[k] != got.k[k]) add("k" + std::to_string(k) + " " + hex(got.k[k]) + " want " + hex(want.k[k]));
  }
  if (w.ctl) {
    if (want.mxcsr != got.mxcsr) add("mxcsr " + hex(got.mxcsr) + " want " + hex(want.mxcsr));
    if (want.fcw != got.fcw) add("x87 cw " + hex(got.fcw) + " want " + hex(want.fcw));
  }
  if (w.x87) {
    const std::uint16_t mask = w.fsw_all ? 0xffff : 0x3800;  // TOP, or everything
    if ((want.fsw & mask) != (got.fsw & mask)) add("x87 sw " + hex(got.fsw) + " want " + hex(want.fsw));
    const std::uint8_t tags = want.fx[4];
    if (tags != got.fx[4]) add("x87 tags " + hex(got.fx[4]) + " want " + hex(tags));
    const unsigned top = (want.fsw >> 11) & 7;
    for (unsigned i = 0; i < 8; ++i) {
      if (!(tags & (1u << ((top + i) & 7)))) continue;  // empty: its bits mean nothing
      const std::uint8_t* a = want.fx + 32 + 16 * i;
      const std::uint8_t* b = got.fx + 32 + 16 * i;
      if (std::memcmp(a, b, 10) != 0) add("st" + std::to_string(i) + " " + hexs(b, 10) + " want " + hexs(a, 10));
    }
  }
  if (n > 10) d += "(" + std::to_string(n - 10) + " more)";
  return d;
}


}  // namespace

namespace {

/// Rounds of each test, each with other random values.
constexpr int kRounds = 40;
[[maybe_unused]] std::string round_name(int i) { return "round " + std::to_string(i) + ": "; }

struct Env {
  std::uint32_t mxcsr;
  std::uint16_t fcw, fsw;
  std::uint8_t tags;
};

/// The floating-point environment at the consumer's start (fxsave64: no side effect).
[[maybe_unused]] __attribute__((noinline)) Env read_env() {
  alignas(16) std::uint8_t fx[512];
  Env e;
  asm volatile("fxsave64 %0\n stmxcsr %1\n fnstcw %2\n fnstsw %3"
               : "=m"(fx), "=m"(e.mxcsr), "=m"(e.fcw), "=m"(e.fsw));
  e.tags = fx[4];
  return e;
}

}  // namespace
