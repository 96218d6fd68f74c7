// SPDX-License-Identifier: MIT
#pragma once
// uprobe::Stats arithmetic for tests: what changed between two snapshots,
// and a one-line rendering for assertion messages. GoogleTest-free.

#include <cstdint>
#include <string>

#include "uprobe/config.hpp"

namespace testsupport {

/// b - a, field by field (every counter of uprobe::Stats).
uprobe::Stats stats_delta(const uprobe::Stats& a, const uprobe::Stats& b);

/// "{hits N, optimized N, ...}": every counter, for failure messages.
std::string stats_str(const uprobe::Stats& s);

/// While it lives, uprobe's RecursionMissHook is set to one that counts its
/// calls and keeps the last probe it was given (one at a time: the hook is
/// process-wide; unset again at the end).
class RecursionMissCount {
 public:
  RecursionMissCount();
  ~RecursionMissCount();
  RecursionMissCount(const RecursionMissCount&) = delete;
  RecursionMissCount& operator=(const RecursionMissCount&) = delete;
  std::uint64_t calls() const;
  const uprobe::Uprobe* last_probe() const;
};

}  // namespace testsupport
