// SPDX-License-Identifier: MIT
#pragma once
// Helpers of the return-instance pool tests.
//
// Ownership word: the pool writes only the first word of a free object (the
// stack link), so a test may keep an owner tag in the second word across the
// object's stays in the pool. A get() claims it with an atomic exchange that
// must return 0, a put() releases it with one that must return the tag: an
// object handed to two owners at once is caught deterministically.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ri_pool.hpp"

namespace pooltest {

using uprobe::detail::RiLockMode;
using uprobe::detail::RiPool;
using uprobe::detail::RiPoolMode;

inline std::uint64_t* words(void* obj) { return static_cast<std::uint64_t*>(obj); }

/// Claims obj for `tag`; returns the previous owner (0 = was free). Async-signal-safe.
inline std::uint64_t claim(void* obj, std::uint64_t tag) {
  return __atomic_exchange_n(&words(obj)[1], tag, __ATOMIC_RELAXED);
}
/// Releases obj; returns the owner it had (must be the caller's tag). Async-signal-safe.
inline std::uint64_t release(void* obj) { return __atomic_exchange_n(&words(obj)[1], 0, __ATOMIC_RELAXED); }

/// Takes every object the pool can hand out without growing (growth is
/// disabled meanwhile). Single-threaded use.
inline std::vector<void*> drain(RiPool& pool) {
  const std::size_t saved = pool.max_capacity();
  pool.set_max_capacity(0);
  std::vector<void*> out;
  while (void* obj = pool.get()) out.push_back(obj);
  pool.set_max_capacity(saved);
  return out;
}

/// "" if all objects are distinct objects of the pool, 64-byte aligned, with a
/// clear ownership word; else what is wrong.
std::string check_objects(const RiPool& pool, std::vector<void*> objs, bool owners_clear = true);

/// drain(), check, put everything back; returns the count (or ~0 on a bad set, with *why set).
std::size_t drain_check_refill(RiPool& pool, std::string* why);

inline const char* mode_name(RiPoolMode m) { return m == RiPoolMode::objpool ? "objpool" : "freelist"; }

/// xorshift64*: cheap, async-signal-safe randomness for the stress loops.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
};

}  // namespace pooltest
