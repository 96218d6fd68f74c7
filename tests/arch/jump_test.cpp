// SPDX-License-Identifier: MIT
/// @file jump_test.cpp
/// The site's jump and its padded forms (E9Patch's tactic T1): encode_jump()
/// and decode_jump() bytes and targets, jump_len(), that this CPU runs each
/// padded form exactly as the plain jump (a page written RW, sealed R-X,
/// called as a function), plan_punned()'s max_pad and punned_jump_range()'s
/// range for each pad.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "arch.hpp"
#include "decode.hpp"
#include "fixtures.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;

std::string hex_bytes(const std::uint8_t* b, std::size_t n) {
  std::string s;
  char buf[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", b[i]);
    if (i) s += ' ';
    s += buf;
  }
  return s;
}

TEST(Jump, EncodeEachPadExactBytes) {
  std::uint8_t out[kMaxJumpLen];
  // rel32 counted from the end of the padded jump: 0x1000 - (0x100 + pad + 5).
  encode_jump(0x100, 0x1000, out, 0);
  EXPECT_EQ(hex_bytes(out, 5), "e9 fb 0e 00 00");
  encode_jump(0x100, 0x1000, out, 1);
  EXPECT_EQ(hex_bytes(out, 6), "26 e9 fa 0e 00 00");
  encode_jump(0x100, 0x1000, out, 2);
  EXPECT_EQ(hex_bytes(out, 7), "26 36 e9 f9 0e 00 00");
  encode_jump(0x100, 0x1000, out, 3);
  EXPECT_EQ(hex_bytes(out, 8), "26 36 3e e9 f8 0e 00 00");
  encode_jump(0x1000, 0x100, out, 3);  // backwards: 0x100 - 0x1008
  EXPECT_EQ(hex_bytes(out, 8), "26 36 3e e9 f8 f0 ff ff");
}

TEST(Jump, DecodeAndLengthOfEachPad) {
  for (std::size_t pad = 0; pad <= kMaxJumpPad; ++pad) {
    std::uint8_t out[kMaxJumpLen];
    encode_jump(0x7f0000001000, 0x7f0000345678, out, pad);
    EXPECT_EQ(jump_len(out, kJumpLen), pad + kJumpLen) << pad;  // known from the first pad + 1 bytes
    EXPECT_EQ(jump_len(out, pad + kJumpLen), pad + kJumpLen) << pad;
    EXPECT_EQ(decode_jump(0x7f0000001000, out, pad + kJumpLen), 0x7f0000345678u) << pad;
    if (pad > 0) {
      EXPECT_EQ(decode_jump(0x7f0000001000, out, pad + kJumpLen - 1), 0u) << "too few bytes, pad " << pad;
    }
  }
  // The prefixes in any order; not other bytes, not more than kMaxJumpPad.
  const std::uint8_t other_order[] = {0x3e, 0x26, 0xe9, 0x10, 0x00, 0x00, 0x00};
  EXPECT_EQ(jump_len(other_order, sizeof other_order), 7u);
  EXPECT_EQ(decode_jump(0x1000, other_order, sizeof other_order), 0x1017u);
  const std::uint8_t opsize[] = {0x66, 0xe9, 0x10, 0x00, 0x00, 0x00};  // rel16 on AMD: not ours
  EXPECT_EQ(jump_len(opsize, sizeof opsize), 0u);
  const std::uint8_t four[] = {0x26, 0x26, 0x26, 0x26, 0xe9, 0, 0, 0, 0};
  EXPECT_EQ(jump_len(four, sizeof four), 0u);
  const std::uint8_t call[] = {0x26, 0xe8, 0, 0, 0, 0};
  EXPECT_EQ(jump_len(call, sizeof call), 0u);
  EXPECT_EQ(decode_jump(0x1000, call, sizeof call), 0u);
}

/// Each padded form, forwards and backwards, run on this CPU: the jump
/// lands on `mov $2, %eax; ret`; falling through (prefixes ignored wrongly,
/// or a shorter rel) would run `mov $1, %eax; ret` right after it.
TEST(Jump, ThisCpuRunsEachPaddedFormAsThePlainJump) {
  for (std::size_t pad = 0; pad <= kMaxJumpPad; ++pad) {
    for (const bool backwards : {false, true}) {
      SCOPED_TRACE("pad " + std::to_string(pad) + (backwards ? " backwards" : " forwards"));
      test::CodePage page;
      ASSERT_TRUE(page.ok());
      const std::size_t at = backwards ? 0xe00 : 0x100, target = backwards ? 0x200 : 0xd00;
      std::uint8_t jmp[kMaxJumpLen];
      encode_jump(page.addr() + at, page.addr() + target, jmp, pad);
      page.write(at, jmp, pad + kJumpLen);
      page.write(at + pad + kJumpLen, Bytes{0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3});  // mov $1, %eax; ret
      page.write(target, Bytes{0xb8, 0x02, 0x00, 0x00, 0x00, 0xc3});               // mov $2, %eax; ret
      // A rel32 read from one byte too early or too late lands on int3 filler.
      ASSERT_TRUE(page.seal());
      EXPECT_EQ(uprobe_test_call(reinterpret_cast<const void*>(page.addr() + at), 0), 2u);
    }
  }
}

TEST(Jump, PlanPunnedPadsAsTheInstructionAndTheBytesAllow) {
  std::string why;
  EntryWindow w;
  // 1 byte (ret): no room for a prefix and the opcode.
  const std::uint8_t ret[] = {0xc3, 0x48, 0x2d, 0x10, 0x20, 0x30, 0x40, 0x50};
  ASSERT_TRUE(plan_punned(ret, sizeof ret, test::decode({0xc3}), w, why)) << why;
  EXPECT_EQ(w.max_pad, 0u);
  EXPECT_EQ(w.min_pad, 0u);
  // 3 bytes (add %rsi, %rax), 8 bytes known: up to 2 prefixes.
  const std::uint8_t add[] = {0x48, 0x01, 0xf0, 0x48, 0x2d, 0x10, 0x20, 0x30};
  ASSERT_TRUE(plan_punned(add, sizeof add, test::decode({0x48, 0x01, 0xf0}), w, why)) << why;
  EXPECT_EQ(w.len, 3u);
  EXPECT_EQ(w.max_pad, 2u);
  EXPECT_EQ(hex_bytes(w.bytes, 7), "48 01 f0 48 2d 10 20");
  // Only 6 bytes known: 1 prefix.
  ASSERT_TRUE(plan_punned(add, 6, test::decode({0x48, 0x01, 0xf0}), w, why)) << why;
  EXPECT_EQ(w.max_pad, 1u);
  // 4 bytes, 8 known: 3 prefixes.
  const std::uint8_t lea[] = {0x48, 0x8d, 0x04, 0x37, 0x90, 0x90, 0x90, 0x90};  // lea (%rdi,%rsi), %rax
  ASSERT_TRUE(plan_punned(lea, sizeof lea, test::decode({0x48, 0x8d, 0x04, 0x37}), w, why)) << why;
  EXPECT_EQ(w.max_pad, 3u);
  EXPECT_EQ(jump_extent(w), 8u);
}

TEST(Jump, PunnedRangeOfEachPad) {
  std::string why;
  EntryWindow w;
  const std::uint8_t add[] = {0x48, 0x01, 0xf0, 0x48, 0x2d, 0x10, 0x20, 0x30};
  ASSERT_TRUE(plan_punned(add, sizeof add, test::decode({0x48, 0x01, 0xf0}), w, why)) << why;
  const std::uint64_t site = 0x10000000;
  std::uint64_t lo = 0, hi = 0;
  // pad 0 (B2): rel32 = [free, free, 48, 2d] from site + 5: 64 KiB.
  ASSERT_TRUE(punned_jump_range(site, w, lo, hi, 0));
  EXPECT_EQ(lo, 0x3d480005u);
  EXPECT_EQ(hi, 0x3d490005u);
  // pad 1: rel32 = [free, 48, 2d, 10] from site + 6: 256 bytes.
  ASSERT_TRUE(punned_jump_range(site, w, lo, hi, 1));
  EXPECT_EQ(lo, 0x202d4806u);
  EXPECT_EQ(hi, 0x202d4906u);
  // pad 2: rel32 = [48, 2d, 10, 20] from site + 7: one address.
  ASSERT_TRUE(punned_jump_range(site, w, lo, hi, 2));
  EXPECT_EQ(lo, 0x30102d4fu);
  EXPECT_EQ(hi, 0x30102d50u);
  // Not planned: the opcode would leave the instruction.
  EXPECT_FALSE(punned_jump_range(site, w, lo, hi, 3));
  // B2's range below user space, the padded form's inside it: rel32 =
  // [free, 00, 00, f0] = -0x10000000 + x from 0x1000005 (refused), then
  // [00, 00, f0, 05] = 0x05f00000 from 0x1000006.
  const std::uint8_t low[] = {0x31, 0xc0, 0x00, 0x00, 0xf0, 0x05, 0x90, 0x90};
  ASSERT_TRUE(plan_punned(low, sizeof low, test::decode({0x31, 0xc0}), w, why)) << why;
  EXPECT_EQ(w.max_pad, 1u);
  EXPECT_FALSE(punned_jump_range(0x1000000, w, lo, hi, 0));
  ASSERT_TRUE(punned_jump_range(0x1000000, w, lo, hi, 1));
  EXPECT_EQ(lo, 0x6f00006u);
  EXPECT_EQ(hi, 0x6f00007u);
}

}  // namespace
}  // namespace uprobe::arch
