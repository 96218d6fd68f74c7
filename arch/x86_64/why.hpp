// SPDX-License-Identifier: MIT
/// @file why.hpp
/// What the planners' refusals are written with (window.cpp,
/// evict_solve.cpp): an address in hex, and a refusal that sets `why`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace uprobe::arch::why {

/// `v` as "0x..." (lower case).
inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Sets `out` to `reason`; returns false (a planner's "no").
inline bool refuse(std::string& out, std::string reason) {
  out = std::move(reason);
  return false;
}

}  // namespace uprobe::arch::why
