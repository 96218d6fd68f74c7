// SPDX-License-Identifier: MIT
#pragma once
/// @file micro.hpp
/// Shared helpers of the uprobe-micro benchmarks.

#include <cstddef>
#include <cstdint>

extern "C" {
/// fixtures.S: kMicroFixtures small functions (nop; ret), each in its own
/// 16-byte slot, distinct probe sites for the attach/detach benchmarks.
extern void (*const micro_fixtures[])();
extern const std::uint32_t micro_fixture_count;
}

namespace micro {

inline constexpr std::size_t kMicroFixtures = 1000;

inline const void* fixture(std::size_t i) noexcept { return reinterpret_cast<const void*>(micro_fixtures[i]); }

/// A small deterministic PRNG (xorshift64*), for lookup keys.
struct Rng {
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  std::uint64_t next() noexcept {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

}  // namespace micro
