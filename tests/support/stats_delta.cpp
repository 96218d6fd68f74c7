// SPDX-License-Identifier: MIT
#include "stats_delta.hpp"

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

}  // namespace testsupport
