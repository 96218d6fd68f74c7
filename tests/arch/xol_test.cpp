// SPDX-License-Identifier: MIT
/// @file xol_test.cpp
/// build_xol(): exact bytes of the relocated copy, reach limits, and real
/// execution: the original instruction runs in a page near a global, its copy
/// runs in another page (written RW, sealed R-X), and the jump back lands on
/// a `ret` right after the original, so both can be called as functions.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arch.hpp"
#include "decode.hpp"
#include "fixtures.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;

using uprobe::test::decode;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

TEST(BuildXol, RipRelativeBytesExact) {
  const Insn insn = decode({0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00});  // mov rax, [rip + 0x100]
  std::uint8_t out[kXolSlotSize];
  std::memset(out, 0xaa, sizeof out);
  std::string why = "stale";
  ASSERT_EQ(build_xol(insn, 0x400000, 0x500000, out, why), 24u);
  EXPECT_EQ(why, "");
  // target 0x400107; new disp = 0x400107 - 0x500007 = -0xfff00
  const Bytes want = {0x48, 0x8b, 0x05, 0x00, 0x01, 0xf0, 0xff,         // relocated
                      0xff, 0x25, 0x03, 0x00, 0x00, 0x00,               // jmp [rip + 3]
                      0xcc, 0xcc, 0xcc,                                 // padding: the quadword at slot + 16
                      0x07, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00};  // 0x400007
  EXPECT_EQ(Bytes(out, out + 24), want);
  EXPECT_EQ(out[24], 0xaa);  // nothing written past the copy
}

TEST(BuildXol, ImmediateAfterDisplacementKept) {
  // mov dword ptr [rip - 0x10], 0x12345678
  const Insn insn = decode({0xc7, 0x05, 0xf0, 0xff, 0xff, 0xff, 0x78, 0x56, 0x34, 0x12});
  std::uint8_t out[kXolSlotSize];
  std::string why;
  ASSERT_EQ(build_xol(insn, 0x7000'0000, 0x7000'0000 - 0x20, out, why), 24u);
  // target 0x6ffffffa; new disp = target - (0x6fffffe0 + 10) = 0x10
  const Bytes want = {0xc7, 0x05, 0x10, 0x00, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0xff, 0x25,
                      0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(Bytes(out, out + 24), want);
}

TEST(BuildXol, PlainInstructionCopiedVerbatim) {
  const Insn insn = decode({0x48, 0x89, 0xe5});
  std::uint8_t out[kXolSlotSize];
  std::string why;
  ASSERT_EQ(build_xol(insn, 0x7f00'1234'5678ull, 0x1000, out, why), 24u);
  const Bytes want = {0x48, 0x89, 0xe5, 0xff, 0x25, 0x07, 0x00, 0x00, 0x00, 0xcc, 0xcc, 0xcc,
                      0xcc, 0xcc, 0xcc, 0xcc, 0x7b, 0x56, 0x34, 0x12, 0x00, 0x7f, 0x00, 0x00};
  EXPECT_EQ(Bytes(out, out + 24), want);
}

TEST(BuildXol, LongestInstructionFitsSlot) {
  const Bytes nop15 = {0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x2e, 0x0f,
                       0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};
  const Insn insn = decode(nop15);
  ASSERT_EQ(insn.len, 15);
  std::uint8_t out[kXolSlotSize];
  std::string why;
  EXPECT_EQ(build_xol(insn, 0x1000, 0x2000, out, why), 32u);  // 15 + jmp 6 + pad 3 + quad 8
  EXPECT_EQ(Bytes(out, out + 15), nop15);
  EXPECT_EQ(Bytes(out + 15, out + 24), Bytes({0xff, 0x25, 0x03, 0x00, 0x00, 0x00, 0xcc, 0xcc, 0xcc}));
  std::uint64_t back;
  std::memcpy(&back, out + 24, 8);
  EXPECT_EQ(back, 0x100fu);
}

TEST(BuildXol, OutOfReach) {
  const Insn insn = decode({0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00});
  std::uint8_t out[kXolSlotSize];
  std::string why;
  EXPECT_EQ(build_xol(insn, 0x400000, 0x1'0040'0000ull, out, why), 0u);
  EXPECT_EQ(why, "rip-relative target 0x400107 is out of reach of XOL slot 0x100400000");
  EXPECT_EQ(build_xol(insn, 0x7fff'0000'0000ull, 0x1000, out, why), 0u);
  EXPECT_EQ(why, "rip-relative target 0x7fff00000107 is out of reach of XOL slot 0x1000");
}

TEST(BuildXol, ReachBoundaries) {
  const Insn insn = decode({0x48, 0x8d, 0x05, 0x00, 0x00, 0x00, 0x00});  // lea rax, [rip]
  const std::uint64_t ip = 0x10'0000'0000ull;
  const std::uint64_t target = ip + 7;
  std::uint8_t out[kXolSlotSize];
  std::string why;
  // new disp = target - (slot + 7)
  const std::uint64_t lowest = target - 7 - 0x7fff'ffffull;   // disp = INT32_MAX
  const std::uint64_t highest = target - 7 + 0x8000'0000ull;  // disp = INT32_MIN
  // lowest + 13 is 6 mod 8: 2 bytes of padding; highest + 13 is 5 mod 8: 3.
  ASSERT_EQ(build_xol(insn, ip, lowest, out, why), 23u) << why;
  std::int32_t d;
  std::memcpy(&d, out + 3, 4);
  EXPECT_EQ(d, INT32_MAX);
  ASSERT_EQ(build_xol(insn, ip, highest, out, why), 24u) << why;
  std::memcpy(&d, out + 3, 4);
  EXPECT_EQ(d, INT32_MIN);
  EXPECT_EQ(build_xol(insn, ip, lowest - 1, out, why), 0u);
  EXPECT_EQ(why, "rip-relative target " + hex(target) + " is out of reach of XOL slot " +
                     hex(lowest - 1));
  EXPECT_EQ(build_xol(insn, ip, highest + 1, out, why), 0u);
  EXPECT_EQ(why, "rip-relative target " + hex(target) + " is out of reach of XOL slot " +
                     hex(highest + 1));
}

// The jump back's quadword is 8-byte aligned for every instruction length and
// every 8-aligned slot (the runtime's slots are kXolSlotSize-aligned), so a
// copy running with rflags.AC set does not raise #AC on it (found by
// tests/fuzz xol_fuzz: a probed popf that set AC died by SIGBUS in the slot).
TEST(BuildXol, JumpBackQuadwordAligned) {
  // nop forms of length 1..15: 90, 66 90, 0f 1f 00, ..., 66*6 2e 0f 1f 84 00*5.
  const Bytes nops[] = {
      {0x90},
      {0x66, 0x90},
      {0x0f, 0x1f, 0x00},
      {0x0f, 0x1f, 0x40, 0x00},
      {0x0f, 0x1f, 0x44, 0x00, 0x00},
      {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00},
      {0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00},
      {0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x66, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x66, 0x66, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
      {0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
  };
  for (const Bytes& b : nops) {
    const Insn insn = decode(b);
    ASSERT_EQ(insn.len, b.size());
    for (std::uint64_t slot : {0x10000ull, 0x10008ull, 0x10020ull, 0x7f12'3456'7000ull}) {
      const std::uint64_t ip = 0x400000 + 3;
      std::uint8_t out[kXolSlotSize + 1];
      std::memset(out, 0xaa, sizeof out);
      std::string why;
      const std::size_t n = build_xol(insn, ip, slot, out, why);
      ASSERT_GE(n, insn.len + 14u) << insn.text;
      ASSERT_LE(n, kXolSlotSize) << insn.text;
      EXPECT_EQ(out[kXolSlotSize], 0xaa);
      EXPECT_EQ(Bytes(out, out + insn.len), b);
      // jmp qword ptr [rip + pad]; pad int3; quadword = ip + len, 8-aligned.
      const std::size_t pad = n - insn.len - 14;
      EXPECT_LT(pad, 8u);
      EXPECT_EQ(out[insn.len], 0xff);
      EXPECT_EQ(out[insn.len + 1], 0x25);
      std::int32_t disp;
      std::memcpy(&disp, out + insn.len + 2, 4);
      EXPECT_EQ(static_cast<std::size_t>(disp), pad);
      for (std::size_t i = 0; i < pad; ++i) EXPECT_EQ(out[insn.len + 6 + i], kBreakpoint);
      EXPECT_EQ((slot + n - 8) % 8, 0u) << insn.text << " at " << hex(slot);
      std::uint64_t back;
      std::memcpy(&back, out + n - 8, 8);
      EXPECT_EQ(back, ip + insn.len);
    }
  }
}

TEST(BuildXol, RipTarget) {
  const Insn a = decode({0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00});
  EXPECT_EQ(rip_target(a, 0x400000), 0x400107u);
  const Insn b = decode({0x48, 0x8d, 0x05, 0xf0, 0xff, 0xff, 0xff});
  EXPECT_EQ(rip_target(b, 0x400000), 0x3ffff7u);
}

// The step trap of a single-stepped copy (XolMode::single_step): where it may
// arrive for each kind of instruction, and where the program continues.
constexpr std::uint64_t kIp = 0x400000, kSlot = 0x9000, kSp = 0x7ff0;

StepEnd end_at(const StepPlan& p, std::uint64_t trap_ip, std::uint64_t trap_sp, std::uint64_t& resume) {
  resume = 0xdead;
  return single_step_end(p, trap_ip, trap_sp, resume);
}

TEST(SingleStep, PlainInstructionEndsAtTheEndOfTheCopy) {
  const Insn insn = decode({0x48, 0x89, 0xe5});  // mov rbp, rsp
  Regs r{};
  r.rsp = kSp;
  const StepPlan p = plan_single_step(insn, kIp, kSlot, r);
  EXPECT_EQ(p.kind, StepEndKind::next);
  EXPECT_EQ(p.ip, kIp);
  EXPECT_EQ(p.slot, kSlot);
  EXPECT_EQ(p.len, 3u);
  std::uint64_t resume;
  EXPECT_EQ(end_at(p, kSlot + 3, kSp, resume), StepEnd::done);
  EXPECT_EQ(resume, kIp + 3);
  // e.g. a fault inside the copy, or a trap somewhere else: not ours.
  EXPECT_EQ(end_at(p, kSlot, kSp, resume), StepEnd::foreign);
  EXPECT_EQ(end_at(p, 0x1234, kSp, resume), StepEnd::foreign);
  EXPECT_EQ(end_at(p, kIp + 3, kSp, resume), StepEnd::foreign);
  EXPECT_EQ(resume, 0xdeadu);
}

TEST(SingleStep, ReturnsEndAtTheTargetWithTheirStackPointer) {
  Regs r{};
  r.rsp = kSp;
  const StepPlan p = plan_single_step(decode({0xc3}), kIp, kSlot, r);  // ret
  EXPECT_EQ(p.kind, StepEndKind::branch);
  EXPECT_EQ(p.sp, kSp + 8);
  std::uint64_t resume;
  EXPECT_EQ(end_at(p, 0x401234, kSp + 8, resume), StepEnd::done);
  EXPECT_EQ(resume, 0x401234u);
  EXPECT_EQ(end_at(p, 0x401234, kSp, resume), StepEnd::foreign);      // another stack pointer
  EXPECT_EQ(end_at(p, kSlot, kSp + 8, resume), StepEnd::foreign);     // still in the slot (a fault)
  EXPECT_EQ(end_at(p, kSlot + 1, kSp + 8, resume), StepEnd::foreign);
  const StepPlan rep = plan_single_step(decode({0xf3, 0xc3}), kIp, kSlot, r);  // rep ret
  EXPECT_EQ(rep.kind, StepEndKind::branch);
  EXPECT_EQ(rep.sp, kSp + 8);
  const StepPlan imm = plan_single_step(decode({0xc2, 0x10, 0x00}), kIp, kSlot, r);  // ret 0x10
  EXPECT_EQ(imm.kind, StepEndKind::branch);
  EXPECT_EQ(imm.sp, kSp + 8 + 16);
  EXPECT_EQ(end_at(imm, 0x401234, kSp + 24, resume), StepEnd::done);
  EXPECT_EQ(resume, 0x401234u);
  EXPECT_EQ(end_at(imm, 0x401234, kSp + 8, resume), StepEnd::foreign);
}

TEST(SingleStep, IndirectJumpsEndAtTheTargetWithTheSameStackPointer) {
  Regs r{};
  r.rsp = kSp;
  for (const Bytes& b : {Bytes{0xff, 0xe0}, Bytes{0x41, 0xff, 0xe3}, Bytes{0xff, 0x24, 0xc6}}) {  // rax, r11, [rsi+rax*8]
    const Insn insn = decode(b);
    SCOPED_TRACE(insn.text);
    const StepPlan p = plan_single_step(insn, kIp, kSlot, r);
    EXPECT_EQ(p.kind, StepEndKind::branch);
    EXPECT_EQ(p.sp, kSp);
    std::uint64_t resume;
    EXPECT_EQ(end_at(p, 0x7f0000001000, kSp, resume), StepEnd::done);
    EXPECT_EQ(resume, 0x7f0000001000u);
    EXPECT_EQ(end_at(p, 0x7f0000001000, kSp - 8, resume), StepEnd::foreign);
  }
}

TEST(SingleStep, RepStringInstructionsRepeatAtTheSlot) {
  Regs r{};
  r.rsp = kSp;
  for (const Bytes& b : {Bytes{0xf3, 0xa4}, Bytes{0xf3, 0x48, 0xab}, Bytes{0xf2, 0xae}, Bytes{0x67, 0xf3, 0xa5}}) {
    const Insn insn = decode(b);
    SCOPED_TRACE(insn.text);
    const StepPlan p = plan_single_step(insn, kIp, kSlot, r);
    EXPECT_EQ(p.kind, StepEndKind::rep);
    std::uint64_t resume;
    EXPECT_EQ(end_at(p, kSlot, kSp, resume), StepEnd::again);
    EXPECT_EQ(end_at(p, kSlot + insn.len, kSp, resume), StepEnd::done);
    EXPECT_EQ(resume, kIp + insn.len);
    EXPECT_EQ(end_at(p, kIp, kSp, resume), StepEnd::foreign);
  }
  // Without rep, a string instruction runs once: a trap at the slot is not its.
  const StepPlan once = plan_single_step(decode({0xa4}), kIp, kSlot, r);  // movsb
  EXPECT_EQ(once.kind, StepEndKind::next);
  std::uint64_t resume;
  EXPECT_EQ(end_at(once, kSlot, kSp, resume), StepEnd::foreign);
}

TEST(SingleStep, SystemCallsEndAfterTheJumpBack) {
  Regs r{};
  r.rsp = kSp;
  const StepPlan p = plan_single_step(decode({0x0f, 0x05}), kIp, kSlot, r);  // syscall
  EXPECT_EQ(p.kind, StepEndKind::kernel);
  std::uint64_t resume;
  EXPECT_EQ(end_at(p, kIp + 2, kSp, resume), StepEnd::done);
  EXPECT_EQ(resume, kIp + 2);
  EXPECT_EQ(end_at(p, kSlot + 2, kSp, resume), StepEnd::done);
  EXPECT_EQ(resume, kIp + 2);
  EXPECT_EQ(end_at(p, kSlot, kSp, resume), StepEnd::foreign);
}

// --- execution ---------------------------------------------------------------

alignas(8) volatile std::uint64_t g_value = 0x1122'3344'5566'7788ull;

/// An original site near g_value (code, then `ret` at ip + len) and a slot
/// page elsewhere but still within reach of g_value.
class XolRun : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto g = reinterpret_cast<std::uint64_t>(&g_value);
    const std::uint64_t site_at = test::find_free_near(g, 64ull << 20, 512ull << 20);
    ASSERT_NE(site_at, 0u);
    site_ = std::make_unique<test::CodePage>(site_at);
    ASSERT_TRUE(site_->ok());
    const std::uint64_t slot_at = test::find_free_near(g, 1ull << 30, (2ull << 30) - (64ull << 20));
    ASSERT_NE(slot_at, 0u);
    slot_page_ = std::make_unique<test::CodePage>(slot_at);
    ASSERT_TRUE(slot_page_->ok());
  }

  /// `prefix` + disp32 aimed at g_value from the site + `suffix`.
  Bytes with_disp_to_global(const Bytes& prefix, const Bytes& suffix) const {
    const std::size_t len = prefix.size() + 4 + suffix.size();
    const auto disp = static_cast<std::int64_t>(reinterpret_cast<std::uint64_t>(&g_value) -
                                                (site_->addr() + len));
    EXPECT_TRUE(disp >= INT32_MIN && disp <= INT32_MAX);
    const auto d = static_cast<std::int32_t>(disp);
    Bytes b = prefix;
    b.resize(prefix.size() + 4);
    std::memcpy(b.data() + prefix.size(), &d, 4);
    b.insert(b.end(), suffix.begin(), suffix.end());
    return b;
  }

  /// Installs `b` + ret at the site and its XOL copy in the slot page
  /// (offset 64, so the slot is not page aligned). Returns the Insn.
  Insn install(const Bytes& b) {
    const Insn insn = decode(b);
    EXPECT_EQ(insn.len, b.size());
    Bytes site = b;
    site.push_back(0xc3);
    site_->write(0, site);
    EXPECT_TRUE(site_->seal());
    slot_ = slot_page_->addr() + 64;
    std::uint8_t copy[kXolSlotSize];
    std::string why;
    const std::size_t n = build_xol(insn, site_->addr(), slot_, copy, why);
    // copy, jmp [rip + pad], pad, the 8-aligned quadword (slot_ is 8-aligned)
    const std::size_t pad = (8 - (insn.len + 6u) % 8) % 8;
    EXPECT_EQ(n, insn.len + 6u + pad + 8u) << why;
    EXPECT_EQ((slot_ + n - 8) % 8, 0u);
    slot_page_->write(64, copy, n);
    EXPECT_TRUE(slot_page_->seal());
    return insn;
  }

  std::uint64_t run_original(std::uint64_t rax) {
    return uprobe_test_call(reinterpret_cast<const void*>(site_->addr()), rax);
  }
  std::uint64_t run_copy(std::uint64_t rax) {
    return uprobe_test_call(reinterpret_cast<const void*>(slot_), rax);
  }

  std::unique_ptr<test::CodePage> site_, slot_page_;
  std::uint64_t slot_ = 0;
};

TEST_F(XolRun, MovRipRelativeLoadsSameValue) {
  const Insn insn = install(with_disp_to_global({0x48, 0x8b, 0x05}, {}));  // mov rax, [rip + X]
  ASSERT_TRUE(insn.rip_relative);
  EXPECT_EQ(rip_target(insn, site_->addr()), reinterpret_cast<std::uint64_t>(&g_value));
  g_value = 0x1122'3344'5566'7788ull;
  EXPECT_EQ(run_original(0), 0x1122'3344'5566'7788ull);
  EXPECT_EQ(run_copy(0), 0x1122'3344'5566'7788ull);
  g_value = 0xdead'beef'0bad'f00dull;
  EXPECT_EQ(run_copy(0), 0xdead'beef'0bad'f00dull);
}

TEST_F(XolRun, LeaRipRelativeGivesSameAddress) {
  install(with_disp_to_global({0x48, 0x8d, 0x05}, {}));  // lea rax, [rip + X]
  const auto want = reinterpret_cast<std::uint64_t>(&g_value);
  EXPECT_EQ(run_original(0), want);
  EXPECT_EQ(run_copy(0), want);
}

TEST_F(XolRun, StoreWithImmediateAfterDisplacement) {
  // mov dword ptr [rip + X], 0x12345678
  install(with_disp_to_global({0xc7, 0x05}, {0x78, 0x56, 0x34, 0x12}));
  g_value = 0xffff'ffff'ffff'ffffull;
  run_copy(0);
  EXPECT_EQ(g_value, 0xffff'ffff'1234'5678ull);
  g_value = 0;
  run_original(0);
  EXPECT_EQ(g_value, 0x1234'5678ull);
}

TEST_F(XolRun, AddFromRipRelative) {
  install(with_disp_to_global({0x48, 0x03, 0x05}, {}));  // add rax, [rip + X]
  g_value = 1000;
  EXPECT_EQ(run_original(5), 1005u);
  EXPECT_EQ(run_copy(7), 1007u);
}

// The copy runs with alignment checking on (rflags.AC, as after a probed popf
// that set it): the jump back reads an aligned quadword, so no SIGBUS.
TEST_F(XolRun, CopyRunsWithAlignmentCheck) {
  install({0x48, 0x83, 0xc0, 0x10});  // add rax, 0x10 (4 bytes: an unaligned quadword before the fix)
  EXPECT_EQ(uprobe_test_call_ac(reinterpret_cast<const void*>(slot_), 5), 0x15u);
  EXPECT_EQ(uprobe_test_call_ac(reinterpret_cast<const void*>(site_->addr()), 6), 0x16u);
}

TEST_F(XolRun, PlainInstruction) {
  install({0x48, 0x83, 0xc0, 0x10});  // add rax, 0x10
  EXPECT_EQ(run_original(1), 0x11u);
  EXPECT_EQ(run_copy(2), 0x12u);
}

}  // namespace
}  // namespace uprobe::arch

namespace uprobe::arch {
namespace {

// stores_flags()/loads_flags(): the pushf/popf fixups of a single-stepped copy.
TEST(FlagsInsns, PushfAndPopfForms) {
  auto d = [](std::vector<std::uint8_t> b) {
    Insn insn;
    std::string why;
    EXPECT_TRUE(analyze(b.data(), b.size(), insn, why)) << why;
    return insn;
  };
  EXPECT_TRUE(stores_flags(d({0x9c})));         // pushfq
  EXPECT_TRUE(stores_flags(d({0x66, 0x9c})));   // pushfw
  EXPECT_FALSE(loads_flags(d({0x9c})));
  EXPECT_TRUE(loads_flags(d({0x9d})));          // popfq
  EXPECT_TRUE(loads_flags(d({0x66, 0x9d})));    // popfw
  EXPECT_FALSE(stores_flags(d({0x9d})));
  EXPECT_FALSE(stores_flags(d({0x50})));        // push rax
  EXPECT_FALSE(loads_flags(d({0x58})));         // pop rax
  EXPECT_FALSE(stores_flags(d({0x0f, 0x1f, 0x44, 0x00, 0x00})));
  EXPECT_FALSE(loads_flags(d({0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00})));
}

}  // namespace
}  // namespace uprobe::arch
