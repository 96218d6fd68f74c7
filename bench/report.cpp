// SPDX-License-Identifier: MIT
// The kernel bench's hits_drops_report_progress() / hits_drops_report_final()
// output (tools/testing/selftests/bpf/bench.c), plus a median line, and the
// scaling line of benchs/run_bench_uprobes.sh. There are no drops here: they
// print as 0.

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench.hpp"

namespace bench {

Result summarize(const std::vector<double>& rates) {
  Result r;
  const std::size_t n = rates.size();
  if (n == 0) return r;
  for (double x : rates) r.mean += x / 1e6 / static_cast<double>(n);
  if (n > 1) {
    double var = 0.0;
    for (double x : rates) var += (r.mean - x / 1e6) * (r.mean - x / 1e6) / (static_cast<double>(n) - 1.0);
    r.stddev = std::sqrt(var);
  }
  std::vector<double> sorted(rates);
  std::sort(sorted.begin(), sorted.end());
  r.median = (n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0) / 1e6;
  return r;
}

void report_progress(int iter, double hits_per_sec, long delta_ns, int producers) {
  FILE* out = text_out();
  const double hits = hits_per_sec / 1e6, drops = 0.0;
  std::fprintf(out, "Iter %3d (%7.3lfus): ", iter, static_cast<double>(delta_ns - 1000000000L) / 1000.0);
  std::fprintf(out, "hits %8.3lfM/s (%7.3lfM/prod), drops %8.3lfM/s, total operations %8.3lfM/s\n", hits,
               hits / producers, drops, hits + drops);
}

void report_final(const Result& r, int producers) {
  FILE* out = text_out();
  const double drops_mean = 0.0, drops_stddev = 0.0;
  std::fprintf(out, "Summary: hits %8.3lf \u00B1 %5.3lfM/s (%7.3lfM/prod), ", r.mean, r.stddev, r.mean / producers);
  std::fprintf(out, "drops %8.3lf \u00B1 %5.3lfM/s, ", drops_mean, drops_stddev);
  std::fprintf(out, "total operations %8.3lf \u00B1 %5.3lfM/s\n", r.mean + drops_mean, r.stddev);
  std::fprintf(out, "Median: hits %8.3lfM/s\n", r.median);
}

std::string scaling_line(const std::string& variant, int producers, const Result& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-21s (%2d cpus): %8.3f \u00B1 %5.3fM/s  (%7.3fM/s/cpu)", variant.c_str(), producers,
                r.mean, r.stddev, r.mean / producers);
  return buf;
}

}  // namespace bench
