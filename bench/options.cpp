// SPDX-License-Identifier: MIT
// Command line of uprobe-bench.

#include <fnmatch.h>
#include <getopt.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench.hpp"

namespace bench {
namespace {

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: uprobe-bench [options] VARIANT                  one run, printed as the kernel bench does\n"
      "       uprobe-bench [options] -p LIST VARIANT...       a sweep over producer counts and variants\n"
      "       uprobe-bench --sweep [options]                  every variant for 1..nproc producers (make bench)\n"
      "       uprobe-bench --compare SWITCH [options] [VARIANT...]\n"
      "                                                       the before and after design of one switch\n"
      "       uprobe-bench --list\n"
      "\n"
      "Producers and timing (as the kernel's selftests bench):\n"
      "  -p, --producers LIST  producer threads: 4 | 1,2,4,8,16 | 1-8 | 1-16:2 | N (CPUs allowed) | 2N;\n"
      "                        more producers than CPUs is allowed (default 1; sweeps and compares: 1-N)\n"
      "  -a, --affinity        pin producer i to CPU i mod nproc\n"
      "  -w, --warmup SECS     warm-up seconds, their samples dropped (default 1)\n"
      "  -d, --duration SECS   measured seconds, one sample a second (default 5)\n"
      "  -r, --repeat N        run every point N times, samples pooled; --compare alternates the\n"
      "                        order of before/after between repeats (default 1)\n"
      "\n"
      "Variants (--list names them; globs such as 'uprobe-*' work):\n"
      "  VARIANT..., --variants A,B\n"
      "  --kernel              add the kernel's own uprobes on the same targets (kernel-uprobe-*,\n"
      "                        kernel-uretprobe-*; perf_event_open with the uprobe PMU, needs root or\n"
      "                        CAP_PERFMON): the counterparts of the uprobe-*/uretprobe-* variants\n"
      "                        given, or all of them\n"
      "  --sweep               all variants (but kernel-*, see --kernel) for 1..nproc producers,\n"
      "                        each point in a fresh child process (not with --compare)\n"
      "\n"
      "Ablation switches (uprobe::Config; they change the uprobe-*/uretprobe-* variants only):\n"
      "  --lookup=speculative|locked        probe lookup on a hit (seed 000)\n"
      "  --signal-mask=nodefer|defer        SIGTRAP handler's mask (seed 001)\n"
      "  --ri-pool=objpool|freelist         return-instance pool (seed 002)\n"
      "  --ri-lock=none|global              return-instance locking (seed 004)\n"
      "  --optimize=on|off, --no-optimize   optimized probes on nop5 and safe entries (seed 003)\n"
      "  --xol=jump-back|single-step        how an out-of-line instruction continues\n"
      "  --emulate=on|off, --no-emulate     emulate simple instructions\n"
      "  --config K=V,...                   the same switches, older spelling (lookup=locked,...)\n"
      "  --compare SWITCH      run the before and after design of SWITCH (lookup, signal-mask,\n"
      "                        ri-pool, ri-lock, optimize, xol, emulate) back to back for every\n"
      "                        producer count; prints both tables and the after/before ratios\n"
      "  --compare all         every switch in turn (each on its own variants, or on the ones\n"
      "                        given), then one table of all before/after pairs; with -o F.csv\n"
      "                        each switch's data goes to F-SWITCH.csv\n"
      "\n"
      "Consumer of the uprobe-*/uretprobe-* variants (printed as 'Consumer:' by every run):\n"
      "  --consumer=plain|gpr|opaque|int\n"
      "                        plain (default): an ordinary consumer, normal compiler flags, a double\n"
      "                        computed per hit, no set_vector_state_unused(): libuprobe reads its\n"
      "                        code (SSE only) and saves xmm0..xmmN and the MXCSR around it; gpr:\n"
      "                        general registers only, declares set_vector_state_unused() (no vector\n"
      "                        state saved); opaque: plain and a call its code's reading cannot\n"
      "                        follow (as libc's): what the site makes live is saved; int: plain\n"
      "                        with integer work instead of the double (code read: nothing saved)\n"
      "\n"
      "Attach and detach latency:\n"
      "  --attach-libc N       attach entry probes to N libc .dynsym functions in one batch\n"
      "                        (register_uprobes) and detach them (unregister_uprobes), then one by\n"
      "                        one; each round (-r) in a fresh process; with --kernel also the\n"
      "                        kernel's uprobes on the same entries, one perf event at a time\n"
      "  --kernel-count M      only the first M of them for the kernel (its detach is slow)\n"
      "  --attach-no-single    leave out the one-by-one register_uprobe() rounds\n"
      "                        (both only with --attach-libc)\n"
      "\n"
      "Cost per call on a noisy machine:\n"
      "  --cycles              one thread calls each variant's target in batches of 1000 and keeps\n"
      "                        the fewest TSC ticks a batch took (100 batches per -d second, -r\n"
      "                        rounds alternating the variants); prints ticks and ns per call and\n"
      "                        the ratios to trampoline-floor and to the kernel's row (--kernel)\n"
      "\n"
      "Output:\n"
      "  --format text|csv|json  csv and json hold every sample and the summaries (to stdout, or\n"
      "                        to -o FILE); the text then goes to stderr (default text)\n"
      "  -o, --output FILE     write the csv/json there (a .csv/.json name implies --format, and\n"
      "                        a --format that differs is refused); the text stays on stdout;\n"
      "                        a FILE that cannot be written is refused before anything runs\n"
      "  -q, --quiet           sweeps: print the scaling lines and tables, not every sample\n");
}

bool parse_int(const char* text, int min, int max, int& out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (!*text || *end || v < min || v > max) return false;
  out = static_cast<int>(v);
  return true;
}

// The non-empty items of a comma-separated list; `empty_items` (when given)
// is set when the list has empty ones ("1,,2", "1,").
std::vector<std::string> split(const std::string& text, bool* empty_items = nullptr) {
  std::vector<std::string> parts;
  if (empty_items) *empty_items = false;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    if (end > pos) parts.push_back(text.substr(pos, end - pos));
    else if (empty_items) *empty_items = true;
    pos = end + 1;
  }
  return parts;
}

bool fail(const std::string& why) {
  std::fprintf(stderr, "uprobe-bench: %s\n", why.c_str());
  std::fprintf(stderr, "(uprobe-bench --help for usage)\n");
  return false;
}

// One producer-count term: an integer, N (CPUs allowed) or kN.
bool parse_count(const std::string& t, int& out) {
  const int ncpu = static_cast<int>(allowed_cpus().size());
  if (!t.empty() && t.back() == 'N') {
    int k = 1;
    if (t.size() > 1 && !parse_int(t.substr(0, t.size() - 1).c_str(), 1, max_producers, k)) return false;
    out = k * ncpu;
    return out >= 1 && out <= max_producers;
  }
  return parse_int(t.c_str(), 1, max_producers, out);
}

// Adds the variants matching `pattern` (a name or a glob). False if none.
bool add_variants(const std::string& pattern, std::vector<std::string>& out) {
  bool any = false;
  for (const Variant& v : variants()) {
    if (fnmatch(pattern.c_str(), v.name, 0) != 0) continue;
    any = true;
    if (std::find(out.begin(), out.end(), v.name) == out.end()) out.push_back(v.name);
  }
  return any;
}


// -o FILE and --format: a .csv/.json name implies the format; an explicit
// --format that contradicts the name is refused, as is -o without csv/json.
bool output_format(Options& o, bool format_given) {
  if (o.output.empty()) return true;
  auto ends = [&](const char* ext) {
    const std::size_t n = std::strlen(ext);
    return o.output.size() > n && o.output.compare(o.output.size() - n, n, ext) == 0;
  };
  const char* implied = ends(".csv") ? "csv" : ends(".json") ? "json" : nullptr;
  if (format_given && implied) {
    const char* given = o.format == Format::csv ? "csv" : o.format == Format::json ? "json" : "text";
    if (std::strcmp(given, implied) != 0)
      return fail("-o " + o.output + " is a ." + implied + " name but --format is " + given +
                  ": give one of them, or make them agree");
  }
  if (o.format != Format::text) return true;
  if (!implied) return fail("-o FILE needs --format csv|json (or a .csv/.json name)");
  o.format = std::strcmp(implied, "csv") == 0 ? Format::csv : Format::json;
  return true;
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

bool parse_producers(const std::string& text, std::vector<int>& out, std::string& error) {
  out.clear();
  bool empty_items = false;
  const std::vector<std::string> terms = split(text, &empty_items);
  if (terms.empty()) {
    error = "empty producer list";
    return false;
  }
  if (empty_items) {
    error = "empty item in producer list '" + text + "'";
    return false;
  }
  for (const std::string& term : terms) {
    std::string range = term;
    int step = 1;
    if (std::size_t colon = term.find(':'); colon != std::string::npos) {
      range = term.substr(0, colon);
      if (!parse_int(term.substr(colon + 1).c_str(), 1, max_producers, step)) {
        error = "bad step in producer list item '" + term + "'";
        return false;
      }
    }
    int lo, hi;
    const std::size_t dash = range.find('-');
    const bool ok = dash == std::string::npos
                        ? parse_count(range, lo) && (hi = lo, true)
                        : parse_count(range.substr(0, dash), lo) && parse_count(range.substr(dash + 1), hi);
    if (!ok || lo > hi) {
      error = "bad producer list item '" + term + "' (1.." + std::to_string(max_producers) +
              "; forms: 4, 1-8, 1-16:2, N, 2N)";
      return false;
    }
    for (int p = lo; p <= hi; p += step)
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return true;
}

bool Options::lab() const noexcept {
  return sweep || !compare.empty() || kernel || repeat > 1 || variants.size() > 1 || producers.size() > 1;
}

bool parse_options(int argc, char** argv, Options& o) {
  enum {
    opt_list = 256, opt_sweep, opt_variants, opt_config, opt_result_fd, opt_lookup, opt_xol, opt_signal_mask,
    opt_emulate, opt_no_emulate, opt_ri_pool, opt_ri_lock, opt_optimize, opt_no_optimize, opt_compare,
    opt_kernel, opt_format, opt_sweep_variants, opt_attach_libc, opt_attach_child, opt_attach_skip, opt_cycles,
    opt_attach_no_single, opt_kernel_count, opt_consumer,
  };
  static const option longopts[] = {
      {"producers", required_argument, nullptr, 'p'},
      {"sweep-producers", required_argument, nullptr, 'P'},  // older spelling; implies --sweep
      {"affinity", no_argument, nullptr, 'a'},
      {"warmup", required_argument, nullptr, 'w'},
      {"duration", required_argument, nullptr, 'd'},
      {"repeat", required_argument, nullptr, 'r'},
      {"quiet", no_argument, nullptr, 'q'},
      {"output", required_argument, nullptr, 'o'},
      {"help", no_argument, nullptr, 'h'},
      {"list", no_argument, nullptr, opt_list},
      {"sweep", no_argument, nullptr, opt_sweep},
      {"variants", required_argument, nullptr, opt_variants},
      {"sweep-variants", required_argument, nullptr, opt_sweep_variants},  // older spelling; implies --sweep
      {"config", required_argument, nullptr, opt_config},
      {"lookup", required_argument, nullptr, opt_lookup},
      {"xol", required_argument, nullptr, opt_xol},
      {"signal-mask", required_argument, nullptr, opt_signal_mask},
      {"emulate", required_argument, nullptr, opt_emulate},
      {"no-emulate", no_argument, nullptr, opt_no_emulate},
      {"ri-pool", required_argument, nullptr, opt_ri_pool},
      {"ri-lock", required_argument, nullptr, opt_ri_lock},
      {"optimize", required_argument, nullptr, opt_optimize},
      {"no-optimize", no_argument, nullptr, opt_no_optimize},
      {"compare", required_argument, nullptr, opt_compare},
      {"kernel", no_argument, nullptr, opt_kernel},
      {"format", required_argument, nullptr, opt_format},
      {"result-fd", required_argument, nullptr, opt_result_fd},  // internal: lab child
      {"attach-libc", required_argument, nullptr, opt_attach_libc},
      {"cycles", no_argument, nullptr, opt_cycles},
      {"attach-child", no_argument, nullptr, opt_attach_child},    // internal: one --attach-libc round
      {"attach-skip", required_argument, nullptr, opt_attach_skip},  // internal: offsets the round skips
      {"attach-no-single", no_argument, nullptr, opt_attach_no_single},
      {"kernel-count", required_argument, nullptr, opt_kernel_count},
      {"consumer", required_argument, nullptr, opt_consumer},
      {nullptr, 0, nullptr, 0},
  };
  for (int i = 0; i < argc; ++i) {
    if (i) o.command_line += ' ';
    o.command_line += argv[i];
  }
  std::vector<std::string> patterns;
  std::string error;
  auto sw = [&](const char* n, const std::string& v) {
    if (!set_switch(o.switches, n, v, error)) return fail(error);
    return true;
  };
  optind = 0;  // glibc: full re-initialisation (parse_options may run more than once, e.g. in tests)
  int c;
  std::string throughput_only;  // options that only the throughput runs read (--attach-libc refuses them)
  bool format_given = false;    // --format given explicitly
  bool consumer_given = false;  // --consumer given explicitly
  while ((c = getopt_long(argc, argv, "p:aw:d:r:qo:h", longopts, nullptr)) != -1) {
    switch (c) {
      case 'P': case 'p': case 'a': case 'w': case 'd': case opt_cycles:
        if (throughput_only.empty()) throughput_only = c == opt_cycles ? "--cycles" : std::string("-") + static_cast<char>(c);
        break;
      default:
        break;
    }
    switch (c) {
      case 'P':
        o.sweep = true;
        [[fallthrough]];
      case 'p':
        if (!parse_producers(optarg, o.producers, error)) return fail(error);
        break;
      case 'a':
        o.affinity = true;
        break;
      case 'w':
        if (!parse_int(optarg, 0, 3600, o.warmup)) return fail("bad -w (0..3600)");
        break;
      case 'd':
        if (!parse_int(optarg, 1, 3600, o.duration)) return fail("bad -d (1..3600)");
        break;
      case 'r':
        if (!parse_int(optarg, 1, 1000, o.repeat)) return fail("bad --repeat (1..1000)");
        break;
      case 'q':
        o.quiet = true;
        break;
      case 'o':
        o.output = optarg;
        break;
      case 'h':
        usage(stdout);
        std::exit(close_data(stdout, "") ? 0 : write_error_status);
      case opt_list:
        o.list = true;
        break;
      case opt_sweep:
        o.sweep = true;
        break;
      case opt_sweep_variants:
        o.sweep = true;
        [[fallthrough]];
      case opt_variants: {
        bool empty_items = false;
        for (const std::string& v : split(optarg, &empty_items)) patterns.push_back(v);
        if (empty_items) return fail(std::string("empty item in variant list '") + optarg + "'");
        break;
      }
      case opt_config:
        if (!parse_config(optarg, o.switches, error)) return fail(error);
        break;
      case opt_lookup:
        if (!sw("lookup", optarg)) return false;
        break;
      case opt_xol:
        if (!sw("xol", optarg)) return false;
        break;
      case opt_signal_mask:
        if (!sw("signal-mask", optarg)) return false;
        break;
      case opt_emulate:
        if (!sw("emulate", optarg)) return false;
        break;
      case opt_no_emulate:
        if (!sw("emulate", "off")) return false;
        break;
      case opt_ri_pool:
        if (!sw("ri-pool", optarg)) return false;
        break;
      case opt_ri_lock:
        if (!sw("ri-lock", optarg)) return false;
        break;
      case opt_optimize:
        if (!sw("optimize", optarg)) return false;
        break;
      case opt_no_optimize:
        if (!sw("optimize", "off")) return false;
        break;
      case opt_compare:
        if (std::string(optarg) == "all") {
          o.compare = "all";
          break;
        }
        if (!find_comparison(optarg))
          return fail(std::string("unknown --compare switch '") + optarg +
                      "' (all, lookup, signal-mask, ri-pool, ri-lock, optimize, xol, emulate)");
        o.compare = find_comparison(optarg)->name;
        break;
      case opt_kernel:
        o.kernel = true;
        break;
      case opt_format: {
        const std::string f = optarg;
        if (f == "text") o.format = Format::text;
        else if (f == "csv") o.format = Format::csv;
        else if (f == "json") o.format = Format::json;
        else return fail("bad --format '" + f + "' (text, csv, json)");
        format_given = true;
        break;
      }
      case opt_attach_libc:
        if (!parse_int(optarg, 1, 100000, o.attach_libc)) return fail("bad --attach-libc (1..100000)");
        break;
      case opt_cycles:
        o.cycles = true;
        break;
      case opt_attach_child:
        o.attach_child = true;
        break;
      case opt_attach_skip:
        o.attach_skip = optarg;
        break;
      case opt_attach_no_single:
        o.attach_no_single = true;
        break;
      case opt_kernel_count:
        if (!parse_int(optarg, 1, 100000, o.kernel_count)) return fail("bad --kernel-count (1..100000)");
        break;
      case opt_consumer: {
        const std::string k = optarg;
        if (k == "plain") o.consumer = ConsumerKind::plain;
        else if (k == "gpr") o.consumer = ConsumerKind::gpr;
        else if (k == "opaque") o.consumer = ConsumerKind::opaque;
        else if (k == "int") o.consumer = ConsumerKind::integer;
        else return fail("bad --consumer '" + k + "' (plain, gpr, opaque, int)");
        consumer_given = true;
        break;
      }
      case opt_result_fd:
        if (!parse_int(optarg, 0, 1 << 20, o.result_fd)) return fail("bad --result-fd");
        break;
      default:
        return fail("bad option");
    }
  }
  while (optind < argc) patterns.push_back(argv[optind++]);
  if (o.list) return true;
  if (o.attach_libc == 0) {
    // The --attach-libc options: refused, not ignored, without it.
    if (o.kernel_count > 0) return fail("--kernel-count applies to --attach-libc only");
    if (o.attach_no_single) return fail("--attach-no-single applies to --attach-libc only");
  }
  if (o.sweep && !o.compare.empty())
    return fail("--sweep and --compare are two modes: pick one (--compare takes variants and -p: "
                "--compare " + o.compare + " 'uprobe-*' -p 1-N)");
  if (!output_format(o, format_given)) return false;
  if (o.attach_libc > 0) {
    if (!patterns.empty() || !o.compare.empty() || o.sweep)
      return fail("--attach-libc takes no variant, --compare or --sweep");
    if (consumer_given)
      return fail("--consumer applies to the uprobe-*/uretprobe-* variants, not to --attach-libc");
    if (!throughput_only.empty())
      return fail("--attach-libc times attach and detach, not hits: " + throughput_only +
                  " does not apply (it takes -r, --kernel, --format, -o and the runtime switches)");
    if (o.kernel_count == 0 || o.kernel_count > o.attach_libc) o.kernel_count = o.attach_libc;
    return true;
  }

  for (const std::string& p : patterns)
    if (!add_variants(p, o.variants)) return fail("unknown variant '" + p + "' (see --list)");

  o.variants_given = !o.variants.empty();
  if (o.compare == "all") {
    // Every switch with its own default variants (or the ones given), one
    // after the other: run_lab() expands it.
    if (o.variants.empty())
      for (const Comparison& c : comparisons())
        for (const std::string& v : c.default_variants)
          if (std::find(o.variants.begin(), o.variants.end(), v) == o.variants.end()) o.variants.push_back(v);
  } else if (!o.compare.empty()) {
    const Comparison& cmp = *find_comparison(o.compare);
    if (o.switches.has(cmp.name))
      return fail("--compare " + cmp.name + " runs both values of " + cmp.name + ": do not also set it");
    if (o.variants.empty()) o.variants = cmp.default_variants;
  }
  if (o.sweep && o.variants.empty())
    for (const Variant& v : variants())
      if (!is_kernel(v)) o.variants.push_back(v.name);
  if (o.kernel) {
    std::vector<std::string> add;
    if (o.variants.empty()) {
      for (const Variant& v : variants())
        if (is_kernel(v)) add.push_back(v.name);
    } else {
      for (const std::string& n : o.variants)
        if (const Variant* k = kernel_counterpart(*find_variant(n))) add.push_back(k->name);
    }
    for (const std::string& n : add)
      if (std::find(o.variants.begin(), o.variants.end(), n) == o.variants.end()) o.variants.push_back(n);
  }
  if (o.cycles) {
    if (!o.compare.empty() || o.sweep || !o.producers.empty() || o.format != Format::text || !o.output.empty())
      return fail("--cycles runs one thread in text: no --compare, --sweep, -p, --format or -o");
    if (o.variants.empty()) return fail("no variant given (see --list)");
    return true;
  }
  if (o.variants.empty()) return fail("no variant given (see --list)");
  if (o.result_fd >= 0 && (o.variants.size() != 1 || o.producers.size() > 1))
    return fail("--result-fd takes one variant and one producer count");
  if (o.producers.empty()) {
    if (o.lab())
      for (int p = 1; p <= static_cast<int>(allowed_cpus().size()) && p <= max_producers; ++p)
        o.producers.push_back(p);
    else
      o.producers.push_back(1);
  }
  return true;
}

}  // namespace bench
