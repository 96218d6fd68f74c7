// SPDX-License-Identifier: MIT
// Command line of uprobe-bench.

#include <getopt.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench.hpp"

namespace bench {
namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: uprobe-bench [-p N] [-a] [-w SECS] [-d SECS] [--config K=V,...] VARIANT\n"
               "       uprobe-bench --sweep [--sweep-variants a,b] [--sweep-producers 1,2] [-a] [-w SECS] [-d SECS]\n"
               "       uprobe-bench --list\n"
               "  -p N          producer threads (default 1)\n"
               "  -a            pin producer i to CPU i %% nproc\n"
               "  -w SECS       warm-up seconds, samples dropped (default 1)\n"
               "  -d SECS       measured seconds (default 5; sweep: 5 per point)\n"
               "  --config      lookup=locked|speculative,xol=jump_back|single_step,signal=defer|nodefer,emulate=on|off\n"
               "                (uprobe-* variants only)\n"
               "  --sweep       every variant for 1..nproc producers, each in a fresh child process\n");
}

bool parse_int(const char* text, int min, int max, int& out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (!*text || *end || v < min || v > max) return false;
  out = static_cast<int>(v);
  return true;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    if (end > pos) parts.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return parts;
}

bool fail(const std::string& why) {
  std::fprintf(stderr, "uprobe-bench: %s\n", why.c_str());
  usage(stderr);
  return false;
}

}  // namespace

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

bool parse_options(int argc, char** argv, Options& o) {
  enum { opt_list = 256, opt_sweep, opt_sweep_variants, opt_sweep_producers, opt_config, opt_result_fd };
  static const option longopts[] = {
      {"producers", required_argument, nullptr, 'p'},
      {"affinity", no_argument, nullptr, 'a'},
      {"warmup", required_argument, nullptr, 'w'},
      {"duration", required_argument, nullptr, 'd'},
      {"help", no_argument, nullptr, 'h'},
      {"list", no_argument, nullptr, opt_list},
      {"sweep", no_argument, nullptr, opt_sweep},
      {"sweep-variants", required_argument, nullptr, opt_sweep_variants},
      {"sweep-producers", required_argument, nullptr, opt_sweep_producers},
      {"config", required_argument, nullptr, opt_config},
      {"result-fd", required_argument, nullptr, opt_result_fd},  // internal: sweep child
      {nullptr, 0, nullptr, 0},
  };
  int c;
  while ((c = getopt_long(argc, argv, "p:aw:d:h", longopts, nullptr)) != -1) {
    switch (c) {
      case 'p':
        if (!parse_int(optarg, 1, max_producers, o.producers)) return fail("bad -p (1..256)");
        break;
      case 'a':
        o.affinity = true;
        break;
      case 'w':
        if (!parse_int(optarg, 0, 3600, o.warmup)) return fail("bad -w (0..3600)");
        o.warmup_given = true;
        break;
      case 'd':
        if (!parse_int(optarg, 1, 3600, o.duration)) return fail("bad -d (1..3600)");
        o.duration_given = true;
        break;
      case 'h':
        usage(stdout);
        std::exit(0);
      case opt_list:
        o.list = true;
        break;
      case opt_sweep:
        o.sweep = true;
        break;
      case opt_sweep_variants:
        o.sweep = true;
        o.sweep_variants = split(optarg);
        for (const std::string& v : o.sweep_variants)
          if (!find_variant(v)) return fail("unknown variant '" + v + "' (see --list)");
        break;
      case opt_sweep_producers:
        o.sweep = true;
        o.sweep_producers.clear();
        for (const std::string& p : split(optarg)) {
          int n;
          if (!parse_int(p.c_str(), 1, max_producers, n)) return fail("bad --sweep-producers item '" + p + "'");
          o.sweep_producers.push_back(n);
        }
        break;
      case opt_config: {
        std::string error;
        o.config = optarg;
        if (!parse_config(o.config, o.overrides, error)) return fail(error);
        break;
      }
      case opt_result_fd:
        if (!parse_int(optarg, 0, 1 << 20, o.result_fd)) return fail("bad --result-fd");
        break;
      default:
        usage(stderr);
        return false;
    }
  }
  if (optind < argc) o.variant = argv[optind++];
  if (optind < argc) return fail(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.list) return true;
  if (o.sweep) {
    if (!o.variant.empty()) return fail("--sweep takes no variant (use --sweep-variants)");
    if (!o.warmup_given) o.warmup = 1;
    if (!o.duration_given) o.duration = 5;
    if (o.sweep_variants.empty())
      for (const Variant& v : variants()) o.sweep_variants.push_back(v.name);
    if (o.sweep_producers.empty())
      for (int p = 1; p <= static_cast<int>(allowed_cpus().size()) && p <= max_producers; ++p)
        o.sweep_producers.push_back(p);
    return true;
  }
  if (o.variant.empty()) return fail("no variant given (see --list)");
  if (!find_variant(o.variant)) return fail("unknown variant '" + o.variant + "' (see --list)");
  return true;
}

}  // namespace bench
