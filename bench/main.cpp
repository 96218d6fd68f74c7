// SPDX-License-Identifier: MIT
// uprobe-bench: libuprobe's counterpart of the kernel's selftests bench
// (tools/testing/selftests/bpf/bench.c, benchs/bench_trigger.c,
// benchs/run_bench_uprobes.sh).

#include <cstdio>
#include <exception>

#include "bench.hpp"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Options o;
  if (!bench::parse_options(argc, argv, o)) return 2;
  try {
    if (o.list) {
      std::printf("Available benchmarks:\n");
      for (const bench::Variant& v : bench::variants()) std::printf("- %s\n", v.name);
      return 0;
    }
    if (o.sweep) return bench::run_sweep(o);
    return bench::run_benchmark(o, *bench::find_variant(o.variant));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uprobe-bench: %s\n", e.what());
    return 1;
  }
}
