// SPDX-License-Identifier: MIT
/// @file emulate_test.cpp
/// emulate(): every class on synthetic Regs with a small real stack, exact
/// expected values; Jcc and loop also checked against the CPU itself.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "arch.hpp"
#include "decode.hpp"
#include "fixtures.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;

constexpr std::uint64_t kCF = 0x1, kPF = 0x4, kZF = 0x40, kSF = 0x80, kOF = 0x800;
constexpr std::uint64_t kIp = 0x0000'5555'0000'1000ull;

using uprobe::test::decode;

/// Regs with every GPR distinct, rsp at the middle of `stack`.
Regs make_regs(std::uint64_t* stack_top) {
  Regs r{};
  r.rax = 0x1010'0000'0000'0000ull;
  r.rcx = 0x1111'0000'0000'0001ull;
  r.rdx = 0x1212'0000'0000'0002ull;
  r.rbx = 0x1313'0000'0000'0003ull;
  r.rbp = 0x1515'0000'0000'0005ull;
  r.rsi = 0x1616'0000'0000'0006ull;
  r.rdi = 0x1717'0000'0000'0007ull;
  r.r8 = 0x1818'0000'0000'0008ull;
  r.r9 = 0x1919'0000'0000'0009ull;
  r.r10 = 0x1a1a'0000'0000'000aull;
  r.r11 = 0x1b1b'0000'0000'000bull;
  r.r12 = 0x1c1c'0000'0000'000cull;
  r.r13 = 0x1d1d'0000'0000'000dull;
  r.r14 = 0x1e1e'0000'0000'000eull;
  r.r15 = 0x1f1f'0000'0000'000full;
  r.rsp = reinterpret_cast<std::uint64_t>(stack_top);
  r.rip = kIp;
  r.rflags = 0x202;
  return r;
}

/// Regs equal except for the fields the caller overwrote in `expect`.
void expect_regs(const Regs& got, const Regs& expect) {
  EXPECT_EQ(got.rip, expect.rip);
  EXPECT_EQ(got.rsp, expect.rsp);
  EXPECT_EQ(got.rcx, expect.rcx);
  EXPECT_EQ(got.rflags, expect.rflags);
  EXPECT_EQ(0, std::memcmp(&got, &expect, sizeof got));
}

class Emulate : public ::testing::Test {
 protected:
  std::uint64_t stack[32] = {};
  std::uint64_t* top = &stack[16];
  Regs regs = make_regs(top);
  std::uint64_t rsp0 = reinterpret_cast<std::uint64_t>(top);
};

TEST_F(Emulate, NopForms) {
  for (const Bytes& b : {Bytes{0x90}, Bytes{0x66, 0x90}, Bytes{0x0f, 0x1f, 0x44, 0x00, 0x00},
                         Bytes{0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
                         Bytes{0xf3, 0x0f, 0x1e, 0xfa}}) {
    Regs r = regs;
    Regs want = regs;
    want.rip = kIp + b.size();
    ASSERT_TRUE(emulate(decode(b), kIp, r));
    expect_regs(r, want);
    EXPECT_EQ(stack[15], 0u);
  }
}

TEST_F(Emulate, PushEachRegister) {
  // Field order of Insn register numbers.
  std::uint64_t Regs::*const field[16] = {&Regs::rax, &Regs::rcx, &Regs::rdx, &Regs::rbx,
                                          &Regs::rsp, &Regs::rbp, &Regs::rsi, &Regs::rdi,
                                          &Regs::r8,  &Regs::r9,  &Regs::r10, &Regs::r11,
                                          &Regs::r12, &Regs::r13, &Regs::r14, &Regs::r15};
  for (std::uint8_t n = 0; n < 16; ++n) {
    const Bytes b = n < 8 ? Bytes{static_cast<std::uint8_t>(0x50 + n)}
                          : Bytes{0x41, static_cast<std::uint8_t>(0x50 + n - 8)};
    const Insn insn = decode(b);
    ASSERT_EQ(insn.cls, InsnClass::push_reg);
    ASSERT_EQ(insn.reg, n);
    std::memset(stack, 0, sizeof stack);
    Regs r = regs;
    Regs want = regs;
    want.rsp = rsp0 - 8;
    want.rip = kIp + b.size();
    ASSERT_TRUE(emulate(insn, kIp, r)) << int(n);
    expect_regs(r, want);
    EXPECT_EQ(stack[15], regs.*field[n]) << int(n);  // push rsp stores the old rsp
    EXPECT_EQ(stack[16], 0u);
  }
  EXPECT_EQ(regs.rsp, rsp0);
}

TEST_F(Emulate, PushRspStoresOldValue) {
  ASSERT_TRUE(emulate(decode({0x54}), kIp, regs));
  EXPECT_EQ(regs.rsp, rsp0 - 8);
  EXPECT_EQ(stack[15], rsp0);
}

TEST_F(Emulate, PushViaFfSlash6) {
  ASSERT_TRUE(emulate(decode({0x41, 0xff, 0xf6}), kIp, regs));  // push r14
  EXPECT_EQ(stack[15], 0x1e1e'0000'0000'000eull);
  EXPECT_EQ(regs.rsp, rsp0 - 8);
  EXPECT_EQ(regs.rip, kIp + 3);
}

TEST_F(Emulate, JmpRel) {
  Regs r = regs, want = regs;
  ASSERT_TRUE(emulate(decode({0xeb, 0x05}), kIp, r));
  want.rip = kIp + 7;
  expect_regs(r, want);
  r = regs;
  ASSERT_TRUE(emulate(decode({0xeb, 0xfe}), kIp, r));
  EXPECT_EQ(r.rip, kIp);
  r = regs;
  ASSERT_TRUE(emulate(decode({0xe9, 0x00, 0x00, 0x00, 0x80}), kIp, r));
  EXPECT_EQ(r.rip, kIp + 5 - 0x8000'0000ull);
  r = regs;
  ASSERT_TRUE(emulate(decode({0xf2, 0xe9, 0xff, 0xff, 0xff, 0x7f}), kIp, r));
  EXPECT_EQ(r.rip, kIp + 6 + 0x7fff'ffffull);
}

TEST_F(Emulate, CallRel) {
  Regs want = regs;
  ASSERT_TRUE(emulate(decode({0xe8, 0x10, 0x20, 0x00, 0x00}), kIp, regs));
  want.rip = kIp + 5 + 0x2010;
  want.rsp = rsp0 - 8;
  expect_regs(regs, want);
  EXPECT_EQ(stack[15], kIp + 5);
  EXPECT_EQ(stack[16], 0u);
}

TEST_F(Emulate, CallRelBackwards) {
  ASSERT_TRUE(emulate(decode({0xe8, 0xfb, 0xff, 0xff, 0xff}), kIp, regs));
  EXPECT_EQ(regs.rip, kIp);
  EXPECT_EQ(regs.rsp, rsp0 - 8);
  EXPECT_EQ(stack[15], kIp + 5);
}

/// Expected Jcc outcome, spelled out per condition code.
bool jcc_expected(unsigned cc, std::uint64_t f) {
  const bool cf = f & kCF, pf = f & kPF, zf = f & kZF, sf = f & kSF, of = f & kOF;
  switch (cc) {
    case 0x0:
      return of;  // jo
    case 0x1:
      return !of;  // jno
    case 0x2:
      return cf;  // jb
    case 0x3:
      return !cf;  // jae
    case 0x4:
      return zf;  // je
    case 0x5:
      return !zf;  // jne
    case 0x6:
      return cf || zf;  // jbe
    case 0x7:
      return !cf && !zf;  // ja
    case 0x8:
      return sf;  // js
    case 0x9:
      return !sf;  // jns
    case 0xa:
      return pf;  // jp
    case 0xb:
      return !pf;  // jnp
    case 0xc:
      return sf != of;  // jl
    case 0xd:
      return sf == of;  // jge
    case 0xe:
      return zf || sf != of;  // jle
    default:
      return !zf && sf == of;  // jg
  }
}

/// Every combination of CF PF ZF SF OF.
std::vector<std::uint64_t> all_flag_sets() {
  std::vector<std::uint64_t> v;
  const std::uint64_t bits[5] = {kCF, kPF, kZF, kSF, kOF};
  for (unsigned m = 0; m < 32; ++m) {
    std::uint64_t f = 0x202;
    for (unsigned i = 0; i < 5; ++i)
      if (m & (1u << i)) f |= bits[i];
    v.push_back(f);
  }
  return v;
}

TEST_F(Emulate, JccEachConditionBothWays) {
  // A flag set that takes and one that does not take each condition.
  struct Way {
    std::uint64_t taken, not_taken;
  };
  const Way ways[16] = {
      {kOF, 0},         {0, kOF},         {kCF, 0}, {0, kCF},         {kZF, 0}, {0, kZF},
      {kZF, 0},         {0, kCF},         {kSF, 0}, {0, kSF},         {kPF, 0}, {0, kPF},
      {kSF, kSF | kOF}, {kSF | kOF, kOF}, {kZF, 0}, {kSF | kOF, kZF},
  };
  for (unsigned cc = 0; cc < 16; ++cc) {
    for (bool rel32 : {false, true}) {
      const Bytes b =
          rel32 ? Bytes{0x0f, static_cast<std::uint8_t>(0x80 | cc), 0x00, 0x01, 0x00, 0x00}
                : Bytes{static_cast<std::uint8_t>(0x70 | cc), 0x80};
      const Insn insn = decode(b);
      ASSERT_EQ(insn.cls, InsnClass::jcc_rel);
      ASSERT_EQ(insn.cond, cc);
      const std::uint64_t next = kIp + b.size();
      const std::uint64_t target = rel32 ? next + 0x100 : next - 0x80;
      for (int t = 0; t < 2; ++t) {
        const std::uint64_t f = 0x202 | (t == 0 ? ways[cc].taken : ways[cc].not_taken);
        ASSERT_EQ(jcc_expected(cc, f), t == 0) << cc;  // the table is right
        Regs r = regs, want = regs;
        r.rflags = want.rflags = f;
        want.rip = t == 0 ? target : next;
        ASSERT_TRUE(emulate(insn, kIp, r));
        expect_regs(r, want);
      }
    }
  }
}

TEST_F(Emulate, JccAllFlagCombinations) {
  for (unsigned cc = 0; cc < 16; ++cc) {
    const Insn insn = decode({static_cast<std::uint8_t>(0x70 | cc), 0x10});
    for (std::uint64_t f : all_flag_sets()) {
      Regs r = regs;
      r.rflags = f;
      ASSERT_TRUE(emulate(insn, kIp, r));
      EXPECT_EQ(r.rip, jcc_expected(cc, f) ? kIp + 0x12 : kIp + 2) << cc << " " << f;
    }
  }
}

/// Runs `b` (a branch to +1) followed by `ret; mov eax, 1; ret` natively
/// with the given flags and rcx; returns taken and rcx after.
struct Native {
  bool taken;
  std::uint64_t rcx;
};

class NativeBranch {
 public:
  NativeBranch() = default;
  Native run(const Bytes& b, std::uint64_t flags, std::uint64_t rcx) {
    test::CodePage page;
    EXPECT_TRUE(page.ok());
    if (!page.ok()) return {};
    Bytes code = b;
    for (std::uint8_t c : {0xc3, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3}) code.push_back(c);
    page.write(0, code);
    EXPECT_TRUE(page.seal());
    std::uint64_t rcx_out = 0;
    const std::uint64_t rax = uprobe_test_branch(page.data(), flags, rcx, &rcx_out);
    return {rax == 1, rcx_out};
  }
};

TEST_F(Emulate, JccMatchesCpu) {
  NativeBranch native;
  for (unsigned cc = 0; cc < 16; ++cc) {
    for (bool rel32 : {false, true}) {
      const Bytes b =
          rel32 ? Bytes{0x0f, static_cast<std::uint8_t>(0x80 | cc), 0x01, 0x00, 0x00, 0x00}
                : Bytes{static_cast<std::uint8_t>(0x70 | cc), 0x01};
      const Insn insn = decode(b);
      for (std::uint64_t f : all_flag_sets()) {
        const Native n = native.run(b, f, 0);
        Regs r = regs;
        r.rflags = f;
        ASSERT_TRUE(emulate(insn, kIp, r));
        EXPECT_EQ(r.rip, kIp + b.size() + (n.taken ? 1 : 0)) << "cc " << cc << " flags " << f;
      }
    }
  }
}

TEST_F(Emulate, LoopVariants) {
  struct Case {
    Bytes bytes;
    std::uint64_t rcx, flags;
    bool taken;
    std::uint64_t rcx_after;
  };
  const Case cases[] = {
      {{0xe2, 0x10}, 5, 0x202, true, 4},  // loop
      {{0xe2, 0x10}, 1, 0x202, false, 0},
      {{0xe2, 0x10}, 0, 0x202, true, ~0ull},
      {{0xe2, 0x10}, 0x1'0000'0000ull, 0x202, true, 0xffff'ffffull},
      {{0xe1, 0x10}, 5, 0x202 | kZF, true, 4},  // loope
      {{0xe1, 0x10}, 5, 0x202, false, 4},
      {{0xe1, 0x10}, 1, 0x202 | kZF, false, 0},
      {{0xe0, 0x10}, 5, 0x202, true, 4},  // loopne
      {{0xe0, 0x10}, 5, 0x202 | kZF, false, 4},
      {{0xe0, 0x10}, 1, 0x202, false, 0},
      {{0xe3, 0x10}, 0, 0x202, true, 0},  // jrcxz
      {{0xe3, 0x10}, 0x1'0000'0000ull, 0x202, false, 0x1'0000'0000ull},
      {{0x67, 0xe3, 0x10}, 0x1'0000'0000ull, 0x202, true, 0x1'0000'0000ull},  // jecxz
      {{0x67, 0xe3, 0x10}, 1, 0x202, false, 1},
      {{0x67, 0xe2, 0x10}, 0x1'0000'0005ull, 0x202, true, 4},  // loop ecx
      {{0x67, 0xe2, 0x10}, 0x1'0000'0001ull, 0x202, false, 0},
      {{0x67, 0xe2, 0x10}, 0x1'0000'0000ull, 0x202, true, 0xffff'ffffull},
      {{0x67, 0xe1, 0x10}, 0xffff'ffff'0000'0003ull, 0x202 | kZF, true, 2},  // loope ecx
      {{0x67, 0xe1, 0x10}, 3, 0x202, false, 2},
      {{0x67, 0xe0, 0x10}, 3, 0x202, true, 2},  // loopne ecx
      {{0x67, 0xe0, 0x10}, 3, 0x202 | kZF, false, 2},
  };
  for (const Case& c : cases) {
    Regs r = regs, want = regs;
    r.rcx = c.rcx;
    r.rflags = want.rflags = c.flags;
    want.rcx = c.rcx_after;
    want.rip = kIp + c.bytes.size() + (c.taken ? 0x10 : 0);
    ASSERT_TRUE(emulate(decode(c.bytes), kIp, r));
    expect_regs(r, want);
  }
}

TEST_F(Emulate, LoopMatchesCpu) {
  NativeBranch native;
  const Bytes forms[] = {{0xe2, 0x01},       {0xe1, 0x01},       {0xe0, 0x01},
                         {0xe3, 0x01},       {0x67, 0xe3, 0x01}, {0x67, 0xe2, 0x01},
                         {0x67, 0xe1, 0x01}, {0x67, 0xe0, 0x01}};
  const std::uint64_t counts[] = {0,
                                  1,
                                  2,
                                  0xffff'ffffull,
                                  0x1'0000'0000ull,
                                  0x1'0000'0001ull,
                                  0xffff'ffff'ffff'ffffull,
                                  0x8000'0000'0000'0002ull};
  for (const Bytes& b : forms) {
    const Insn insn = decode(b);
    ASSERT_EQ(insn.cls, InsnClass::loop_rel);
    for (std::uint64_t rcx : counts) {
      for (std::uint64_t f : {std::uint64_t{0x202}, std::uint64_t{0x202 | kZF}}) {
        const Native n = native.run(b, f, rcx);
        Regs r = regs;
        r.rcx = rcx;
        r.rflags = f;
        ASSERT_TRUE(emulate(insn, kIp, r));
        EXPECT_EQ(r.rip, kIp + b.size() + (n.taken ? 1 : 0)) << insn.text << " rcx " << rcx;
        EXPECT_EQ(r.rcx, n.rcx) << insn.text << " rcx " << rcx;
      }
    }
  }
}

TEST_F(Emulate, Ret) {
  stack[16] = 0x4000'1234ull;
  Regs want = regs;
  want.rip = 0x4000'1234ull;
  want.rsp = rsp0 + 8;
  ASSERT_TRUE(emulate(decode({0xc3}), kIp, regs));
  expect_regs(regs, want);
}

TEST_F(Emulate, RepAndBndRet) {
  stack[16] = 0x4000'5678ull;
  for (const Bytes& b : {Bytes{0xf3, 0xc3}, Bytes{0xf2, 0xc3}}) {
    Regs r = regs;
    ASSERT_TRUE(emulate(decode(b), kIp, r));
    EXPECT_EQ(r.rip, 0x4000'5678ull);
    EXPECT_EQ(r.rsp, rsp0 + 8);
  }
}

TEST_F(Emulate, RetImm) {
  stack[16] = 0x4000'9abcull;
  ASSERT_TRUE(emulate(decode({0xc2, 0x18, 0x00}), kIp, regs));
  EXPECT_EQ(regs.rip, 0x4000'9abcull);
  EXPECT_EQ(regs.rsp, rsp0 + 8 + 0x18);
}

TEST_F(Emulate, JmpIndirectRegister) {
  Regs want = regs;
  want.rip = regs.r11;
  ASSERT_TRUE(emulate(decode({0x41, 0xff, 0xe3}), kIp, regs));
  expect_regs(regs, want);
}

TEST_F(Emulate, CallIndirectRegister) {
  Regs want = regs;
  want.rip = regs.rax;
  want.rsp = rsp0 - 8;
  ASSERT_TRUE(emulate(decode({0xff, 0xd0}), kIp, regs));
  expect_regs(regs, want);
  EXPECT_EQ(stack[15], kIp + 2);
}

TEST_F(Emulate, CallIndirectRspUsesOldRsp) {
  Regs want = regs;
  want.rip = rsp0;
  want.rsp = rsp0 - 8;
  ASSERT_TRUE(emulate(decode({0xff, 0xd4}), kIp, regs));  // call rsp
  expect_regs(regs, want);
  EXPECT_EQ(stack[15], kIp + 2);
}

TEST_F(Emulate, CallIndirectMemoryBaseIndexScaleDisp) {
  std::uint64_t table[8] = {};
  table[5] = 0x7777'0000'1111ull;
  // call [rbx + r12*8 + 0x10]: 42 ff 54 e3 10
  regs.rbx = reinterpret_cast<std::uint64_t>(table) - 0x10;
  regs.r12 = 5;
  Regs want = regs;
  want.rip = 0x7777'0000'1111ull;
  want.rsp = rsp0 - 8;
  const Insn insn = decode({0x42, 0xff, 0x54, 0xe3, 0x10});
  ASSERT_EQ(insn.cls, InsnClass::call_ind);
  ASSERT_EQ(insn.mem_base, 3);
  ASSERT_EQ(insn.mem_index, 12);
  ASSERT_EQ(insn.mem_scale, 8);
  ASSERT_EQ(insn.mem_disp, 0x10);
  ASSERT_TRUE(emulate(insn, kIp, regs));
  expect_regs(regs, want);
  EXPECT_EQ(stack[15], kIp + 5);
}

TEST_F(Emulate, JmpIndirectIndexOnly) {
  std::uint64_t table[4] = {0, 0, 0x1234'5678ull, 0};
  // jmp [rcx*4 + disp32]: ff 24 8d disp32
  const std::uint64_t disp = reinterpret_cast<std::uint64_t>(table) & 0x7fff'ffffull;
  const std::uint64_t base = reinterpret_cast<std::uint64_t>(table) - disp;
  ASSERT_EQ(base % 4, 0u);
  regs.rcx = (base + 16) / 4;
  const Insn insn = decode(
      {0xff, 0x24, 0x8d, static_cast<std::uint8_t>(disp), static_cast<std::uint8_t>(disp >> 8),
       static_cast<std::uint8_t>(disp >> 16), static_cast<std::uint8_t>(disp >> 24)});
  ASSERT_EQ(insn.mem_base, kNoReg);
  ASSERT_EQ(insn.mem_index, 1);
  ASSERT_EQ(insn.mem_scale, 4);
  ASSERT_TRUE(emulate(insn, kIp, regs));
  EXPECT_EQ(regs.rip, 0x1234'5678ull);
  EXPECT_EQ(regs.rsp, rsp0);
}

TEST_F(Emulate, CallIndirectStackSlotUsesOldRsp) {
  stack[17] = 0x5555'aaaa'0000ull;  // [rsp + 8] before the push
  ASSERT_TRUE(emulate(decode({0xff, 0x54, 0x24, 0x08}), kIp, regs));
  EXPECT_EQ(regs.rip, 0x5555'aaaa'0000ull);
  EXPECT_EQ(regs.rsp, rsp0 - 8);
  EXPECT_EQ(stack[15], kIp + 4);
}

TEST_F(Emulate, IndirectRipRelativeReadsRealMemory) {
  static std::uint64_t pointer_slot = 0x6666'0000'4242ull;
  // ip chosen so that next ip + 0x100 is &pointer_slot, as the CPU computes it.
  const std::uint64_t slot = reinterpret_cast<std::uint64_t>(&pointer_slot);
  const Insn jmp = decode({0xff, 0x25, 0x00, 0x01, 0x00, 0x00});
  const std::uint64_t ip = slot - 0x100 - 6;
  Regs r = regs;
  r.rip = ip;
  Regs want = r;
  want.rip = 0x6666'0000'4242ull;
  ASSERT_TRUE(emulate(jmp, ip, r));
  expect_regs(r, want);

  const Insn call = decode({0xff, 0x15, 0xf0, 0xff, 0xff, 0xff});  // call [rip - 0x10]
  const std::uint64_t ip2 = slot + 0x10 - 6;
  r = regs;
  r.rip = ip2;
  ASSERT_TRUE(emulate(call, ip2, r));
  EXPECT_EQ(r.rip, 0x6666'0000'4242ull);
  EXPECT_EQ(r.rsp, rsp0 - 8);
  EXPECT_EQ(stack[15], ip2 + 6);
}

TEST_F(Emulate, XolClassIsNotEmulated) {
  const Insn insn = decode({0x48, 0x89, 0xe5});
  EXPECT_FALSE(is_emulated(insn));
  Regs r = regs;
  EXPECT_FALSE(emulate(insn, kIp, r));
  EXPECT_EQ(0, std::memcmp(&r, &regs, sizeof r));
}

}  // namespace
}  // namespace uprobe::arch
