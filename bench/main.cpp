// SPDX-License-Identifier: MIT
// uprobe-bench: libuprobe's counterpart of the kernel's selftests bench
// (tools/testing/selftests/bpf/bench.c, benchs/bench_trigger.c,
// benchs/run_bench_uprobes.sh), with the scalability lab on top: producer
// sweeps, the ablation switches, before/after comparisons, the kernel's own
// uprobes as reference rows, csv/json output.

#include <cstdio>
#include <exception>

#include "bench.hpp"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Options o;
  if (!bench::parse_options(argc, argv, o)) return 2;
  // csv/json on stdout: the human-readable text goes to stderr.
  if (o.format != bench::Format::text && o.output.empty() && o.result_fd < 0) bench::set_text_out(stderr);
  try {
    if (o.list) {
      std::printf("Available benchmarks:\n");
      for (const bench::Variant& v : bench::variants()) std::printf("- %s\n", v.name);
      return 0;
    }
    if (o.attach_libc > 0) return bench::run_attach(o);
    if (o.cycles) return bench::run_cycles(o);
    if (o.result_fd >= 0) return bench::run_child(o);
    if (o.lab()) return bench::run_lab(o);
    return bench::run_single(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uprobe-bench: %s\n", e.what());
    return 1;
  }
}
