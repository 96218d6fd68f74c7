// SPDX-License-Identifier: MIT
#pragma once
/// @file decode.hpp
/// The arch tests' decoder helper: arch::analyze() of a byte string that must
/// be accepted.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arch.hpp"

namespace uprobe::test {

/// analyze() of `b`; a test failure with analyze()'s reason when it refuses.
inline arch::Insn decode(const std::vector<std::uint8_t>& b) {
  arch::Insn insn;
  std::string why;
  EXPECT_TRUE(arch::analyze(b.data(), b.size(), insn, why)) << why;
  return insn;
}

}  // namespace uprobe::test
