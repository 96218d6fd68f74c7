// SPDX-License-Identifier: MIT
// The optimized hit of a probe with one entry consumer (ConsumerSet::
// sole_entry, dispatch.cpp's sole_entry_hit()): every decision that does not
// depend on the hit is taken at registration, and the hit only checks that
// the consumer's class still has the filter and handler read then. Here:
// each hit counted once in Stats::hits and Stats::optimized (an optimized hit
// increments one counter; stats() adds it to the int3 path's); the session
// cookie fresh (0) at every hit of an entry-only consumer; a register the
// handler writes reaches the function; a consumer that registers from its
// base class's constructor gets its derived class's filter (and handler)
// once that constructor has run, both for a consumer of general registers
// only and for an ordinary one (whose handler's code was read); the save
// decided at registration kept for a consumer that declares
// set_vector_state_unused() only later (helper-64's case).

#include <cstring>

#include "opt_common.hpp"

using namespace opttest;
using uprobe::Action;
using uprobe::Regs;

namespace {

constexpr std::uint64_t kSalt = 0x5013000000000000ull;

#if defined(__SANITIZE_THREAD__)
constexpr bool kTsanBuild = true;
#else
constexpr bool kTsanBuild = false;
#endif

/// Entry only: checks the cookie is fresh, stamps it, and sets rsi to 5
/// (opt_entry5(a, b) = a + 2b then returns a + 10).
struct StampConsumer : uprobe::Consumer {
  explicit StampConsumer(bool gpr) {
    if (gpr) set_vector_state_unused();
  }
  std::atomic<std::uint64_t> hits{0}, stale_cookie{0};
  Action handler(Regs& r) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t& c = uprobe::session_cookie();
    if (c != 0) stale_cookie.fetch_add(1, std::memory_order_relaxed);
    c = kSalt | r.rdi;
    r.rsi = 5;
    return Action::keep;
  }
};

TEST(SoleEntry, EachHitCountedOnceFreshCookieAndRegisterWrites) {
  for (const bool gpr : {true, false}) {
    SCOPED_TRACE(gpr ? "general registers only" : "ordinary consumer");
    StampConsumer c(gpr);
    uprobe::Attachment a(vaddr(opt_entry5), c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
    const uprobe::Stats s0 = uprobe::stats();
    for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(opt_entry5(i, 1000 + i), i + 10) << "i = " << i;
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(c.hits.load(), 1000u);
    EXPECT_EQ(c.stale_cookie.load(), 0u);
    EXPECT_EQ(d.hits, 1000u) << stats_str(d);
    EXPECT_EQ(d.optimized, 1000u) << stats_str(d);
    EXPECT_EQ(d.recursion_misses, 0u) << stats_str(d);
  }
}

// The int3 path counts in Stats::hits alone; the sum stays one a hit.
TEST(SoleEntry, Int3HitsCountInHitsOnly) {
  ConfigGuard guard;
  set_optimize(false);
  StampConsumer c(true);
  uprobe::Attachment a(vaddr(opt_entry5), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
  const uprobe::Stats s0 = uprobe::stats();
  for (std::uint64_t i = 0; i < 200; ++i) ASSERT_EQ(opt_entry5(i, 7), i + 10);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(c.hits.load(), 200u);
  EXPECT_EQ(c.stale_cookie.load(), 0u);
  EXPECT_EQ(d.hits, 200u) << stats_str(d);
  EXPECT_EQ(d.optimized, 0u) << stats_str(d);
}

/// Registers itself on opt_entry5 from its constructor: the registration
/// sees this class's (Consumer's own) filter and this handler.
struct SelfRegistering : uprobe::Consumer {
  explicit SelfRegistering(bool gpr) {
    if (gpr) set_vector_state_unused();
    attachment = uprobe::Attachment(vaddr(opt_entry5), *this);
  }
  Action handler(Regs&) override {
    base_hits.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
  std::atomic<std::uint64_t> base_hits{0};
  uprobe::Attachment attachment;
};

/// ... whose derived class filters (on `pass`) and counts in a handler of
/// its own.
struct FilteringDerived : SelfRegistering {
  explicit FilteringDerived(bool gpr) : SelfRegistering(gpr) {}
  bool filter(pid_t) override { return pass.load(std::memory_order_relaxed); }
  Action handler(Regs& r) override {
    derived_hits.fetch_add(1, std::memory_order_relaxed);
    r.rsi = 5;
    return Action::keep;
  }
  std::atomic<bool> pass{false};
  std::atomic<std::uint64_t> derived_hits{0};
};

TEST(SoleEntry, ARegistrationFromTheBaseConstructorGetsTheDerivedFilterAndHandler) {
  for (const bool gpr : {true, false}) {
    SCOPED_TRACE(gpr ? "general registers only" : "ordinary consumer");
    FilteringDerived c(gpr);
    ASSERT_EQ(uprobe::probe_info(c.attachment.probe()).mode, uprobe::ProbeMode::optimized_nop5);
    for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(opt_entry5(i, 1), i + 2);  // filtered out
    EXPECT_EQ(c.derived_hits.load(), 0u);
    c.pass.store(true);
    for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(opt_entry5(i, 1), i + 10);
    EXPECT_EQ(c.derived_hits.load(), 100u);
    EXPECT_EQ(c.base_hits.load(), 0u);
  }
}

}  // namespace

namespace {

/// An ordinary consumer whose handler writes xmm0 and xmm1 and raises the
/// MXCSR's inexact flag (legacy SSE only: read at registration, saved
/// around it), which declares set_vector_state_unused() only after it
/// registered (against the documented use: before registering).
struct LateUnusedConsumer : uprobe::Consumer {
  void declare_unused() { set_vector_state_unused(true); }
  std::atomic<std::uint64_t> hits{0};
  volatile double three = 3.0;
  Action handler(Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    const double third = 1.0 / three;  // inexact
    asm volatile("pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1" : : "x"(third) : "xmm0", "xmm1");
    return Action::keep;
  }
};

/// LateUnusedConsumer's return side: a ret_handler that writes xmm0 and
/// xmm1 (the function's double return value) and raises the MXCSR's inexact
/// flag, declaring set_vector_state_unused() only after it registered.
struct LateUnusedRetConsumer : uprobe::Consumer {
  LateUnusedRetConsumer() : uprobe::Consumer(uprobe::Callbacks::ret) {}
  void declare_unused() { set_vector_state_unused(true); }
  std::atomic<std::uint64_t> hits{0};
  volatile double three = 3.0;
  void ret_handler(Regs&, std::uint64_t) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    const double third = 1.0 / three;  // inexact
    asm volatile("pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1" : : "x"(third) : "xmm0", "xmm1");
  }
};

/// 100 calls of opt_fargs with eight double arguments and the MXCSR's status
/// flags clear: the first round whose return value, caller's MXCSR or (with
/// `args`) first two arguments as the function saw them differ from what
/// went in; "" when none does.
std::string fargs_rounds(bool args) {
  int bad = 0;
  std::string first;
  for (int i = 0; i < 100; ++i) {
    const double base = i;
    const std::uint32_t clean = 0x1f80;
    std::uint32_t after = 0;
    asm volatile("ldmxcsr %0" : : "m"(clean));
    const double r = opt_fargs(base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, base + 7, base + 8);
    asm volatile("stmxcsr %0" : "=m"(after));
    double a0 = base + 1, a1 = base + 2;
    if (args) {
      std::memcpy(&a0, opt_fargs_out + 0, 8);
      std::memcpy(&a1, opt_fargs_out + 16, 8);
    }
    if (r != 2 * base + 9 || a0 != base + 1 || a1 != base + 2 || after != clean) {
      if (bad++ == 0)
        first = "round " + std::to_string(i) + ": returned " + std::to_string(r) + ", xmm0 " + std::to_string(a0) +
                ", xmm1 " + std::to_string(a1) + ", mxcsr " + std::to_string(after);
    }
  }
  return bad ? std::to_string(bad) + " rounds differ, the first: " + first : "";
}

/// A LateUnused consumer `C` at opt_fargs declaring set_vector_state_unused()
/// after it registered: the save decided at registration (for its handler,
/// `ret` false, or its ret_handler) still runs.
template <class C>
void expect_late_unused_keeps_save(bool ret) {
  C c;
  uprobe::Attachment a(vaddr(opt_fargs), c);
  const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  // (A ThreadSanitizer build saves everything in the stub's entry: its sets say "none".)
  const std::string& state = ret ? info.return_state : info.entry_state;
  ASSERT_EQ(state == "none", kTsanBuild) << state;
  c.declare_unused();
  EXPECT_EQ(fargs_rounds(!ret), "");
  EXPECT_EQ(c.hits.load(), 100u);
}

}  // namespace

// The save decided at registration still runs: the function's double
// arguments and the caller's MXCSR (status flags clear) are as they were.
TEST(SoleEntry, VectorStateUnusedDeclaredAfterRegistrationKeepsTheSave) {
  expect_late_unused_keeps_save<LateUnusedConsumer>(false);
}

// The return's save decided at registration still runs (the return path's
// one-consumer case as the consumer loop): the function's double return
// value and the caller's MXCSR (status flags clear) are as they were.
TEST(SoleEntry, VectorStateUnusedDeclaredAfterRegistrationKeepsTheReturnSave) {
  expect_late_unused_keeps_save<LateUnusedRetConsumer>(true);
}
