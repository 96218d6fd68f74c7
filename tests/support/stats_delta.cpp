// SPDX-License-Identifier: MIT
#include "stats_delta.hpp"

#include <sstream>

namespace testsupport {

uprobe::Stats stats_delta(const uprobe::Stats& a, const uprobe::Stats& b) {
  uprobe::Stats d;
  d.hits = b.hits - a.hits;
  d.recursion_misses = b.recursion_misses - a.recursion_misses;
  d.emulated = b.emulated - a.emulated;
  d.out_of_line = b.out_of_line - a.out_of_line;
  d.redirected = b.redirected - a.redirected;
  d.restarts = b.restarts - a.restarts;
  d.locked_lookups = b.locked_lookups - a.locked_lookups;
  d.foreign_traps = b.foreign_traps - a.foreign_traps;
  d.return_hits = b.return_hits - a.return_hits;
  d.return_misses = b.return_misses - a.return_misses;
  d.return_dropped = b.return_dropped - a.return_dropped;
  d.optimized = b.optimized - a.optimized;
  return d;
}

std::string stats_str(const uprobe::Stats& s) {
  std::ostringstream os;
  os << "{hits " << s.hits << ", optimized " << s.optimized << ", emulated " << s.emulated << ", out_of_line "
     << s.out_of_line << ", redirected " << s.redirected << ", restarts " << s.restarts << ", locked_lookups "
     << s.locked_lookups << ", foreign_traps " << s.foreign_traps << ", recursion_misses " << s.recursion_misses
     << ", return_hits " << s.return_hits << ", return_misses " << s.return_misses << ", return_dropped "
     << s.return_dropped << "}";
  return os.str();
}

}  // namespace testsupport
