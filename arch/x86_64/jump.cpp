// SPDX-License-Identifier: MIT
/// @file jump.cpp
/// The `jmp rel32` a probe site holds once optimized, plain or padded with
/// redundant prefixes (E9Patch's tactic T1): encode_jump(), jump_len(),
/// decode_jump(). Apart from the stubs (opt_stub.cpp), which name the core's
/// entry points, so that the arch tests link without the core.

#include <cstring>

#include "arch.hpp"

namespace uprobe::arch {

void encode_jump(std::uint64_t from, std::uint64_t to, std::uint8_t* out, std::size_t pad) noexcept {
  for (std::size_t i = 0; i < pad; ++i) out[i] = kJumpPadPrefix[i];
  auto rel = static_cast<std::int32_t>(static_cast<std::int64_t>(to - (from + pad + kJumpLen)));
  out[pad] = kJumpOpcode;
  std::memcpy(out + pad + 1, &rel, 4);
}

std::size_t jump_len(const std::uint8_t* code, std::size_t n) noexcept {
  auto is_pad = [](std::uint8_t b) {
    for (std::uint8_t p : kJumpPadPrefix)
      if (b == p) return true;
    return false;
  };
  std::size_t pad = 0;
  while (pad < n && pad < kMaxJumpPad && is_pad(code[pad])) ++pad;
  return pad < n && code[pad] == kJumpOpcode ? pad + kJumpLen : 0;
}

std::uint64_t decode_jump(std::uint64_t from, const std::uint8_t* code, std::size_t n) noexcept {
  const std::size_t len = jump_len(code, n);
  if (len == 0 || len > n) return 0;
  std::int32_t rel;
  std::memcpy(&rel, code + len - 4, 4);
  return from + len + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel));
}

}  // namespace uprobe::arch
