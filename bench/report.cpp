// SPDX-License-Identifier: MIT
// The kernel bench's hits_drops_report_progress() / hits_drops_report_final()
// output (tools/testing/selftests/bpf/bench.c), plus a median line. There are
// no drops here: they print as 0.

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench.hpp"

namespace bench {

void report_progress(int iter, double hits_per_sec, long delta_ns, int producers) {
  const double hits = hits_per_sec / 1e6, drops = 0.0;
  std::printf("Iter %3d (%7.3lfus): ", iter, (delta_ns - 1000000000L) / 1000.0);
  std::printf("hits %8.3lfM/s (%7.3lfM/prod), drops %8.3lfM/s, total operations %8.3lfM/s\n", hits,
              hits / producers, drops, hits + drops);
}

Result report_final(const std::vector<double>& rates, int producers) {
  Result r;
  const std::size_t n = rates.size();
  for (double x : rates) r.mean += x / 1e6 / static_cast<double>(n);
  if (n > 1) {
    double var = 0.0;
    for (double x : rates) var += (r.mean - x / 1e6) * (r.mean - x / 1e6) / (n - 1.0);
    r.stddev = std::sqrt(var);
  }
  if (n > 0) {
    std::vector<double> sorted(rates);
    std::sort(sorted.begin(), sorted.end());
    r.median = (n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0) / 1e6;
  }
  const double drops_mean = 0.0, drops_stddev = 0.0;
  std::printf("Summary: hits %8.3lf \u00B1 %5.3lfM/s (%7.3lfM/prod), ", r.mean, r.stddev, r.mean / producers);
  std::printf("drops %8.3lf \u00B1 %5.3lfM/s, ", drops_mean, drops_stddev);
  std::printf("total operations %8.3lf \u00B1 %5.3lfM/s\n", r.mean + drops_mean, r.stddev);
  std::printf("Median: hits %8.3lfM/s\n", r.median);
  return r;
}

}  // namespace bench
