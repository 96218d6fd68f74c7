// SPDX-License-Identifier: MIT
// Group 6: the register context a handler sees, and what writing it does:
// arguments, rip, rsp and the return address at entry; every GPR and the
// flags at a mid-function site (emulated and out-of-line); GPR and flag
// writes; rax written at a `ret`; rip redirect (the probed instruction does
// not run); vector registers and the red zone survive a hit.

#include <cstring>

#include "common.hpp"
#include "fixtures.hpp"

using namespace coretest;
using uprobe::Action;
using uprobe::Regs;

namespace {

constexpr int kCalls = 1000;

struct EntryRecorder : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Regs seen{};
  std::uint64_t ret_addr = 0;
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    seen = r;
    ret_addr = *reinterpret_cast<const std::uint64_t*>(r.rsp);
    return Action::keep;
  }
};

TEST(Regs, ArgumentsRipRspAndReturnAddressAtEntry) {
  for (int how = 0; how < 2; ++how) {
    SCOPED_TRACE(how == 0 ? "by address" : "by (path, offset)");
    EntryRecorder rec;
    uprobe::FileOffset fo = uprobe::resolve_address(fx_addr(fx_args));
    uprobe::Attachment a = how == 0 ? uprobe::Attachment(fx_addr(fx_args), rec)
                                    : uprobe::Attachment(fo.path, fo.offset, rec);
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(fx_args_caller(), 33u);
      ASSERT_EQ(rec.hits.load(), static_cast<std::uint64_t>(i + 1));
      ASSERT_EQ(rec.seen.rdi, 11u);
      ASSERT_EQ(rec.seen.rsi, 22u);
      ASSERT_EQ(rec.seen.arg(0), 11u);
      ASSERT_EQ(rec.seen.arg(1), 22u);
      ASSERT_EQ(rec.seen.rip, reinterpret_cast<std::uint64_t>(fx_addr(fx_args)));
      ASSERT_EQ(rec.seen.ip(), rec.seen.rip);
      ASSERT_EQ(rec.seen.rsp, fx_saved_rsp - 8) << "rsp must be the caller's rsp at the call, minus the return address";
      ASSERT_EQ(rec.seen.sp(), rec.seen.rsp);
      ASSERT_EQ(rec.ret_addr, reinterpret_cast<std::uint64_t>(fx_at(fx_addr(fx_args_caller), fx_args_caller_site)))
          << "*(uint64_t*)rsp must be the return address into fx_args_caller";
    }
  }
}

TEST(Regs, ArgumentsFromCxxCaller) {
  EntryRecorder rec;
  uprobe::Attachment a(fx_addr(fx_args), rec);
  auto volatile f = &fx_args;
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    ASSERT_EQ(f(i, 2 * i + 1), 3 * i + 1);
    ASSERT_EQ(rec.seen.rdi, i);
    ASSERT_EQ(rec.seen.rsi, 2 * i + 1);
  }
  EXPECT_EQ(rec.hits.load(), static_cast<std::uint64_t>(kCalls));
}

// -------------------------------------------------------- all GPRs ----

constexpr std::uint64_t reg_value(int n) { return 0x5a00000000000000ull | std::uint64_t(n) << 40 | std::uint64_t(n); }

constexpr std::uint64_t kFlagsMask = 0xcd5;  // CF PF AF ZF SF DF OF

struct AllRegs : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Regs seen{};
  bool write = false;
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    seen = r;
    if (write) {
      r.r10 = 0x0123456789abcdefull;
      r.rbx = 0xfedcba9876543210ull;
      r.rflags ^= 0x41;  // flip CF and ZF
    }
    return Action::keep;
  }
};

void check_allregs(bool xol, bool write) {
  SCOPED_TRACE(std::string(xol ? "xol site" : "nop site") + (write ? ", handler writes r10/rbx/flags" : ""));
  auto fn = xol ? fx_allregs_xol : fx_allregs_nop;
  const std::uint64_t site = xol ? fx_allregs_xol_site : fx_allregs_nop_site;
  AllRegs h;
  h.write = write;
  uprobe::Attachment a(fx_at(fx_addr(fn), site), h);
  for (int i = 0; i < 100; ++i) {
    std::memset(fx_regs_out, 0, sizeof fx_regs_out);
    ASSERT_EQ(fn(), 0u);
    ASSERT_EQ(h.hits.load(), static_cast<std::uint64_t>(i + 1));
    const Regs& s = h.seen;
    const std::uint64_t want[16] = {s.rax, s.rcx, s.rdx, s.rbx, 0, s.rbp, s.rsi, s.rdi,
                                    s.r8,  s.r9,  s.r10, s.r11, s.r12, s.r13, s.r14, s.r15};
    for (int n = 0; n < 16; ++n) {
      if (n == 4) continue;
      ASSERT_EQ(hex(want[n]), hex(reg_value(n))) << "handler saw register #" << n;
    }
    ASSERT_EQ(s.rip, reinterpret_cast<std::uint64_t>(fx_at(fx_addr(fn), site)));
    ASSERT_EQ(hex(s.rflags & kFlagsMask), hex(0x8c5)) << "handler saw rflags " << hex(s.rflags);
    ASSERT_EQ(fx_regs_out[4] % 8, 0u);
    ASSERT_EQ(hex(s.rsp), hex(fx_regs_out[4])) << "rsp at the site vs rsp after it";
    // After the site, registers as the site left them.
    for (int n = 0; n < 16; ++n) {
      if (n == 4) continue;
      std::uint64_t expect = reg_value(n);
      if (write && n == 10) expect = 0x0123456789abcdefull;
      if (write && n == 3) expect = 0xfedcba9876543210ull;
      if (xol && n == 11) expect = (write ? 0x0123456789abcdefull : reg_value(10)) + 0x10;  // lea 0x10(%r10),%r11
      ASSERT_EQ(hex(fx_regs_out[n]), hex(expect)) << "register #" << n << " after the site";
    }
    const std::uint64_t flags_expect = write ? (0x8c5 ^ 0x41) : 0x8c5;
    ASSERT_EQ(hex(fx_flags_out & kFlagsMask), hex(flags_expect)) << "flags after the site";
    ASSERT_EQ(fx_flags_out & 0x100, 0u) << "TF leaked into the program";
  }
}

TEST(Regs, AllGprsAndFlagsAtEmulatedSite) { check_allregs(false, false); }
TEST(Regs, AllGprsAndFlagsAtOutOfLineSite) { check_allregs(true, false); }
TEST(Regs, GprAndFlagWritesAtEmulatedSite) { check_allregs(false, true); }
TEST(Regs, GprAndFlagWritesAtOutOfLineSite) { check_allregs(true, true); }

TEST(Regs, AllGprsAtOutOfLineSiteSingleStep) {
  ConfigGuard g;
  uprobe::Config c;
  c.xol = uprobe::XolMode::single_step;
  uprobe::configure(c);
  check_allregs(true, true);
}

// ------------------------------------------------------ rax at ret ----

struct SetRax : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad{0};
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    if (r.rax != r.rdi) bad.fetch_add(1);
    r.rax = r.rdi ^ 0xdead0000beefull;
    return Action::keep;
  }
};

TEST(Regs, WritingRaxAtRetChangesReturnValue) {
  SetRax h;
  const void* site = fx_at(fx_addr(fx_ret_rax), fx_ret_rax_site);
  ASSERT_EQ(*static_cast<const std::uint8_t*>(site), 0xc3);
  uprobe::Attachment a(site, h);
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(fx_ret_rax(i, 0), i ^ 0xdead0000beefull) << i;
  EXPECT_EQ(h.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(h.bad.load(), 0u) << "handler saw rax != the value moved into it";
  a.detach();
  EXPECT_EQ(fx_ret_rax(5, 0), 5u);
}

// -------------------------------------------------------- redirect ----

struct Redirect : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    r.rip = reinterpret_cast<std::uint64_t>(fx_addr(fx_redir_to));
    return Action::keep;
  }
};

TEST(Regs, WritingRipRedirectsAndSkipsTheProbedInstruction) {
  for (int how = 0; how < 2; ++how) {
    SCOPED_TRACE(how == 0 ? "by address" : "by (path, offset)");
    fx_redir_count = 0;
    ASSERT_EQ(fx_redir_from(1, 0), 2u);
    ASSERT_EQ(fx_redir_count, 1u);
    fx_redir_count = 0;
    Redirect h;
    uprobe::FileOffset fo = uprobe::resolve_address(fx_addr(fx_redir_from));
    uprobe::Attachment a = how == 0 ? uprobe::Attachment(fx_addr(fx_redir_from), h)
                                    : uprobe::Attachment(fo.path, fo.offset, h);
    const uprobe::Stats s0 = uprobe::stats();
    for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(fx_redir_from(i, 0), i + 1000) << i;
    uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(h.hits.load(), static_cast<std::uint64_t>(kCalls));
    EXPECT_EQ(fx_redir_count, 0u) << "the probed incq ran although the handler redirected";
    EXPECT_EQ(d.redirected, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    EXPECT_EQ(d.emulated + d.out_of_line, 0u) << stats_str(d);
    a.detach();
    EXPECT_EQ(fx_redir_from(1, 0), 2u);
    EXPECT_EQ(fx_redir_count, 1u);
  }
}

// ------------------------------------------------ vectors, red zone ----

struct Clobber : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  bool ymm = false;
  Action handler(Regs&) override {
    hits.fetch_add(1);
    fx_clobber_xmm();
    if (ymm) fx_clobber_ymm();
    // Use the stack and FP in the handler too.
    volatile char buf[1024];
    for (std::size_t i = 0; i < sizeof buf; i += 64) buf[i] = static_cast<char>(i);
    volatile double d = 1.5;
    d = d * 3.25;
    (void)d;
    return Action::keep;
  }
};

void check_xmm(fx_fn fn, std::uint64_t site, bool xol) {
  Clobber h;
  uprobe::Attachment a(fx_at(fx_addr(fn), site), h);
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    const std::uint64_t x = 0x1111111111111111ull * (i % 15 + 1) + i, y = ~x * 3;
    std::memset(fx_xmm_out, 0, sizeof fx_xmm_out);
    ASSERT_EQ(fn(x, y), 0u);
    ASSERT_EQ(hex(fx_xmm_out[0]), hex(x)) << "xmm3 changed across the hit";
    ASSERT_EQ(hex(fx_xmm_out[1]), hex(y)) << "xmm7 changed across the hit";
    ASSERT_EQ(hex(fx_xmm_out[2]), hex(x ^ y)) << "xmm15 changed across the hit";
  }
  EXPECT_EQ(h.hits.load(), static_cast<std::uint64_t>(kCalls)) << (xol ? "xol" : "nop");
}

TEST(Regs, XmmStateSurvivesEmulatedHit) { check_xmm(fx_xmm_keep_nop, fx_xmm_keep_nop_site, false); }
TEST(Regs, XmmStateSurvivesOutOfLineHit) { check_xmm(fx_xmm_keep_xol, fx_xmm_keep_xol_site, true); }

TEST(Regs, YmmUpperHalvesSurviveHit) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2";
  Clobber h;
  h.ymm = true;
  uprobe::Attachment a(fx_at(fx_addr(fx_ymm_keep), fx_ymm_keep_site), h);
  alignas(32) std::uint8_t src[32], dst[32];
  for (int i = 0; i < kCalls; ++i) {
    for (int k = 0; k < 32; ++k) src[k] = static_cast<std::uint8_t>(i + k * 5);
    std::memset(dst, 0, sizeof dst);
    fx_ymm_keep(reinterpret_cast<std::uint64_t>(src), reinterpret_cast<std::uint64_t>(dst));
    ASSERT_EQ(hex_bytes(std::vector<std::uint8_t>(dst, dst + 32)), hex_bytes(std::vector<std::uint8_t>(src, src + 32))) << "ymm3 changed across the hit, call " << i;
  }
  EXPECT_EQ(h.hits.load(), static_cast<std::uint64_t>(kCalls));
}

void check_redzone(fx_fn fn, std::uint64_t site) {
  Clobber h;
  uprobe::Attachment a(fx_at(fx_addr(fn), site), h);
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    const std::uint64_t x = 0x7000000000000000ull + i * 977, y = i * 31;
    ASSERT_EQ(fn(x, y), x - y) << "red zone (-8, -64 or -128 from rsp) clobbered by the hit, call " << i;
  }
  EXPECT_EQ(h.hits.load(), static_cast<std::uint64_t>(kCalls));
}

TEST(Regs, RedZoneSurvivesEmulatedHit) { check_redzone(fx_redzone_nop, fx_redzone_nop_site); }
TEST(Regs, RedZoneSurvivesOutOfLineHit) { check_redzone(fx_redzone_xol, fx_redzone_xol_site); }
TEST(Regs, RedZoneSurvivesOutOfLineHitSingleStep) {
  ConfigGuard g;
  uprobe::Config c;
  c.xol = uprobe::XolMode::single_step;
  uprobe::configure(c);
  check_redzone(fx_redzone_xol, fx_redzone_xol_site);
}

TEST(Regs, InHandlerIsTrueOnlyInsideHandler) {
  struct H : uprobe::Consumer {
    std::atomic<int> inside{0}, hits{0};
    Action handler(Regs&) override {
      hits.fetch_add(1);
      if (uprobe::in_handler()) inside.fetch_add(1);
      return Action::keep;
    }
  } h;
  EXPECT_FALSE(uprobe::in_handler());
  uprobe::Attachment a(fx_addr(fx_nop1), h);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(fx_nop1(static_cast<std::uint64_t>(i), 0), i + 1u);
  EXPECT_EQ(h.hits.load(), 10);
  EXPECT_EQ(h.inside.load(), 10);
  EXPECT_FALSE(uprobe::in_handler());
}

}  // namespace
