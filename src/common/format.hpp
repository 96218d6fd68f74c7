// SPDX-License-Identifier: MIT
#pragma once
// Small formatting helpers for error messages.

#include <cstdint>
#include <cstdio>
#include <string>

namespace uprobe::detail {

/// "0x" + lowercase hex, as error messages print addresses and offsets.
inline std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace uprobe::detail
