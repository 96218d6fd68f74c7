// SPDX-License-Identifier: MIT
/// @file analyze_test.cpp
/// analyze(): classification of byte sequences into InsnClass with every
/// field asserted, and the refusals with their reasons. Capstone decodes at
/// address 0, so branch targets in `text` are len + rel.

#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "arch.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;
constexpr std::uint8_t N = kNoReg;
constexpr std::uint8_t RIP = kRipReg;

struct Expect {
  const char* name;
  Bytes bytes;
  InsnClass cls;
  std::uint8_t len;
  const char* text;
  std::uint8_t reg = N;
  std::uint8_t cond = 0;
  std::int64_t rel = 0;
  std::uint16_t imm = 0;
  std::uint8_t mem_base = N;
  std::uint8_t mem_index = N;
  std::uint8_t mem_scale = 1;
  std::int64_t mem_disp = 0;
  bool rip_relative = false;
  std::uint8_t disp_offset = 0;
  std::int32_t disp = 0;
};

void PrintTo(const Expect& e, std::ostream* os) { *os << e.name; }

class Classify : public ::testing::TestWithParam<Expect> {};

TEST_P(Classify, Fields) {
  const Expect& e = GetParam();
  Bytes buf = e.bytes;
  buf.resize(buf.size() + 8, 0x90);  // bytes after the instruction must not matter
  Insn insn;
  std::string why = "stale";
  ASSERT_TRUE(analyze(buf.data(), buf.size(), insn, why)) << why;
  EXPECT_EQ(why, "");
  EXPECT_EQ(insn.cls, e.cls);
  EXPECT_EQ(insn.len, e.len);
  EXPECT_EQ(insn.len, e.bytes.size());
  EXPECT_EQ(0, std::memcmp(insn.bytes, e.bytes.data(), e.bytes.size()));
  for (std::size_t i = e.bytes.size(); i < sizeof insn.bytes; ++i) EXPECT_EQ(insn.bytes[i], 0) << i;
  EXPECT_EQ(insn.text, e.text);
  EXPECT_EQ(insn.reg, e.reg);
  EXPECT_EQ(insn.cond, e.cond);
  EXPECT_EQ(insn.rel, e.rel);
  EXPECT_EQ(insn.imm, e.imm);
  EXPECT_EQ(insn.mem_base, e.mem_base);
  EXPECT_EQ(insn.mem_index, e.mem_index);
  EXPECT_EQ(insn.mem_scale, e.mem_scale);
  EXPECT_EQ(insn.mem_disp, e.mem_disp);
  EXPECT_EQ(insn.rip_relative, e.rip_relative);
  EXPECT_EQ(insn.disp_offset, e.disp_offset);
  EXPECT_EQ(insn.disp, e.disp);
  EXPECT_EQ(is_emulated(insn), e.cls != InsnClass::xol);
}

using C = InsnClass;

// clang-format off
const Expect kCases[] = {
  // nops
  {"nop", {0x90}, C::nop, 1, "nop"},
  {"nop_66", {0x66, 0x90}, C::nop, 2, "nop"},
  {"nop_rexw", {0x48, 0x90}, C::nop, 2, "nop"},
  {"nopl_rax", {0x0f, 0x1f, 0x00}, C::nop, 3, "nop dword ptr [rax]"},
  {"nopl5", {0x0f, 0x1f, 0x44, 0x00, 0x00}, C::nop, 5, "nop dword ptr [rax + rax]"},
  {"nopw6", {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}, C::nop, 6, "nop word ptr [rax + rax]"},
  {"nopw10_cs", {0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00}, C::nop, 10,
   "nop word ptr cs:[rax + rax]"},
  {"nopl_rip", {0x0f, 0x1f, 0x05, 0x00, 0x01, 0x00, 0x00}, C::nop, 7, "nop dword ptr [rip + 0x100]",
   N, 0, 0, 0, N, N, 1, 0, true, 3, 0x100},
  {"endbr64", {0xf3, 0x0f, 0x1e, 0xfa}, C::nop, 4, "endbr64"},
  {"endbr32", {0xf3, 0x0f, 0x1e, 0xfb}, C::nop, 4, "endbr32"},
  // look like nops, are not
  {"xchg_eax_eax", {0x87, 0xc0}, C::xol, 2, "xchg eax, eax"},
  {"xchg_r8d_eax", {0x41, 0x90}, C::xol, 2, "xchg eax, r8d"},
  {"pause", {0xf3, 0x90}, C::xol, 2, "pause"},
  {"lock_nop", {0xf0, 0x0f, 0x1f, 0x00}, C::xol, 4, "lock nop dword ptr [rax]"},
  // push r64
  {"push_rax", {0x50}, C::push_reg, 1, "push rax", 0},
  {"push_rsp", {0x54}, C::push_reg, 1, "push rsp", 4},
  {"push_rdi", {0x57}, C::push_reg, 1, "push rdi", 7},
  {"push_r8", {0x41, 0x50}, C::push_reg, 2, "push r8", 8},
  {"push_r15", {0x41, 0x57}, C::push_reg, 2, "push r15", 15},
  {"push_ff_rbx", {0xff, 0xf3}, C::push_reg, 2, "push rbx", 3},
  {"push_ff_r12", {0x41, 0xff, 0xf4}, C::push_reg, 3, "push r12", 12},
  {"push_ax", {0x66, 0x50}, C::xol, 2, "push ax"},
  // relative jumps and calls
  {"jmp8", {0xeb, 0x05}, C::jmp_rel, 2, "jmp 7", N, 0, 5},
  {"jmp8_back", {0xeb, 0xfe}, C::jmp_rel, 2, "jmp 0", N, 0, -2},
  {"jmp32", {0xe9, 0x00, 0x01, 0x00, 0x00}, C::jmp_rel, 5, "jmp 0x105", N, 0, 0x100},
  {"bnd_jmp32", {0xf2, 0xe9, 0xf0, 0xff, 0xff, 0xff}, C::jmp_rel, 6, "bnd jmp 0xfffffffffffffff6",
   N, 0, -16},
  {"ds_jmp8", {0x3e, 0xeb, 0x05}, C::jmp_rel, 3, "jmp 8", N, 0, 5},
  {"rexw_call32", {0x48, 0xe8, 0x00, 0x01, 0x00, 0x00}, C::call_rel, 6, "call 0x106", N, 0, 0x100},
  {"bnd_call32", {0xf2, 0xe8, 0x00, 0x01, 0x00, 0x00}, C::call_rel, 6, "bnd call 0x106", N, 0, 0x100},
  {"call32", {0xe8, 0x00, 0x00, 0x00, 0x00}, C::call_rel, 5, "call 5", N, 0, 0},
  {"call32_back", {0xe8, 0xfb, 0xff, 0xff, 0xff}, C::call_rel, 5, "call 0", N, 0, -5},
  {"je8", {0x74, 0x05}, C::jcc_rel, 2, "je 7", N, 4, 5},
  {"jg8_back", {0x7f, 0xfe}, C::jcc_rel, 2, "jg 0", N, 15, -2},
  {"jo32", {0x0f, 0x80, 0x00, 0x01, 0x00, 0x00}, C::jcc_rel, 6, "jo 0x106", N, 0, 0x100},
  {"jle32", {0x0f, 0x8e, 0xfa, 0xff, 0xff, 0xff}, C::jcc_rel, 6, "jle 0", N, 14, -6},
  {"jne8_hint", {0x2e, 0x75, 0x10}, C::jcc_rel, 3, "jne 0x13", N, 5, 0x10},
  {"loop", {0xe2, 0xfe}, C::loop_rel, 2, "loop 0", N, 0, -2},
  {"loope", {0xe1, 0x10}, C::loop_rel, 2, "loope 0x12", N, 1, 0x10},
  {"loopne", {0xe0, 0x10}, C::loop_rel, 2, "loopne 0x12", N, 2, 0x10},
  {"jrcxz", {0xe3, 0x10}, C::loop_rel, 2, "jrcxz 0x12", N, 3, 0x10},
  {"jecxz", {0x67, 0xe3, 0x10}, C::loop_rel, 3, "jecxz 0x13", N, 4, 0x10},
  {"loop_ecx", {0x67, 0xe2, 0x10}, C::loop_rel, 3, "loop 0x13", N, 5, 0x10},
  {"loope_ecx", {0x67, 0xe1, 0x10}, C::loop_rel, 3, "loope 0x13", N, 6, 0x10},
  {"loopne_ecx", {0x67, 0xe0, 0x10}, C::loop_rel, 3, "loopne 0x13", N, 7, 0x10},
  // returns
  {"ret", {0xc3}, C::ret, 1, "ret"},
  {"rep_ret", {0xf3, 0xc3}, C::ret, 2, "ret"},
  {"bnd_ret", {0xf2, 0xc3}, C::ret, 2, "bnd ret"},
  {"ret_imm", {0xc2, 0x08, 0x00}, C::ret_imm, 3, "ret 8", N, 0, 0, 8},
  {"ret_imm_big", {0xc2, 0x34, 0x12}, C::ret_imm, 3, "ret 0x1234", N, 0, 0, 0x1234},
  // indirect
  {"jmp_rax", {0xff, 0xe0}, C::jmp_ind, 2, "jmp rax", 0},
  {"notrack_jmp_rax", {0x3e, 0xff, 0xe0}, C::jmp_ind, 3, "jmp rax", 0},
  {"bnd_jmp_rax", {0xf2, 0xff, 0xe0}, C::jmp_ind, 3, "bnd jmp rax", 0},
  {"notrack_jmp_mem_rip", {0x3e, 0xff, 0x25, 0x10, 0x00, 0x00, 0x00}, C::jmp_ind, 7,
   "jmp qword ptr ds:[rip + 0x10]", N, 0, 0, 0, RIP, N, 1, 0x10, true, 3, 0x10},
  {"notrack_call_r8", {0x3e, 0x41, 0xff, 0xd0}, C::call_ind, 4, "call r8", 8},
  {"call_r11", {0x41, 0xff, 0xd3}, C::call_ind, 3, "call r11", 11},
  {"call_rsp", {0xff, 0xd4}, C::call_ind, 2, "call rsp", 4},
  {"jmp_mem_rip", {0xff, 0x25, 0x00, 0x01, 0x00, 0x00}, C::jmp_ind, 6, "jmp qword ptr [rip + 0x100]",
   N, 0, 0, 0, RIP, N, 1, 0x100, true, 2, 0x100},
  {"call_mem_rip_neg", {0xff, 0x15, 0xf0, 0xff, 0xff, 0xff}, C::call_ind, 6,
   "call qword ptr [rip - 0x10]", N, 0, 0, 0, RIP, N, 1, -16, true, 2, -16},
  {"jmp_mem_index", {0xff, 0x24, 0xc5, 0xf0, 0xff, 0xff, 0xff}, C::jmp_ind, 7,
   "jmp qword ptr [rax*8 - 0x10]", N, 0, 0, 0, N, 0, 8, -16},
  {"call_mem_rsp", {0xff, 0x54, 0x24, 0x08}, C::call_ind, 4, "call qword ptr [rsp + 8]",
   N, 0, 0, 0, 4, N, 1, 8},
  {"call_mem_sib_r12", {0x42, 0xff, 0x14, 0xe3}, C::call_ind, 4, "call qword ptr [rbx + r12*8]",
   N, 0, 0, 0, 3, 12, 8, 0},
  {"jmp_mem_r12_disp", {0x41, 0xff, 0x64, 0x24, 0x10}, C::jmp_ind, 5,
   "jmp qword ptr [r12 + 0x10]", N, 0, 0, 0, 12, N, 1, 0x10},
  {"jmp_mem_abs", {0xff, 0x24, 0x25, 0x00, 0x10, 0x00, 0x00}, C::jmp_ind, 7,
   "jmp qword ptr [0x1000]", N, 0, 0, 0, N, N, 1, 0x1000},
  // out of line
  {"mov_rip", {0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00}, C::xol, 7,
   "mov rax, qword ptr [rip + 0x100]", N, 0, 0, 0, N, N, 1, 0, true, 3, 0x100},
  {"lea_rip", {0x48, 0x8d, 0x05, 0xf0, 0xff, 0xff, 0xff}, C::xol, 7, "lea rax, [rip - 0x10]",
   N, 0, 0, 0, N, N, 1, 0, true, 3, -16},
  {"mov_rip_imm", {0xc7, 0x05, 0xf0, 0xff, 0xff, 0xff, 0x78, 0x56, 0x34, 0x12}, C::xol, 10,
   "mov dword ptr [rip - 0x10], 0x12345678", N, 0, 0, 0, N, N, 1, 0, true, 2, -16},
  {"cmp_rip_imm8", {0x48, 0x83, 0x3d, 0x00, 0x01, 0x00, 0x00, 0x05}, C::xol, 8,
   "cmp qword ptr [rip + 0x100], 5", N, 0, 0, 0, N, N, 1, 0, true, 3, 0x100},
  {"push_mem_rip", {0xff, 0x35, 0x00, 0x01, 0x00, 0x00}, C::xol, 6, "push qword ptr [rip + 0x100]",
   N, 0, 0, 0, N, N, 1, 0, true, 2, 0x100},
  {"vex_rip", {0xc5, 0xfd, 0x6f, 0x05, 0x00, 0x01, 0x00, 0x00}, C::xol, 8,
   "vmovdqa ymm0, ymmword ptr [rip + 0x100]", N, 0, 0, 0, N, N, 1, 0, true, 4, 0x100},
  {"evex_rip", {0x62, 0xf1, 0x7c, 0x48, 0x28, 0x05, 0x00, 0x01, 0x00, 0x00}, C::xol, 10,
   "vmovaps zmm0, zmmword ptr [rip + 0x100]", N, 0, 0, 0, N, N, 1, 0, true, 6, 0x100},
  {"mov_rbp_rsp", {0x48, 0x89, 0xe5}, C::xol, 3, "mov rbp, rsp"},
  {"sub_rsp", {0x48, 0x83, 0xec, 0x08}, C::xol, 4, "sub rsp, 8"},
  {"pop_rbp", {0x5d}, C::xol, 1, "pop rbp"},
  {"syscall", {0x0f, 0x05}, C::xol, 2, "syscall"},
  {"int80", {0xcd, 0x80}, C::xol, 2, "int 0x80"},
  {"ud2", {0x0f, 0x0b}, C::xol, 2, "ud2"},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Analyze, Classify, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Expect>& i) {
                           return std::string(i.param.name);
                         });

struct Refusal {
  const char* name;
  Bytes bytes;
  const char* why;
};

void PrintTo(const Refusal& r, std::ostream* os) { *os << r.name; }

class Refuse : public ::testing::TestWithParam<Refusal> {};

TEST_P(Refuse, Reason) {
  const Refusal& r = GetParam();
  Insn insn;
  std::string why;
  EXPECT_FALSE(analyze(r.bytes.data(), r.bytes.size(), insn, why));
  EXPECT_EQ(why, r.why);
}

// clang-format off
const Refusal kRefusals[] = {
  {"int3", {0xcc, 0x90}, "an existing breakpoint (int3)"},
  {"int3_prefixed", {0x2e, 0xcc}, "an existing breakpoint (int3)"},
  {"int_3", {0xcd, 0x03}, "an existing breakpoint (int 3)"},
  {"int1", {0xf1}, "a debug trap (int1)"},
  {"undecodable_06", {0x06, 0x90, 0x90}, "undecodable bytes 06 90 90"},
  {"undecodable_long", {0x06, 1, 2, 3, 4, 5, 6, 7, 8, 9}, "undecodable bytes 06 01 02 03 04 05 06 07"},
  {"truncated_call", {0xe8, 0x00, 0x00}, "undecodable bytes e8 00 00"},
  {"empty", {}, "no instruction bytes"},
  {"fs_jmp_mem", {0x64, 0xff, 0x25, 0x00, 0x00, 0x00, 0x00},
   "segment-relative indirect branch (fs/gs override) (jmp qword ptr fs:[rip])"},
  {"gs_call_mem", {0x65, 0xff, 0x54, 0x24, 0x08},
   "segment-relative indirect branch (fs/gs override) (call qword ptr gs:[rsp + 8])"},
  {"fs_call_reg", {0x64, 0xff, 0xd0}, "segment-relative indirect branch (fs/gs override) (call rax)"},
  {"far_jmp_mem", {0xff, 0x28}, "far indirect branch (ljmp [rax])"},
  {"far_call_mem", {0xff, 0x18}, "far indirect branch (lcall [rax])"},
  {"far_ret", {0xcb}, "far ret (retf)"},
  {"far_ret_imm", {0xca, 0x08, 0x00}, "far ret (retf 8)"},
  {"iretq", {0x48, 0xcf}, "iret (iretq)"},
  {"xbegin", {0xc7, 0xf8, 0x00, 0x01, 0x00, 0x00}, "xbegin (branches relative to rip) (xbegin 0x106)"},
  {"eip_relative", {0x67, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00},
   "eip-relative operand (address-size override) cannot be relocated (mov eax, dword ptr [eip + 0x100])"},
  {"call16", {0x66, 0xe8, 0x00, 0x00}, "operand-size override on a relative branch (Intel and AMD differ) (call 4)"},
  {"ret16", {0x66, 0xc3}, "operand-size override on ret (ret)"},
  {"call_reg16", {0x66, 0xff, 0xd0}, "operand-size override on an indirect branch (call rax)"},
  {"call_mem_addr32", {0x67, 0xff, 0x54, 0x24, 0x08},
   "address-size override on an indirect branch (call qword ptr [esp + 8])"},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Analyze, Refuse, ::testing::ValuesIn(kRefusals),
                         [](const ::testing::TestParamInfo<Refusal>& i) {
                           return std::string(i.param.name);
                         });

TEST(Analyze, ShortAvailLimitsDecoding) {
  const std::uint8_t code[] = {0xe9, 0x00, 0x01, 0x00, 0x00};
  Insn insn;
  std::string why;
  EXPECT_FALSE(analyze(code, 4, insn, why));
  EXPECT_EQ(why, "undecodable bytes e9 00 01 00");
  ASSERT_TRUE(analyze(code, 5, insn, why));
  EXPECT_EQ(insn.cls, InsnClass::jmp_rel);
  EXPECT_EQ(why, "");
}

TEST(Analyze, ResetsOutputBetweenCalls) {
  const std::uint8_t push[] = {0x41, 0x55};
  const std::uint8_t nop[] = {0x90};
  Insn insn;
  std::string why;
  ASSERT_TRUE(analyze(push, sizeof push, insn, why));
  EXPECT_EQ(insn.reg, 13);
  ASSERT_TRUE(analyze(nop, sizeof nop, insn, why));
  EXPECT_EQ(insn.cls, InsnClass::nop);
  EXPECT_EQ(insn.reg, kNoReg);
  EXPECT_EQ(insn.len, 1);
  EXPECT_EQ(insn.bytes[1], 0);
}

// analyze() keeps accepted analyses by instruction bytes: a second call
// returns the same fields whatever follows the instruction, instructions
// sharing leading bytes stay apart, and a shorter `avail` is still refused.
TEST(Analyze, KeptAnalysesMatchTheirOwnBytesOnly) {
  // mov 0x12345678(%rip), %rax, then different trailing bytes each time.
  const Bytes a = {0x48, 0x8b, 0x05, 0x78, 0x56, 0x34, 0x12, 0x90, 0x90};
  const Bytes b = {0x48, 0x8b, 0x05, 0x78, 0x56, 0x34, 0x12, 0xcc, 0x0f, 0x05};
  Insn first, again;
  std::string why = "stale";
  ASSERT_TRUE(analyze(a.data(), a.size(), first, why)) << why;
  ASSERT_TRUE(analyze(b.data(), b.size(), again, why)) << why;
  EXPECT_EQ(why, "");
  EXPECT_EQ(again.len, 7u);
  EXPECT_EQ(again.text, first.text);
  EXPECT_TRUE(again.rip_relative);
  EXPECT_EQ(again.disp, 0x12345678);
  EXPECT_EQ(again.disp_offset, 3u);
  EXPECT_EQ(std::memcmp(again.bytes, a.data(), 7), 0);
  for (std::size_t i = 7; i < kMaxInsnLen; ++i) EXPECT_EQ(again.bytes[i], 0) << i;

  // nop5 (0f 1f 44 00 00) and nop4 (0f 1f 40 00) share their first two bytes.
  const Bytes nop5 = {0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3};
  const Bytes nop4 = {0x0f, 0x1f, 0x40, 0x00, 0xc3};
  Insn i5, i4;
  ASSERT_TRUE(analyze(nop5.data(), nop5.size(), i5, why)) << why;
  ASSERT_TRUE(analyze(nop4.data(), nop4.size(), i4, why)) << why;
  ASSERT_TRUE(analyze(nop5.data(), nop5.size(), i5, why)) << why;
  EXPECT_EQ(i5.len, 5u);
  EXPECT_EQ(i4.len, 4u);
  EXPECT_EQ(i5.cls, InsnClass::nop);
  EXPECT_EQ(i4.cls, InsnClass::nop);
  EXPECT_EQ(i5.bytes[2], 0x44);
  EXPECT_EQ(i4.bytes[2], 0x40);

  // call rel32 analyzed whole, then offered with only 3 of its 5 bytes.
  const Bytes call = {0xe8, 0x10, 0x00, 0x00, 0x00};
  Insn c;
  ASSERT_TRUE(analyze(call.data(), call.size(), c, why)) << why;
  EXPECT_EQ(c.len, 5u);
  EXPECT_FALSE(analyze(call.data(), 3, c, why));
  EXPECT_NE(why, "");
}

}  // namespace
}  // namespace uprobe::arch
