// SPDX-License-Identifier: MIT
/// @file signal_test.cpp
/// The arch pieces together, as the core uses them: an int3 at a probe site,
/// a SIGTRAP handler that reads the ucontext into Regs (and changes a
/// register or a flag, as a consumer may), then emulates the instruction or
/// redirects to its XOL copy, and writes the ucontext back.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arch.hpp"
#include "fixtures.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;

struct ProbeState {
  Insn insn;
  std::uint64_t site = 0;
  std::uint64_t slot = 0;
  std::uint64_t add_rax = 0;    // the "consumer" adds this to rax
  std::uint64_t xor_flags = 0;  // and flips these flags
  int hits = 0;
  int emulated = 0;
};

ProbeState g_probe;

void on_trap(int, siginfo_t*, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  const std::uint64_t ip = breakpoint_address(uc);
  if (ip != g_probe.site) std::abort();  // not ours: the test is broken
  Regs regs;
  regs_from_ucontext(uc, regs);
  regs.rip = ip;
  regs.rax += g_probe.add_rax;
  regs.rflags ^= g_probe.xor_flags;
  ++g_probe.hits;
  if (emulate(g_probe.insn, ip, regs)) {
    ++g_probe.emulated;
  } else {
    regs.rip = g_probe.slot;
  }
  regs_to_ucontext(regs, uc);
}

alignas(8) volatile std::uint64_t g_data = 0x0123'4567'89ab'cdefull;

class SigTrap : public ::testing::Test {
 protected:
  void SetUp() override {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGTRAP, &sa, &old_), 0);
    g_probe = ProbeState{};
    const auto g = reinterpret_cast<std::uint64_t>(&g_data);
    const std::uint64_t site_at = test::find_free_near(g, 32ull << 20, 512ull << 20);
    ASSERT_NE(site_at, 0u);
    site_ = std::make_unique<test::CodePage>(site_at);
    ASSERT_TRUE(site_->ok());
    const std::uint64_t slot_at = test::find_free_near(g, 1ull << 30, (2ull << 30) - (64ull << 20));
    ASSERT_NE(slot_at, 0u);
    slot_page_ = std::make_unique<test::CodePage>(slot_at);
    ASSERT_TRUE(slot_page_->ok());
  }
  void TearDown() override { sigaction(SIGTRAP, &old_, nullptr); }

  /// Probes `insn_bytes` placed at the site followed by `after` (at
  /// site + len), with `extra` at site + 32: writes int3 over the first byte,
  /// builds the XOL copy, seals both pages.
  void install(const Bytes& insn_bytes, const Bytes& after, const Bytes& extra = {}) {
    std::string why;
    ASSERT_TRUE(analyze(insn_bytes.data(), insn_bytes.size(), g_probe.insn, why)) << why;
    ASSERT_EQ(g_probe.insn.len, insn_bytes.size());
    Bytes site = insn_bytes;
    site[0] = kBreakpoint;
    site.insert(site.end(), after.begin(), after.end());
    site_->write(0, site);
    if (!extra.empty()) site_->write(32, extra);
    ASSERT_TRUE(site_->seal());
    g_probe.site = site_->addr();
    g_probe.slot = slot_page_->addr() + 128;
    std::uint8_t copy[kXolSlotSize];
    const std::size_t n = build_xol(g_probe.insn, g_probe.site, g_probe.slot, copy, why);
    const std::size_t pad = (8 - (g_probe.slot + g_probe.insn.len + 6u) % 8) % 8;  // quadword 8-aligned
    ASSERT_EQ(n, g_probe.insn.len + 6u + pad + 8u) << why;
    slot_page_->write(128, copy, n);
    ASSERT_TRUE(slot_page_->seal());
  }

  std::uint64_t call(std::uint64_t rax) {
    return uprobe_test_call(reinterpret_cast<const void*>(site_->addr()), rax);
  }

  /// disp32 from the end of an instruction of `len` bytes at the site to g_data.
  Bytes disp_to_data(std::size_t len) const {
    const auto d =
        static_cast<std::int32_t>(reinterpret_cast<std::uint64_t>(&g_data) - (site_->addr() + len));
    Bytes b(4);
    std::memcpy(b.data(), &d, 4);
    return b;
  }

  struct sigaction old_;
  std::unique_ptr<test::CodePage> site_, slot_page_;
};

TEST_F(SigTrap, EmulatedPushSeesHandlerChange) {
  // push rax; add qword ptr [rsp], 1; pop rax; ret
  install({0x50}, {0x48, 0x83, 0x04, 0x24, 0x01, 0x58, 0xc3});
  g_probe.add_rax = 100;
  EXPECT_EQ(call(10), 111u);
  EXPECT_EQ(call(20), 121u);
  EXPECT_EQ(g_probe.hits, 2);
  EXPECT_EQ(g_probe.emulated, 2);
}

TEST_F(SigTrap, EmulatedCallAndRet) {
  // call site+32; ret   ...   site+32: mov eax, 7; ret
  install({0xe8, 0x1b, 0x00, 0x00, 0x00}, {0xc3}, {0xb8, 0x07, 0x00, 0x00, 0x00, 0xc3});
  EXPECT_EQ(call(0), 7u);
  EXPECT_EQ(g_probe.hits, 1);
  EXPECT_EQ(g_probe.emulated, 1);
}

TEST_F(SigTrap, EmulatedRet) {
  install({0xc3}, {});
  g_probe.add_rax = 5;
  EXPECT_EQ(call(1), 6u);
  EXPECT_EQ(g_probe.emulated, 1);
}

TEST_F(SigTrap, EmulatedJccWithFlagFlippedByHandler) {
  // je +1; ret (rax 0); mov eax, 1; ret  -- run through uprobe_test_branch
  install({0x74, 0x01}, {0xc3, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3});
  std::uint64_t rcx = 0;
  const auto* code = reinterpret_cast<const void*>(site_->addr());
  EXPECT_EQ(uprobe_test_branch(code, 0x202 | 0x40, 0, &rcx), 1u);  // ZF: taken
  EXPECT_EQ(uprobe_test_branch(code, 0x202, 0, &rcx), 0u);
  g_probe.xor_flags = 0x40;  // the handler flips ZF: the branch and the CPU see it
  EXPECT_EQ(uprobe_test_branch(code, 0x202 | 0x40, 0, &rcx), 0u);
  EXPECT_EQ(uprobe_test_branch(code, 0x202, 0, &rcx), 1u);
  EXPECT_EQ(g_probe.hits, 4);
}

TEST_F(SigTrap, OutOfLineRipRelativeLoad) {
  // mov rax, [rip + X] (X aimed at g_data); ret
  Bytes insn = {0x48, 0x8b, 0x05};
  const Bytes d = disp_to_data(7);
  insn.insert(insn.end(), d.begin(), d.end());
  install(insn, {0xc3});
  ASSERT_EQ(g_probe.insn.cls, InsnClass::xol);
  g_data = 0x5a5a'1234'0000'0001ull;
  EXPECT_EQ(call(0), 0x5a5a'1234'0000'0001ull);
  g_data = 99;
  EXPECT_EQ(call(0), 99u);
  EXPECT_EQ(g_probe.hits, 2);
  EXPECT_EQ(g_probe.emulated, 0);
}

TEST_F(SigTrap, OutOfLineSeesHandlerChange) {
  // add rax, 0x10; ret -- the copy runs with the rax the handler wrote
  install({0x48, 0x83, 0xc0, 0x10}, {0xc3});
  g_probe.add_rax = 0x100;
  EXPECT_EQ(call(1), 0x111u);
  EXPECT_EQ(g_probe.emulated, 0);
}

}  // namespace
}  // namespace uprobe::arch
