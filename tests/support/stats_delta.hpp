// SPDX-License-Identifier: MIT
#pragma once
// uprobe::Stats arithmetic for tests: what changed between two snapshots,
// and a one-line rendering for assertion messages. GoogleTest-free.

#include <string>

#include "uprobe/config.hpp"

namespace testsupport {

/// b - a, field by field (every counter of uprobe::Stats).
uprobe::Stats stats_delta(const uprobe::Stats& a, const uprobe::Stats& b);

/// "{hits N, optimized N, ...}": every counter, for failure messages.
std::string stats_str(const uprobe::Stats& s);

}  // namespace testsupport
