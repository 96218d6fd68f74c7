// SPDX-License-Identifier: MIT
#pragma once
// Byte copies and comparisons that never call libc: the attach path runs
// them after it has written breakpoints, when libc's memcpy() or memcmp()
// may carry one of them (an int3 probe on memcpy traps on every call: a
// batch of thousands of sites made tens of thousands of traps of its own).

#include <cstddef>
#include <cstdint>

#include "arch.hpp"

namespace uprobe::detail {

/// memcpy(to, from, n) without calling libc (arch::opaque() keeps the
/// compiler from turning the loop back into a memcpy() call). For a few
/// bytes up to a page. Async-signal-safe.
inline void copy_bytes(std::uint8_t* to, const std::uint8_t* from, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t b = from[i];
    arch::opaque(b);
    to[i] = b;
  }
}

/// memcmp(a, b, n) == 0 without calling libc. Async-signal-safe.
inline bool same_bytes(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace uprobe::detail
