// SPDX-License-Identifier: MIT
// The vector and x87 state around an ordinary consumer (one that does not
// declare set_vector_state_unused()), at the three kinds of site libuprobe
// preserves differently: a function entry (xmm/ymm/zmm0-15: live values in
// the argument registers and in the others, as a caller that keeps values in
// caller-saved registers across the call leaves them; the MXCSR, status
// flags included; the x87 control word), a return (the same, plus the x87
// stack a long double or complex long double return leaves: st0/st1 values,
// tags and TOP) and a mid-function nop5 (everything: zmm16-31, k0-k7, the
// x87 stack and whole status word included; so is an entry with
// Config::site_state = SiteState::full). At xmm, ymm and zmm width (skipped
// only where the CPU lacks AVX / AVX-512), optimized and int3. The consumer
// formats doubles with snprintf, runs a loop the compiler vectorizes and
// libc's memcpy/memset, computes in long double, then clobbers every vector
// register, k0-k7, the MXCSR and the x87 control word, fills the whole x87
// stack and raises exceptions; it checks that it ran with the default
// floating-point controls and an empty x87 stack. After each hit every value
// the site keeps is exact. A session consumer (entry and return) too.
// opt_state_other runs the optimized half again with call_preserving()'s
// other strategy forced (AMD's on other CPUs, the others' on AMD).

#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "opt_common.hpp"

using namespace opttest;

#include "state_common.hpp"

namespace {
// ------------------------------------------------------------- the consumer ----

alignas(64) std::uint8_t g_src[8192], g_dst[8192];
alignas(64) double g_a[512], g_b[512];

/// A loop the compiler vectorizes at -O2 (GCC's very-cheap vectorizer, or
/// forced here), with libc's memcpy/memset (SSE/AVX/AVX-512 variants).
__attribute__((noinline, optimize("tree-vectorize"))) double vector_work(unsigned salt) {
  for (int i = 0; i < 512; ++i) g_a[i] = static_cast<double>(i + salt) * 0.5;
  for (int i = 0; i < 512; ++i) g_b[i] = g_a[i] * g_a[i] + 1.0;
  void* (*volatile ms)(void*, int, std::size_t) = &std::memset;
  void* (*volatile mc)(void*, const void*, std::size_t) = &std::memcpy;
  ms(g_src, static_cast<int>(salt & 0xff), sizeof g_src);
  mc(g_dst, g_src, sizeof g_src);
  return g_b[salt % 512];
}

__attribute__((noinline, target("avx2"))) void clobber_ymm() {
  asm volatile(
      "vpcmpeqd %%ymm0,%%ymm0,%%ymm0\n vpcmpeqd %%ymm1,%%ymm1,%%ymm1\n vpcmpeqd %%ymm2,%%ymm2,%%ymm2\n"
      "vpcmpeqd %%ymm3,%%ymm3,%%ymm3\n vpcmpeqd %%ymm4,%%ymm4,%%ymm4\n vpcmpeqd %%ymm5,%%ymm5,%%ymm5\n"
      "vpcmpeqd %%ymm6,%%ymm6,%%ymm6\n vpcmpeqd %%ymm7,%%ymm7,%%ymm7\n vpcmpeqd %%ymm8,%%ymm8,%%ymm8\n"
      "vpcmpeqd %%ymm9,%%ymm9,%%ymm9\n vpcmpeqd %%ymm10,%%ymm10,%%ymm10\n vpcmpeqd %%ymm11,%%ymm11,%%ymm11\n"
      "vpcmpeqd %%ymm12,%%ymm12,%%ymm12\n vpcmpeqd %%ymm13,%%ymm13,%%ymm13\n vpcmpeqd %%ymm14,%%ymm14,%%ymm14\n"
      "vpcmpeqd %%ymm15,%%ymm15,%%ymm15\n" ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15");
}

__attribute__((noinline, target("avx512f,avx512bw"))) void clobber_zmm() {
  asm volatile(
#define Z(n) "vpternlogd $0xff,%%zmm" #n ",%%zmm" #n ",%%zmm" #n "\n"
      Z(0) Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13) Z(14) Z(15) Z(16) Z(17) Z(18) Z(19)
          Z(20) Z(21) Z(22) Z(23) Z(24) Z(25) Z(26) Z(27) Z(28) Z(29) Z(30) Z(31)
#undef Z
      "mov $-1, %%rax\n kmovq %%rax,%%k0\n kmovq %%rax,%%k1\n kmovq %%rax,%%k2\n kmovq %%rax,%%k3\n"
      "kmovq %%rax,%%k4\n kmovq %%rax,%%k5\n kmovq %%rax,%%k6\n kmovq %%rax,%%k7\n" ::
          : "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
            "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k0", "k1", "k2", "k3",
            "k4", "k5", "k6", "k7");
}

/// Fills the whole x87 stack (overflowing into any value left there), pops
/// it, raises divide-by-zero, and leaves other control words behind.
__attribute__((noinline)) void clobber_x87_and_controls() {
  const std::uint32_t mx = 0x7f80 | 0x3f;  // round toward zero, every flag raised
  const std::uint16_t cw = 0x027f;         // x87: 53-bit precision
  asm volatile(
      "fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n"
      "fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n"
      "fstp %%st(0)\n"
      "fld1\n fldz\n fdivrp\n fstp %%st(0)\n"  // 1/0 (masked): ZE
      "ldmxcsr %0\n fldcw %1"
      :
      : "m"(mx), "m"(cw)
      : "memory");
}


/// An ordinary consumer, hostile to everything it may legally clobber.
struct StateConsumer : uprobe::Consumer {
  explicit StateConsumer(uprobe::Callbacks cb) : uprobe::Consumer(cb) {}
  std::atomic<std::uint64_t> hits{0}, bad_env{0}, bad_work{0};
  std::string first_env;

  void work() {
    const Env e = read_env();
    if ((e.mxcsr & ~0x3fu) != 0x1f80 || e.fcw != 0x037f || e.tags != 0 || ((e.fsw >> 11) & 7) != 0) {
      if (bad_env.fetch_add(1) == 0) {
        char b[128];
        std::snprintf(b, sizeof b, "mxcsr %#x fcw %#x fsw %#x tags %#x", e.mxcsr, e.fcw, e.fsw, e.tags);
        first_env = b;
      }
    }
    const unsigned n = static_cast<unsigned>(hits.fetch_add(1));
    char buf[64], want[64];
    const double d = vector_work(n);
    std::snprintf(buf, sizeof buf, "%.17g|%.3f", d, static_cast<double>(n) + 0.25);
    const double a = static_cast<double>(n % 512 + n) * 0.5;
    std::snprintf(want, sizeof want, "%.17g|%u.250", a * a + 1.0, n);
    volatile long double ld = static_cast<long double>(d) / 3.0L;
    ld = ld * 3.0L;
    if (std::strcmp(buf, want) != 0 || g_dst[100] != static_cast<std::uint8_t>(n & 0xff) ||
        std::fabs(static_cast<double>(ld) - d) > 1e-9 * d)
      bad_work.fetch_add(1);
    if (__builtin_cpu_supports("avx2")) clobber_ymm();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) clobber_zmm();
    clobber_x87_and_controls();
  }
  uprobe::Action handler(uprobe::Regs&) override {
    work();
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs&, std::uint64_t) override { work(); }
  void expect_clean(std::uint64_t n) {
    EXPECT_EQ(hits.load(), n);
    EXPECT_EQ(bad_env.load(), 0u) << "the consumer did not start with the default environment and an empty x87 "
                                     "stack: "
                                  << first_env;
    EXPECT_EQ(bad_work.load(), 0u) << "the consumer's own floating-point work went wrong";
  }
};


class State : public ::testing::TestWithParam<std::tuple<Level, bool>> {
 protected:
  ConfigGuard guard;
  Level l = Level::sse;
  bool optimize = true;
  void SetUp() override {
    std::tie(l, optimize) = GetParam();
    if (!cpu_has(l)) GTEST_SKIP() << level_name(l) << " not supported by this CPU";
#if defined(UPROBE_STATE_OTHER_STRATEGY)
    if (!other.engage()) GTEST_SKIP() << "in_use needs xgetbv(1)";
#endif
    set_optimize(optimize);
  }
#if defined(UPROBE_STATE_OTHER_STRATEGY)
  OtherStrategy other;
#endif
  void expect_mode(const uprobe::Attachment& a, uprobe::ProbeMode optimized_mode) {
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, optimize ? optimized_mode : uprobe::ProbeMode::int3) << info.why_not_optimized;
  }
};


// A function entry: what the function sees in its body, and what its caller
// has after it returned, are what the caller loaded: xmm/ymm/zmm0-15, the
// MXCSR (status flags too) and the x87 control word.
TEST_P(State, EntryVectorRegisters0To15AndControlWords) {
  StateConsumer c(uprobe::Callbacks::entry);
  uprobe::Attachment a(vaddr(kEntryFn[idx(l)]), c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
  const uprobe::Stats s0 = uprobe::stats();
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) + 11, 0, false);
    kCallEntry[idx(l)]();
    std::string d = diff(l, state_in, state_seen, kEntry);
    const std::string d2 = diff(l, state_in, state_after, kEntry);
    if (!d2.empty()) d += "after the return: " + d2;
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  EXPECT_EQ(bad, 0) << first;
  c.expect_clean(kRounds);
  EXPECT_EQ(stats_delta(s0, uprobe::stats()).optimized, optimize ? static_cast<std::uint64_t>(kRounds) : 0u);
}

// Config::site_state = full: an entry reached with values on the x87 stack
// (a hand-written caller) sees them exactly, with the whole x87 status word
// and the tags, as without the probe, and zmm16-31 and k0-k7 too; so does
// its caller after the return.
TEST_P(State, EntryFullStateSwitchKeepsX87) {
  std::vector<AbiState> seen(kRounds), after(kRounds);
  auto input = [](int i) { fill_input(static_cast<std::uint64_t>(i) + 5, 1 + static_cast<std::uint32_t>(i % 3), true); };
  for (int i = 0; i < kRounds; ++i) {
    input(i);
    kCallEntry[idx(l)]();
    seen[static_cast<std::size_t>(i)] = state_seen;
    after[static_cast<std::size_t>(i)] = state_after;
    ASSERT_EQ(diff(l, state_in, state_seen, kAll), "") << "unprobed run, round " << i;
  }
  uprobe::Config cfg = uprobe::configuration();
  cfg.site_state = uprobe::SiteState::full;
  uprobe::configure(cfg);
  ASSERT_EQ(uprobe::configuration().site_state, uprobe::SiteState::full);
  StateConsumer c(uprobe::Callbacks::entry);
  uprobe::Attachment a(vaddr(kEntryFn[idx(l)]), c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    input(i);
    kCallEntry[idx(l)]();
    std::string d = diff(l, seen[static_cast<std::size_t>(i)], state_seen, kFull);
    const std::string d2 = diff(l, after[static_cast<std::size_t>(i)], state_after, kFull);
    if (!d2.empty()) d += "after the return: " + d2;
    if (!d.empty() && bad++ == 0) first = round_name(i) + std::to_string(state_in.depth) + " x87 values: " + d;
  }
  EXPECT_EQ(bad, 0) << first;
  c.expect_clean(kRounds);
}

/// A return-only consumer whose filter, run at every entry hit, is as
/// hostile as the rest.
struct FilteringRetConsumer : StateConsumer {
  FilteringRetConsumer() : StateConsumer(uprobe::Callbacks::ret) {}
  std::atomic<std::uint64_t> filtered{0};
  bool filter(pid_t) override {
    filtered.fetch_add(1);
    work();
    return true;
  }
};

// The entry side of a return probe saves nothing when no consumer code runs
// there (a return-only consumer with the default filter: `return true;`),
// but a filter of its own is consumer code: the entry is preserved around it.
TEST_P(State, EntryFilterOfAReturnOnlyConsumer) {
  FilteringRetConsumer c;
  uprobe::Attachment a(vaddr(kEntryFn[idx(l)]), c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) + 23, 0, false);
    kCallEntry[idx(l)]();
    std::string d = diff(l, state_in, state_seen, kEntry);
    const std::string d2 = diff(l, state_in, state_after, kEntry);
    if (!d2.empty()) d += "after the return: " + d2;
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  EXPECT_EQ(bad, 0) << first;
  EXPECT_EQ(c.filtered.load(), static_cast<std::uint64_t>(kRounds));
  c.expect_clean(2 * kRounds);  // the filter's and the ret_handler's work
}

/// Registers itself from its constructor, when its class is still this one
/// (filter() = Consumer's `return true;`), a class derived from it has a
/// filter of its own.
struct RegistersInConstructor : StateConsumer {
  explicit RegistersInConstructor(const void* at) : StateConsumer(uprobe::Callbacks::ret) {
    attachment = uprobe::Attachment(at, *this);
  }
  uprobe::Attachment attachment;
};
struct LateFilter : RegistersInConstructor {
  explicit LateFilter(const void* at) : RegistersInConstructor(at) {}
  ~LateFilter() override { attachment.detach(); }
  std::atomic<std::uint64_t> filtered{0};
  bool filter(pid_t) override {
    work();
    return filtered.fetch_add(1) % 2 == 0;
  }
};

// A consumer registered before its construction finished: the filter it has
// by the time of the hits is called (every other hit filtered out), and the
// entry is preserved around it though the registration saw the trivial one.
TEST_P(State, FilterOfAClassDerivedAfterRegistration) {
  LateFilter c(vaddr(kEntryFn[idx(l)]));
  ASSERT_NO_FATAL_FAILURE(expect_mode(c.attachment, uprobe::ProbeMode::optimized_entry));
  const uprobe::Stats s0 = uprobe::stats();
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) + 29, 0, false);
    kCallEntry[idx(l)]();
    std::string d = diff(l, state_in, state_seen, kEntry);
    const std::string d2 = diff(l, state_in, state_after, kEntry);
    if (!d2.empty()) d += "after the return: " + d2;
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  EXPECT_EQ(bad, 0) << first;
  EXPECT_EQ(c.filtered.load(), static_cast<std::uint64_t>(kRounds));
  EXPECT_EQ(stats_delta(s0, uprobe::stats()).return_hits, static_cast<std::uint64_t>(kRounds / 2));
  c.expect_clean(kRounds + kRounds / 2);  // every filter call, every other ret_handler
}

// A return: the caller gets back exactly what the function left, in
// xmm/ymm/zmm0-15 (xmm0/xmm1, ymm0, zmm0 return values and the rest), the
// MXCSR, the x87 control word, and st0/st1 (0, 1 or 2 x87 values: a
// long double or complex long double) with their tags and TOP (the status
// word's flags are not kept across a call by the ABI: not checked).
TEST_P(State, ReturnVectorsAndLongDoubleValues) {
  std::vector<AbiState> ref(kRounds);
  auto input = [](int i) {
    fill_input(static_cast<std::uint64_t>(i) + 3, static_cast<std::uint32_t>(i % 3), i % 2 == 0);
  };
  for (int i = 0; i < kRounds; ++i) {
    input(i);
    kCallRet[idx(l)]();
    ref[static_cast<std::size_t>(i)] = state_after;
    ASSERT_EQ(diff(l, state_in, state_after, kAll), "") << "unprobed run, round " << i;
  }
  StateConsumer c(uprobe::Callbacks::ret);
  uprobe::Attachment a(vaddr(kRetFn[idx(l)]), c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
  const uprobe::Stats s0 = uprobe::stats();
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    input(i);
    kCallRet[idx(l)]();
    const std::string d = diff(l, ref[static_cast<std::size_t>(i)], state_after, kRet);
    if (!d.empty() && bad++ == 0) first = round_name(i) + std::to_string(state_in.depth) + " x87 values: " + d;
  }
  EXPECT_EQ(bad, 0) << first;
  c.expect_clean(kRounds);
  EXPECT_EQ(stats_delta(s0, uprobe::stats()).return_hits, static_cast<std::uint64_t>(kRounds));
}

/// A session consumer (Callbacks::entry_and_ret): hostile at the entry and
/// at the return, its cookie carried from one to the other.
struct SessionConsumer : StateConsumer {
  SessionConsumer() : StateConsumer(uprobe::Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, returns{0}, bad_cookie{0};
  uprobe::Action handler(uprobe::Regs&) override {
    uprobe::session_cookie() = 0x5e5510000ull + entries.fetch_add(1);
    work();
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs&, std::uint64_t) override {
    if (uprobe::session_cookie() != 0x5e5510000ull + returns.fetch_add(1)) bad_cookie.fetch_add(1);
    work();
  }
};

// A session consumer at a function entry and its return: the function sees
// what its caller loaded (xmm/ymm/zmm0-15, MXCSR, x87 control word) and the
// caller gets it back; at a function returning vector and long double values
// the caller gets them back exactly (kRet); every cookie round-trips.
TEST_P(State, SessionConsumerEntryAndReturn) {
  std::vector<AbiState> ref(kRounds);
  auto ret_input = [](int i) {
    fill_input(static_cast<std::uint64_t>(i) + 41, static_cast<std::uint32_t>(i % 3), i % 2 == 1);
  };
  for (int i = 0; i < kRounds; ++i) {
    ret_input(i);
    kCallRet[idx(l)]();
    ref[static_cast<std::size_t>(i)] = state_after;
    ASSERT_EQ(diff(l, state_in, state_after, kAll), "") << "unprobed run, round " << i;
  }
  SessionConsumer c;
  uprobe::Attachment e(vaddr(kEntryFn[idx(l)]), c);
  uprobe::Attachment r(vaddr(kRetFn[idx(l)]), c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(e, uprobe::ProbeMode::optimized_entry));
  ASSERT_NO_FATAL_FAILURE(expect_mode(r, uprobe::ProbeMode::optimized_entry));
  const uprobe::Stats s0 = uprobe::stats();
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) + 37, 0, false);
    kCallEntry[idx(l)]();
    std::string d = diff(l, state_in, state_seen, kEntry);
    const std::string d2 = diff(l, state_in, state_after, kEntry);
    if (!d2.empty()) d += "after the return: " + d2;
    ret_input(i);
    kCallRet[idx(l)]();
    const std::string d3 = diff(l, ref[static_cast<std::size_t>(i)], state_after, kRet);
    if (!d3.empty()) d += "returned values (" + std::to_string(state_in.depth) + " x87 values): " + d3;
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  EXPECT_EQ(bad, 0) << first;
  EXPECT_EQ(c.entries.load(), static_cast<std::uint64_t>(2 * kRounds));
  EXPECT_EQ(c.returns.load(), static_cast<std::uint64_t>(2 * kRounds));
  EXPECT_EQ(c.bad_cookie.load(), 0u);
  c.expect_clean(4 * kRounds);
  EXPECT_EQ(stats_delta(s0, uprobe::stats()).return_hits, static_cast<std::uint64_t>(2 * kRounds));
}

// A mid-function nop5: everything, the whole x87 status word (condition
// codes too) and stack included, and the x87 state left in its initial
// configuration when that is where it was (depth 0, default control word).
TEST_P(State, MidFunctionEverything) {
  const void* site = mid_site(l);
  std::vector<AbiState> ref(kRounds);
  auto input = [&](int i) {
    const bool init = i % 4 == 3;  // x87 untouched: initial configuration
    fill_input(static_cast<std::uint64_t>(i) + 17, init ? 0 : static_cast<std::uint32_t>(i % 4), !init && i % 2 == 0,
               init ? 0x037f : kFcwIn);
  };
  for (int i = 0; i < kRounds; ++i) {
    input(i);
    kMid[idx(l)]();
    ref[static_cast<std::size_t>(i)] = state_after;
    ASSERT_EQ(diff(l, state_in, state_after, kAll), "") << "unprobed run, round " << i;
  }
  StateConsumer c(uprobe::Callbacks::entry);
  uprobe::Attachment a(site, c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_nop5));
  const uprobe::Stats s0 = uprobe::stats();
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    input(i);
    kMid[idx(l)]();
    const std::string d = diff(l, ref[static_cast<std::size_t>(i)], state_after, kFull);
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  EXPECT_EQ(bad, 0) << first;
  c.expect_clean(kRounds);
  EXPECT_EQ(stats_delta(s0, uprobe::stats()).optimized, optimize ? static_cast<std::uint64_t>(kRounds) : 0u);
}

INSTANTIATE_TEST_SUITE_P(Levels, State,
                         ::testing::Combine(::testing::Values(Level::sse, Level::avx, Level::avx512),
#if defined(UPROBE_STATE_OTHER_STRATEGY)
                                            ::testing::Values(true)),  // the int3 path saves nothing
#else
                                            ::testing::Values(true, false)),
#endif
                         [](const ::testing::TestParamInfo<std::tuple<Level, bool>>& i) {
                           return std::string(level_name(std::get<0>(i.param))) +
                                  (std::get<1>(i.param) ? "_optimized" : "_int3");
                         });

}  // namespace
