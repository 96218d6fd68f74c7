// SPDX-License-Identifier: MIT
// The vector state around consumers whose code libuprobe reads at
// registration as legacy SSE only (arch::analyze_clobbers()): it then saves
// only xmm0 .. xmmN and the MXCSR around them (ProbeInfo::entry_state and
// return_state say so), at a function entry, at a return and at a
// mid-function nop5, at xmm, ymm and zmm width (skipped only where the CPU
// lacks AVX / AVX-512): every value the site keeps is exact, and so is what
// such code cannot touch (the upper halves of ymm/zmm, zmm16-31, k0-7, the
// x87 control word and stack). The consumer writes xmm0-xmm7 with legacy SSE
// instructions, divides in double (the MXCSR's inexact flag) and checks that
// it starts with the default MXCSR control bits. A consumer whose class
// changed after it registered (its handler is then code libuprobe did not
// read) gets the full preservation around that handler.

#include <atomic>
#include <cmath>

#include "state_common.hpp"

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr int kBuild = 2;  // ThreadSanitizer: everything saved in the stub's entry (ProbeInfo says "none")
#elif defined(__SANITIZE_ADDRESS__)
constexpr int kBuild = 1;  // the consumers' code calls the sanitizer runtime: not read (the save mode's state)
#else
constexpr int kBuild = 0;
#endif

/// What ProbeInfo says of a side whose consumer is SseConsumer (`mode`: the
/// save mode's name where its code is not read).
std::string expected_state(const char* mode) { return kBuild == 2 ? "none" : kBuild == 1 ? mode : "xmm0-xmm7, MXCSR"; }

constexpr std::uint32_t kDefaultMxcsr = 0x1f80;

/// An ordinary consumer (no set_vector_state_unused()) whose handler and
/// ret_handler run `Work::work()` inline: legacy SSE code only, and no call.
/// work() checks that it starts with the default MXCSR control bits
/// (start()) and counts the hit.
template <class Work>
struct SseWorkConsumer : uprobe::Consumer {
  explicit SseWorkConsumer(uprobe::Callbacks cb) : uprobe::Consumer(cb) {}
  std::atomic<std::uint64_t> hits{0}, bad_env{0}, bad_work{0};

  /// The hit's number (from 0), the MXCSR's control bits checked.
  __attribute__((always_inline)) std::uint64_t start() {
    std::uint32_t m;
    asm volatile("stmxcsr %0" : "=m"(m));
    if ((m & ~0x3fu) != kDefaultMxcsr) bad_env.fetch_add(1, std::memory_order_relaxed);
    return hits.fetch_add(1, std::memory_order_relaxed);
  }
  uprobe::Action handler(uprobe::Regs&) override {
    static_cast<Work*>(this)->work();
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs&, std::uint64_t) override { static_cast<Work*>(this)->work(); }
  void expect_clean(std::uint64_t n) {
    EXPECT_EQ(hits.load(), n);
    EXPECT_EQ(bad_env.load(), 0u) << "the consumer did not start with the default MXCSR control bits";
    EXPECT_EQ(bad_work.load(), 0u);
  }
};

/// Writes xmm0-xmm7 and divides in double (the MXCSR's inexact flag).
struct SseConsumer : SseWorkConsumer<SseConsumer> {
  using SseWorkConsumer::SseWorkConsumer;
  volatile double three = 3.0;

  __attribute__((always_inline)) void work() {
    const std::uint64_t n = start();
    // xmm1-xmm7 (legacy encodings: all ones, zero, copies).
    asm volatile(
        "pcmpeqd %%xmm1, %%xmm1\n\t"
        "movaps %%xmm1, %%xmm2\n\t"
        "xorps %%xmm3, %%xmm3\n\t"
        "pcmpeqb %%xmm4, %%xmm4\n\t"
        "movdqa %%xmm4, %%xmm5\n\t"
        "pxor %%xmm6, %%xmm6\n\t"
        "movapd %%xmm5, %%xmm7" ::: "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
    const double third = (static_cast<double>(n % 7) + 1.0) / three;  // inexact
    const double back = third * three;
    if (std::fabs(back - (static_cast<double>(n % 7) + 1.0)) > 1e-12) bad_work.fetch_add(1, std::memory_order_relaxed);
  }
};

/// Touches xmm0 only: a division in double (the MXCSR's inexact flag) in
/// xmm0; saved for it: xmm0 and the MXCSR (sse_save()'s one-register case).
struct Xmm0Consumer : SseWorkConsumer<Xmm0Consumer> {
  using SseWorkConsumer::SseWorkConsumer;
  double one = 1.0, three = 3.0, out = 0;

  __attribute__((always_inline)) void work() {
    start();
    asm volatile("movsd %1, %%xmm0\n\tdivsd %2, %%xmm0\n\tmovsd %%xmm0, %0"
                 : "=m"(out)
                 : "m"(one), "m"(three)
                 : "xmm0");
    std::uint64_t bits;
    __builtin_memcpy(&bits, &out, sizeof bits);
    if (bits != 0x3fd5555555555555ull) bad_work.fetch_add(1, std::memory_order_relaxed);  // 1/3, rounded to nearest
  }
};

/// Everything but the x87 stack (an entry or mid-function site reached with
/// an empty one, as here), zmm16-31 and k0-7 included.
constexpr What kAllButStack{true, true, true, false, false};
/// A return: that and the x87 stack the function left (TOP, tags, values).
constexpr What kAllAndStack{true, true, true, true, false};

/// kRounds calls of `l`'s entry function, inputs from `seed` (the x87
/// stack's flag alternating when `alternate`): the first round in which what
/// the function saw, or what its caller has after the return, differs from
/// what went in (`what`); "" when none does.
std::string entry_rounds(Level l, std::uint64_t seed, const What& what, bool alternate) {
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) + seed, 0, alternate && i % 2 == 0);
    kCallEntry[idx(l)]();
    std::string d = diff(l, state_in, state_seen, what);
    const std::string d2 = diff(l, state_in, state_after, what);
    if (!d2.empty()) d += "after the return: " + d2;
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  return bad ? std::to_string(bad) + " rounds differ, the first: " + first : "";
}

/// The mid-function nop5 function of `l` for round `i`'s inputs (from `seed`).
void mid_round(Level l, std::uint64_t seed, int i) {
  fill_input(static_cast<std::uint64_t>(i) + seed, 0, i % 2 == 0, 0x037f);
  kMid[idx(l)]();
}

/// Round `i`'s inputs for `l`'s return function (from `seed`): vector and
/// long double return values, an x87 stack of i % 3 values.
void ret_round(Level l, std::uint64_t seed, int i) {
  fill_input(static_cast<std::uint64_t>(i) + seed, static_cast<std::uint32_t>(i % 3), i % 2 == 1);
  kCallRet[idx(l)]();
}

/// One round of calls: mid_round() or ret_round().
using RoundFn = void (*)(Level, std::uint64_t, int);

/// What the caller has after each of kRounds rounds (`round`), without a probe.
std::vector<AbiState> reference(Level l, std::uint64_t seed, RoundFn round) {
  std::vector<AbiState> ref(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    round(l, seed, i);
    ref[static_cast<std::size_t>(i)] = state_after;
  }
  return ref;
}

/// The same rounds again: the first whose state after the call differs from
/// `ref` in `what`; "" when none does.
std::string rounds(Level l, std::uint64_t seed, const std::vector<AbiState>& ref, RoundFn round, const What& what) {
  std::string first;
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    round(l, seed, i);
    const std::string d = diff(l, ref[static_cast<std::size_t>(i)], state_after, what);
    if (!d.empty() && bad++ == 0) first = round_name(i) + d;
  }
  return bad ? std::to_string(bad) + " rounds differ, the first: " + first : "";
}

class SseState : public ::testing::TestWithParam<std::tuple<Level, bool>> {
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
  /// A `C` entry consumer at `l`'s entry function: ProbeInfo says `state`;
  /// the function and its caller see exactly what the caller loaded,
  /// everything but the (empty) x87 stack.
  template <class C>
  void expect_entry_kept(std::uint64_t seed, const std::string& state) {
    C c(uprobe::Callbacks::entry);
    uprobe::Attachment a(vaddr(kEntryFn[idx(l)]), c);
    ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.entry_state, state);
    EXPECT_EQ(info.return_state, "none");
    const uprobe::Stats s0 = uprobe::stats();
    EXPECT_EQ(entry_rounds(l, seed, kAllButStack, true), "");
    c.expect_clean(kRounds);
    EXPECT_EQ(stats_delta(s0, uprobe::stats()).optimized, optimize ? static_cast<std::uint64_t>(kRounds) : 0u);
  }
  /// A `C` return consumer at `l`'s return function: ProbeInfo says
  /// `state`; the caller gets back exactly what the function left (vector
  /// and long double return values, the rest of the vector state, the MXCSR).
  template <class C>
  void expect_return_kept(std::uint64_t seed, const std::string& state) {
    const std::vector<AbiState> ref = reference(l, seed, ret_round);
    C c(uprobe::Callbacks::ret);
    uprobe::Attachment a(vaddr(kRetFn[idx(l)]), c);
    ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.entry_state, "none");  // (a return-only consumer with the trivial filter)
    EXPECT_EQ(info.return_state, state);
    const uprobe::Stats s0 = uprobe::stats();
    EXPECT_EQ(rounds(l, seed, ref, ret_round, kAllAndStack), "");
    c.expect_clean(kRounds);
    EXPECT_EQ(stats_delta(s0, uprobe::stats()).return_hits, static_cast<std::uint64_t>(kRounds));
  }
  /// A `C` entry consumer at `l`'s mid-function nop5: ProbeInfo says
  /// `state`; everything kept, the MXCSR's status flags included.
  template <class C>
  void expect_mid_kept(std::uint64_t seed, const std::string& state) {
    const std::vector<AbiState> ref = reference(l, seed, mid_round);
    C c(uprobe::Callbacks::entry);
    uprobe::Attachment a(mid_site(l), c);
    ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_nop5));
    EXPECT_EQ(uprobe::probe_info(a.probe()).entry_state, state);
    EXPECT_EQ(rounds(l, seed, ref, mid_round, kFull), "");
    c.expect_clean(kRounds);
  }
};

// A function entry, a return and a mid-function nop5 with a consumer that
// writes xmm0-xmm7: only xmm0-xmm7 and the MXCSR are saved, every value the
// site keeps is exact.
TEST_P(SseState, EntryKeepsEverythingSavingXmm0To7) { expect_entry_kept<SseConsumer>(101, expected_state("entry")); }
TEST_P(SseState, ReturnKeepsEverythingSavingXmm0To7) { expect_return_kept<SseConsumer>(203, expected_state("return")); }
TEST_P(SseState, MidFunctionKeepsEverythingSavingXmm0To7) { expect_mid_kept<SseConsumer>(307, expected_state("full")); }

/// What ProbeInfo says of a side whose consumer is Xmm0Consumer.
std::string xmm0_state(const char* mode) { return kBuild == 2 ? "none" : kBuild == 1 ? mode : "xmm0, MXCSR"; }

// The one-register save (xmm0 and the MXCSR) at a function entry, at a return
// and at a mid-function nop5: every value exact, as with xmm0-xmm7.
TEST_P(SseState, OneRegisterSaveKeepsEverything) {
  expect_entry_kept<Xmm0Consumer>(811, xmm0_state("entry"));
  expect_return_kept<Xmm0Consumer>(823, xmm0_state("return"));
  expect_mid_kept<Xmm0Consumer>(837, xmm0_state("full"));
}

/// Every vector register at the CPU's widest, k0-7, the MXCSR (round toward
/// zero) and the x87 control word changed: what a handler libuprobe did not
/// read may do.
void clobber_everything() {
  const std::uint32_t mx = 0x7f80;  // round toward zero
  const std::uint16_t cw = 0x0c7f;
  asm volatile(
      "pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm8, %%xmm8\n\tpcmpeqd %%xmm15, %%xmm15\n\t"
      "ldmxcsr %0\n\tfldcw %1" ::"m"(mx), "m"(cw) : "xmm0", "xmm8", "xmm15", "memory");
  if (cpu_has(Level::avx))
    asm volatile("vpcmpeqd %%ymm1, %%ymm1, %%ymm1\n\tvpcmpeqd %%ymm9, %%ymm9, %%ymm9\n\tvzeroupper" ::: "memory");
  if (cpu_has(Level::avx512))
    asm volatile("vpternlogd $0xff, %%zmm2, %%zmm2, %%zmm2\n\tvpternlogd $0xff, %%zmm20, %%zmm20, %%zmm20\n\t"
                 "kxnorw %%k1, %%k1, %%k1\n\tvzeroupper" ::: "memory");
}

/// Registers itself from its constructor, while its class is still `Read`
/// (SseConsumer or IntegerConsumer: a handler libuprobe reads); the class derived from it
/// has a handler that clobbers every vector register at the CPU's widest,
/// k0-7, the MXCSR and the x87 control word.
template <class Read>
struct RegistersInConstructor : Read {
  explicit RegistersInConstructor(const void* at) : Read(uprobe::Callbacks::entry) {
    attachment = uprobe::Attachment(at, *this);
  }
  uprobe::Attachment attachment;
};
template <class Read>
struct HostileLater : RegistersInConstructor<Read> {
  explicit HostileLater(const void* at) : RegistersInConstructor<Read>(at) {}
  ~HostileLater() override { this->attachment.detach(); }
  std::atomic<std::uint64_t> hostile{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hostile.fetch_add(1);
    clobber_everything();
    return uprobe::Action::keep;
  }
};

/// HostileLater<Read> at `l`'s entry function: ProbeInfo says `state` (what
/// is saved for the code read), and with the handler that runs not that code,
/// the entry's full preservation keeps every value; only that handler ran.
template <class Read>
void expect_derived_handler_preserved(Level l, bool optimize, std::uint64_t seed, const std::string& state) {
  HostileLater<Read> c(vaddr(kEntryFn[idx(l)]));
  const uprobe::ProbeInfo info = uprobe::probe_info(c.attachment.probe());
  ASSERT_EQ(info.mode, optimize ? uprobe::ProbeMode::optimized_entry : uprobe::ProbeMode::int3)
      << info.why_not_optimized;
  EXPECT_EQ(info.entry_state, state);
  EXPECT_EQ(entry_rounds(l, seed, kEntry, false), "");
  EXPECT_EQ(c.hostile.load(), static_cast<std::uint64_t>(kRounds));
  EXPECT_EQ(c.hits.load(), 0u);  // (Read's handler never ran)
}

// The handler that runs is not the code read at registration: the entry's
// full preservation around it (vectors 0-15 at the width in use, the MXCSR,
// the x87 control word).
TEST_P(SseState, HandlerOfAClassDerivedAfterRegistration) {
  expect_derived_handler_preserved<SseConsumer>(l, optimize, 401, expected_state("entry"));
}

/// An ordinary consumer (no set_vector_state_unused()) whose code is integer
/// only: libuprobe reads it at registration and saves nothing around it, the
/// MXCSR included (no legacy SSE instruction without an xmm register can
/// change it).
struct IntegerConsumer : uprobe::Consumer {
  explicit IntegerConsumer(uprobe::Callbacks cb = uprobe::Callbacks::entry) : uprobe::Consumer(cb) {}
  std::atomic<std::uint64_t> hits{0}, sum{0};
  uprobe::Action handler(uprobe::Regs& r) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    sum.fetch_add(r.rdi * 3 + (r.rsi >> 2), std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// What ProbeInfo says of IntegerConsumer's side (`mode`: where its code is not read).
std::string integer_state(const char* mode) { return kBuild == 2 ? "none" : kBuild == 1 ? mode : "none (code read)"; }

// Integer code at a function entry and at a mid-function nop5: nothing saved
// (ProbeInfo), and every value of the vector, x87 and MXCSR state exact.
TEST_P(SseState, IntegerConsumerSavesNothingAndKeepsEverything) {
  IntegerConsumer c;
  {
    uprobe::Attachment a(vaddr(kEntryFn[idx(l)]), c);
    ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_entry));
    EXPECT_EQ(uprobe::probe_info(a.probe()).entry_state, integer_state("entry"));
    EXPECT_EQ(entry_rounds(l, 503, kAllButStack, true), "");
    EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kRounds));
  }
  const std::vector<AbiState> ref = reference(l, 607, mid_round);
  uprobe::Attachment a(mid_site(l), c);
  ASSERT_NO_FATAL_FAILURE(expect_mode(a, uprobe::ProbeMode::optimized_nop5));
  EXPECT_EQ(uprobe::probe_info(a.probe()).entry_state, integer_state("full"));
  EXPECT_EQ(rounds(l, 607, ref, mid_round, kFull), "");
  EXPECT_EQ(c.hits.load(), 2u * static_cast<std::uint64_t>(kRounds));
}

// Nothing is saved for the integer code read; the handler that runs is other
// code: the entry's full preservation around it.
TEST_P(SseState, HandlerOfAClassDerivedAfterRegistrationFromIntegerCode) {
  expect_derived_handler_preserved<IntegerConsumer>(l, optimize, 701, integer_state("entry"));
}

/// The work of CachedSse's handler, a direct call (the reading follows it).
__attribute__((noinline)) double sse_work(double x) {
  asm volatile("xorps %%xmm5, %%xmm5" ::: "xmm5");
  return x * 0.25 + 2.0;
}
struct CachedSse : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  volatile double in = 4.0;
  double out = 0;
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    out = sse_work(in);
    return uprobe::Action::keep;
  }
};

// The reading of a consumer's code is kept for its next registrations while
// the bytes it read are the same: a probe put into that code since (a jump
// or an int3 over sse_work's first bytes) makes the next registration read
// it again, and what it reads now it cannot follow (the full save).
TEST(SseCache, CodeChangedSinceItWasReadIsReadAgain) {
  ConfigGuard guard;
  CachedSse c;
  uprobe::Attachment first(vaddr(kEntryFn[0]), c);
  EXPECT_EQ(uprobe::probe_info(first.probe()).entry_state,
            kBuild == 2 ? "none" : kBuild == 1 ? "entry" : "xmm0-xmm5, MXCSR");
  Counter in_the_consumer;
  uprobe::Attachment into(reinterpret_cast<const void*>(&sse_work), in_the_consumer);
  uprobe::Attachment second(mid_site(Level::sse), c);
  EXPECT_EQ(uprobe::probe_info(second.probe()).entry_state, kBuild == 2 ? "none" : "full");
  // (The first probe's save still holds: what runs is sse_work's code, moved
  // or stepped, and the stub's, which touches no vector register.)
  fill_input(7, 0, false);
  kCallEntry[0]();
  EXPECT_EQ(diff(Level::sse, state_in, state_after, kEntry), "");
  EXPECT_EQ(c.hits.load(), 1u);
  EXPECT_EQ(c.out, 3.0);
}

INSTANTIATE_TEST_SUITE_P(Levels, SseState,
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
