// SPDX-License-Identifier: MIT
/// @file disasm_test.cpp
/// instruction_starts() and disassemble(): linear sweep over a known function
/// body (tests/arch/fixtures.cpp) and over hand-made byte strings.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "arch.hpp"
#include "fixtures.hpp"

namespace uprobe::arch {
namespace {

using Starts = std::vector<std::size_t>;

TEST(InstructionStarts, KnownFunctionBody) {
  ASSERT_EQ(uprobe_test_body(), 42);  // it is real code
  const auto* code = reinterpret_cast<const std::uint8_t*>(&uprobe_test_body);
  const std::size_t size = static_cast<std::size_t>(uprobe_test_body_end - code);
  ASSERT_EQ(size, 20u);
  EXPECT_EQ(instruction_starts(code, size), (Starts{0, 4, 5, 8, 13, 18, 19}));
  // A probe at a mid-instruction offset is not in the list.
  const Starts s = instruction_starts(code, size);
  for (std::size_t bad : {1u, 6u, 9u, 14u}) EXPECT_EQ(std::count(s.begin(), s.end(), bad), 0);
}

TEST(InstructionStarts, StopsAtUndecodableByte) {
  const std::uint8_t code[] = {0x90, 0x48, 0x89, 0xe5, 0x06, 0x90, 0x90};
  EXPECT_EQ(instruction_starts(code, sizeof code), (Starts{0, 1}));
}

TEST(InstructionStarts, StopsAtTruncatedInstruction) {
  const std::uint8_t code[] = {0x55, 0xe8, 0x00, 0x00};
  EXPECT_EQ(instruction_starts(code, sizeof code), (Starts{0}));
}

TEST(InstructionStarts, Empty) {
  const std::uint8_t code[] = {0x90};
  EXPECT_EQ(instruction_starts(code, 0), Starts{});
  EXPECT_EQ(instruction_starts(nullptr, 10), Starts{});
}

TEST(Disassemble, TextAndLength) {
  const std::uint8_t mov[] = {0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x90};
  std::size_t len = 99;
  EXPECT_EQ(disassemble(mov, sizeof mov, 0x1000, len), "mov rax, qword ptr [rip + 0x100]");
  EXPECT_EQ(len, 7u);
  const std::uint8_t jmp[] = {0xe9, 0x00, 0x01, 0x00, 0x00};
  EXPECT_EQ(disassemble(jmp, sizeof jmp, 0x401000, len), "jmp 0x401105");
  EXPECT_EQ(len, 5u);
  const std::uint8_t ret[] = {0xc3};
  EXPECT_EQ(disassemble(ret, sizeof ret, 0, len), "ret");
  EXPECT_EQ(len, 1u);
  const std::uint8_t endbr[] = {0xf3, 0x0f, 0x1e, 0xfa};
  EXPECT_EQ(disassemble(endbr, sizeof endbr, 0, len), "endbr64");
  EXPECT_EQ(len, 4u);
}

TEST(Disassemble, Undecodable) {
  const std::uint8_t bad[] = {0x06};
  std::size_t len = 99;
  EXPECT_EQ(disassemble(bad, sizeof bad, 0x1000, len), "(bad)");
  EXPECT_EQ(len, 0u);
  const std::uint8_t cut[] = {0xe9, 0x00, 0x01};
  EXPECT_EQ(disassemble(cut, sizeof cut, 0x1000, len), "(bad)");
  EXPECT_EQ(len, 0u);
}

}  // namespace
}  // namespace uprobe::arch
