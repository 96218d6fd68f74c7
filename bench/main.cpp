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
  // The csv/json files, opened before anything is measured: a name that
  // cannot be written is refused at once, in every mode.
  if (!o.list && !o.attach_child && o.result_fd < 0)
    for (const std::string& path : bench::data_paths(o))
      if (!bench::prepare_data(path)) return bench::write_error_status;
  int status = 1;
  try {
    if (o.list) {
      std::printf("Available benchmarks:\n");
      for (const bench::Variant& v : bench::variants()) std::printf("- %s\n", v.name);
      status = 0;
    } else if (o.attach_libc > 0) {
      status = bench::run_attach(o);
    } else if (o.cycles) {
      status = bench::run_cycles(o);
    } else if (o.result_fd >= 0) {
      status = bench::run_child(o);
    } else if (o.lab()) {
      status = bench::run_lab(o);
    } else {
      status = bench::run_single(o);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uprobe-bench: %s\n", e.what());
    status = 1;
  }
  // Whatever went to stdout (the text, --list, csv/json) must have got there.
  // (Not in a lab child: its stdout is only the parent's text, which the
  // parent checks; its results went through --result-fd.)
  if (o.result_fd < 0 && !bench::close_data(stdout, "")) return bench::write_error_status;
  return status;
}
