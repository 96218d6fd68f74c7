// SPDX-License-Identifier: MIT
#include "stats_delta.hpp"

#include <atomic>

#include <sstream>

namespace testsupport {

uprobe::Stats stats_delta(const uprobe::Stats& a, const uprobe::Stats& b) { return b - a; }

std::string stats_str(const uprobe::Stats& s) {
  std::ostringstream os;
  os << "{hits " << s.hits << ", optimized " << s.optimized << ", emulated " << s.emulated << ", out_of_line "
     << s.out_of_line << ", redirected " << s.redirected << ", restarts " << s.restarts << ", locked_lookups "
     << s.locked_lookups << ", foreign_traps " << s.foreign_traps << ", recursion_misses " << s.recursion_misses
     << ", return_hits " << s.return_hits << ", return_misses " << s.return_misses << ", return_dropped "
     << s.return_dropped << "}";
  return os.str();
}

namespace {
std::atomic<std::uint64_t> g_miss_calls{0};
std::atomic<const uprobe::Uprobe*> g_miss_probe{nullptr};
void count_miss(const uprobe::Uprobe* probe) noexcept {
  g_miss_calls.fetch_add(1, std::memory_order_relaxed);
  g_miss_probe.store(probe, std::memory_order_relaxed);
}
}  // namespace

RecursionMissCount::RecursionMissCount() {
  g_miss_calls.store(0);
  g_miss_probe.store(nullptr);
  uprobe::set_recursion_miss_hook(count_miss);
}
RecursionMissCount::~RecursionMissCount() { uprobe::set_recursion_miss_hook(nullptr); }
std::uint64_t RecursionMissCount::calls() const { return g_miss_calls.load(); }
const uprobe::Uprobe* RecursionMissCount::last_probe() const { return g_miss_probe.load(); }

}  // namespace testsupport
