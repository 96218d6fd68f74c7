// SPDX-License-Identifier: MIT
#pragma once
/// @file bench.hpp
/// uprobe-bench internals shared by its translation units (and by the tests
/// of the bench itself, tests/bench/, which link the uprobe_bench_core library).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "uprobe/config.hpp"

namespace uprobe {
class Consumer;
}

extern "C" {
void uprobe_target_nop();
void uprobe_target_push();
void uprobe_target_ret();
void uprobe_target_nop5();
void uprobe_target_nop5_mid();
void sigtrap_floor_target();
void uprobe_target_entry();
void trampoline_floor_target();
void trampoline_floor_popfq_target();
}

namespace bench {

// ---- counters.cpp: one cache line per producer, no shared writes on the hot path.
inline constexpr int max_producers = 256;

struct alignas(64) Counter {
  std::atomic<std::uint64_t> value{0};
};

extern Counter counters[max_producers];
extern constinit thread_local Counter* my_counter;  // set by each producer before it starts
extern std::atomic<bool> stop_flag;                 // in its own cache line (see counters.cpp)

/// Counts one hit on the calling thread's counter. Async-signal-safe.
inline void count_hit() noexcept {
  Counter* c = my_counter;
  if (c) c->value.store(c->value.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
std::uint64_t sum_counters(int producers) noexcept;

// ---- The counting consumers of uprobe-* and uretprobe-* (--consumer).
/// plain: an ordinary consumer, compiled with the project's normal flags, that
/// does not call set_vector_state_unused() and does floating-point work (a
/// double) on every hit (plain_consumers.cpp): what a user's consumer costs.
/// libuprobe reads its code at registration (legacy SSE only: it saves
/// xmm0..xmmN and the MXCSR around it). gpr: general-purpose registers only
/// (consumers.cpp, -mgeneral-regs-only), declaring set_vector_state_unused()
/// truthfully: the floor of a hit, as the kernel bench's BPF programs (which
/// never touch the FPU). opaque: plain, and a call through a pointer that the
/// reading of its code cannot follow (as a call into libc): the full save of
/// what the site makes live. integer ("int"): plain with integer work instead
/// of the double (its code read as touching no vector register: nothing saved).
enum class ConsumerKind { plain, gpr, opaque, integer };
/// "plain", "gpr", "opaque" or "int".
const char* consumer_name(ConsumerKind k) noexcept;
/// One line saying what the consumer of kind `k` does.
const char* consumer_description(ConsumerKind k) noexcept;
uprobe::Consumer& gpr_consumer();
uprobe::Consumer& gpr_ret_consumer();
uprobe::Consumer& plain_consumer();
uprobe::Consumer& plain_ret_consumer();
uprobe::Consumer& opaque_consumer();
uprobe::Consumer& opaque_ret_consumer();
/// The entry (ret = false) or return consumer of kind `k`.
uprobe::Consumer& consumer_of(ConsumerKind k, bool ret);

/// Where human-readable text goes: stdout, or stderr when stdout carries
/// --format csv|json.
FILE* text_out() noexcept;
void set_text_out(FILE* f) noexcept;

// ---- switches.cpp: the ablation switches of uprobe::Config as CLI flags.
struct Switches {
  std::optional<uprobe::LookupMode> lookup;
  std::optional<uprobe::XolMode> xol;
  std::optional<uprobe::SignalMask> signal_mask;
  std::optional<bool> emulate;
  std::optional<uprobe::RiPool> ri_pool;
  std::optional<uprobe::RiLock> ri_lock;
  std::optional<bool> optimize;
  bool empty() const noexcept;
  /// Is switch `name` (see set_switch) set?
  bool has(const std::string& name) const;
  /// Every switch set in `other` overrides this one's.
  void merge(const Switches& other);
};

/// Sets one switch by its CLI name: lookup=speculative|locked, xol=jump-back|single-step,
/// signal-mask=nodefer|defer, emulate=on|off, ri-pool=objpool|freelist,
/// ri-lock=none|global, optimize=on|off. '_' may stand for '-' in names and values
/// ("signal" is accepted for signal-mask); booleans also take true/false/1/0.
bool set_switch(Switches& s, const std::string& name, const std::string& value, std::string& error);
/// --config k=v,k=v (the older spelling of the same switches).
bool parse_config(const std::string& text, Switches& out, std::string& error);
/// The CLI flags that reproduce `s` (passed to sweep children).
std::vector<std::string> switch_args(const Switches& s);
/// `base` with the switches of `s` applied.
uprobe::Config apply(const Switches& s, uprobe::Config base);
/// The switch names and values of a configuration, in a fixed order:
/// lookup, xol, signal_mask, emulate, ri_pool, ri_lock, optimize.
std::vector<std::pair<std::string, std::string>> config_fields(const uprobe::Config& c);
/// "lookup=speculative xol=jump-back ..." (config_fields joined by spaces).
std::string describe(const uprobe::Config& c);
/// Names of the switches set in `s` whose value differs in `effective`
/// (the runtime ignored them), comma-separated; empty if none.
std::string ignored_switches(const Switches& s, const uprobe::Config& effective);
/// " lookup=locked signal-mask=defer" for the switches set in `s` (empty if none).
std::string describe(const Switches& s);

/// A before/after pair of one switch (--compare NAME): `before` is the design
/// the seed patch replaced, `after` the scalable default.
struct Comparison {
  std::string name;       ///< the switch: lookup, signal-mask, ri-pool, ri-lock, optimize, xol, emulate
  std::string seed;       ///< which seed document it reproduces
  Switches before, after;
  std::string before_label, after_label;  ///< e.g. "lookup=locked"
  std::vector<std::string> default_variants;
  Switches implied;  ///< set for both designs unless the user set them (e.g. emulate=off for xol)
};
const std::vector<Comparison>& comparisons();
const Comparison* find_comparison(const std::string& name);

// ---- options.cpp
enum class Format { text, csv, json };

struct Options {
  std::vector<std::string> variants;  // as given (patterns expanded), plus --kernel counterparts
  std::vector<int> producers;         // empty: 1 (single run) or 1..nproc (sweep/compare)
  bool affinity = false;
  int warmup = 1;
  int duration = 5;
  int repeat = 1;
  Switches switches;
  std::string compare;  // --compare SWITCH, or "all"
  bool variants_given = false;  // variants named on the command line (not defaults)
  bool kernel = false;  // --kernel
  bool list = false;
  bool sweep = false;
  bool quiet = false;
  Format format = Format::text;
  std::string output;  // -o FILE: where csv/json go (default stdout)
  int result_fd = -1;  // internal: a lab child writes its samples here
  std::string command_line;
  int attach_libc = 0;          // --attach-libc N: attach/detach latency of N libc entry probes (0: off)
  bool attach_child = false;    // internal: one --attach-libc round, "key value" lines on stdout
  std::string attach_skip;      // internal: file offsets the round skips (libuprobe refuses them)
  bool attach_no_single = false;  // --attach-no-single: no one-by-one register_uprobe() rows
  int kernel_count = 0;         // --kernel-count N: kernel probes in --attach-libc (default: all)
  bool cycles = false;          // --cycles: TSC ticks per call, minimum over batches (cycles.cpp)
  ConsumerKind consumer = ConsumerKind::plain;  // --consumer=plain|gpr: the uprobe-*/uretprobe-* consumers
  /// True when the run has more than one point (or asked for a sweep,
  /// comparison, kernel rows or repeats): it then runs each point in a child.
  bool lab() const noexcept;
};

/// Parses argv; prints the error/usage and returns false on bad input.
bool parse_options(int argc, char** argv, Options& out);
/// Producer counts: "1,2,4,8", "1-8", "1-16:2", "N" (= CPUs allowed), "2N", and
/// comma-separated mixes; 1..max_producers each, duplicates dropped.
bool parse_producers(const std::string& text, std::vector<int>& out, std::string& error);
std::vector<int> allowed_cpus();

// ---- variants.cpp
enum class Kind { count_call, count_syscall, sigtrap, trampoline, uprobe, uretprobe, kernel_uprobe, kernel_uretprobe };

struct Variant {
  const char* name;
  Kind kind;
  void (*target)();  // the function called; the hook is put on it (sigtrap, uprobe, kernel variants)
  void (*loop)();    // the producer's hot loop: runs until stop_flag is set
  std::size_t site_offset = 0;  // where in `target` the probe goes (0: its entry)
};
/// The probe address of a variant: target + site_offset.
inline const void* probe_site(const Variant& v) noexcept {
  return reinterpret_cast<const char*>(v.target) + v.site_offset;
}

const std::vector<Variant>& variants();
const Variant* find_variant(const std::string& name);
/// libuprobe variants (uprobe-*, uretprobe-*): the only ones the switches change.
bool uses_switches(const Variant& v) noexcept;
bool is_kernel(const Variant& v) noexcept;
/// kernel-uprobe-nop for uprobe-nop, etc.; nullptr for the others.
const Variant* kernel_counterpart(const Variant& v);
/// This libuprobe has return probes (UPROBE_HAS_URETPROBE).
bool uretprobes_available() noexcept;

// ---- hooks.cpp: what a variant installs before the producers start.
class Hook {
 public:
  virtual ~Hook() = default;
  /// Hits so far, summed over the producers (the kernel variants read the
  /// perf event's count instead of the producers' counters).
  virtual std::uint64_t hits(int producers) { return sum_counters(producers); }
  /// Called with the producers stopped but not yet exited; `counted` is the
  /// counters' total over the run. False means the run is invalid.
  virtual bool check(std::uint64_t counted) {
    (void)counted;
    return true;
  }
  /// The runtime configuration the run used (describe()); empty when the
  /// variant does not use libuprobe.
  std::string config;
};
/// Installs the variant's hook (SIGTRAP handler, uprobe, kernel uprobe).
/// nullptr on failure: `error` says why; `skipped` is true when the variant
/// cannot run here at all (not permitted, no return probes), which is not a failure.
std::unique_ptr<Hook> install_hook(const Variant& v, const Options& o, std::string& error, bool& skipped);

// ---- cycles.cpp
/// --cycles: for every variant in turn on this thread, the fewest TSC ticks a
/// batch of calls of its target took (-d sets the batches: 100 per second
/// given, -r the rounds); prints ticks and ns per call and the ratios to
/// trampoline-floor and to the kernel's row. Returns the exit status.
int run_cycles(const Options& o);

// ---- kernel.cpp: kernel uprobes through perf_event_open and the uprobe PMU.
namespace kernel {
struct Location {
  std::string path;          ///< the mapped file, as /proc/self/maps names it
  std::uint64_t offset = 0;  ///< file offset of the address
};
/// File and file offset of an address of this process, from /proc/self/maps.
bool locate(const void* address, Location& out, std::string& error);
/// Opens a counting perf event for a uprobe (or uretprobe) at `where`, on
/// this process, inherited by threads created later. -1 with `error` set.
/// The kernel reads where.path again whenever the event is inherited by a new
/// thread: `where` must outlive the event.
int open_uprobe(const Location& where, bool retprobe, std::string& error);
/// Reads a counting event (summed over inherited threads).
std::uint64_t read_count(int fd) noexcept;
/// Empty if kernel uprobes can be opened here; else one line saying why.
std::string preflight();
}  // namespace kernel

// ---- report.cpp: the kernel bench's hits_drops_report_{progress,final}, and statistics.
struct Result {
  double mean = 0, stddev = 0, median = 0;  // M/s
};
/// Mean, sample standard deviation and median of hit rates (hits/s), in M/s.
Result summarize(const std::vector<double>& rates);
void report_progress(int iter, double hits_per_sec, long delta_ns, int producers);
void report_final(const Result& r, int producers);
/// The scaling line of run_bench_uprobes.sh (as in the seeds' tables):
/// "uprobe-nop            ( 4 cpus):   13.100 ± 0.007M/s  (  3.275M/s/cpu)".
std::string scaling_line(const std::string& variant, int producers, const Result& r);

// ---- run.cpp: one point, in this process.
struct RunOutcome {
  bool ok = false;
  bool skipped = false;
  std::string note;            // why it failed or was skipped
  std::string config;          // describe() of the runtime configuration, or empty
  std::vector<double> rates;   // hits/s of every sample, warm-up included
  std::vector<long> delta_ns;  // each sample's interval
};
RunOutcome run_point(const Options& o, const Variant& v, int producers);
/// A single run (one variant, one producer count) printed as the kernel bench does.
int run_single(const Options& o);
/// Child side of the lab protocol: runs the point and writes it to o.result_fd.
int run_child(const Options& o);
/// The lab protocol (child -> parent, text lines) and its parser.
std::string encode_outcome(const RunOutcome& r);
bool decode_outcome(const std::string& text, RunOutcome& r);

// ---- output.cpp: --format csv|json.
struct Point {
  std::string variant;
  std::string compare;  // the compared switch, or empty
  std::string design;   // "before", "after", or empty
  int producers = 0;
  std::string config;   // describe() of the runtime configuration, or empty
  bool ok = false;
  bool skipped = false;
  std::string note;
  struct Sample {
    int repeat, iteration;
    bool warmup;
    double hits_per_sec;
  };
  std::vector<Sample> samples;
  std::vector<double> measured;  // the non-warm-up rates, pooled over repeats
  Result result;
};
struct Ratio {
  std::string compare, variant;
  int producers;
  double before_median, after_median, ratio;
};

class Recorder {
 public:
  Recorder(const Options& o, FILE* out);
  /// A finished point (all its repeats): its samples and summary.
  void add(const Point& p);
  void add(const Ratio& r);
  /// A whole variant that could not run (reason in `note`).
  void skip(const std::string& variant, const std::string& note);
  /// Writes what is still buffered (JSON: everything).
  void finish();

 private:
  const Options& o_;
  FILE* out_;
  std::vector<Point> points_;
  std::vector<Ratio> ratios_;
  std::vector<std::pair<std::string, std::string>> skips_;
};
/// The data file of -o PATH (stdout for ""). prepare_data() opens it before
/// the run measures anything (false, with the message printed, if it cannot);
/// open_data() hands out the prepared file (or opens it then). close_data()
/// flushes and closes it (stdout: flushes) and checks that every write
/// reached it: false, with "uprobe-bench: cannot write PATH: why" printed, if not.
bool prepare_data(const std::string& path);
FILE* open_data(const std::string& path);
bool close_data(FILE* f, const std::string& path);
/// fflush(f), remembering the errno of its first failure for close_data().
void flush_data(FILE* f);
/// Exit status of a run whose csv/json (or text) could not be written.
inline constexpr int write_error_status = 2;
/// CSV/JSON string escaping (exposed for the tests).
std::string csv_escape(const std::string& s);
std::string json_escape(const std::string& s);
/// The machine and run description (CPU model, CPUs, kernel, command line).
std::vector<std::pair<std::string, std::string>> run_meta(const Options& o);

// ---- attach.cpp: --attach-libc N, attach/detach latency (each round in a fresh child).
int run_attach(const Options& o);

// ---- lab.cpp: sweeps and comparisons, each point in a fresh child process.
/// Runs the lab; the before/after ratios of a comparison are appended to
/// `ratios` when given. --compare all runs every comparison in turn.
int run_lab(const Options& o, std::vector<Ratio>* ratios = nullptr);
/// The files -o names for this run (--compare all: one per switch compared).
std::vector<std::string> data_paths(const Options& o);

}  // namespace bench
