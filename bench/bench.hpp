// SPDX-License-Identifier: MIT
#pragma once
/// @file bench.hpp
/// uprobe-bench internals shared by its translation units.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/config.hpp"

extern "C" {
void uprobe_target_nop();
void uprobe_target_push();
void uprobe_target_ret();
void uprobe_target_nop5();
void sigtrap_floor_target();
}

namespace bench {

// ---- counters.cpp: one cache line per producer, no shared writes on the hot path.
inline constexpr int max_producers = 256;

struct alignas(64) Counter {
  std::atomic<std::uint64_t> value{0};
};

extern Counter counters[max_producers];
extern constinit thread_local Counter* my_counter;  // set by each producer before it starts
extern std::atomic<bool> stop_flag;       // in its own cache line (see counters.cpp)

/// Counts one hit on the calling thread's counter. Async-signal-safe.
inline void count_hit() noexcept {
  Counter* c = my_counter;
  if (c) c->value.store(c->value.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
std::uint64_t sum_counters(int producers) noexcept;

// ---- config.cpp: --config lookup=locked|speculative,xol=jump_back|single_step,
//      signal=defer|nodefer,emulate=on|off. Applied only by the uprobe variants.
struct ConfigOverrides {
  std::optional<uprobe::LookupMode> lookup;
  std::optional<uprobe::XolMode> xol;
  std::optional<uprobe::SignalMask> signal_mask;
  std::optional<bool> emulate;
};
bool parse_config(const std::string& text, ConfigOverrides& out, std::string& error);
/// Applies the overrides with uprobe::configure() and prints the resulting configuration.
void apply_config(const ConfigOverrides& overrides);

// ---- options.cpp
struct Options {
  std::string variant;
  int producers = 1;
  bool affinity = false;
  int warmup = 1;
  int duration = 5;
  bool warmup_given = false;
  bool duration_given = false;
  std::string config;  // the raw --config string, passed on to sweep children
  ConfigOverrides overrides;
  bool list = false;
  bool sweep = false;
  std::vector<std::string> sweep_variants;
  std::vector<int> sweep_producers;
  int result_fd = -1;  // internal: a sweep child writes its Result here
};

/// Parses argv; prints the error/usage and returns false on bad input.
bool parse_options(int argc, char** argv, Options& out);
std::vector<int> allowed_cpus();

// ---- variants.cpp
enum class Kind { count_call, count_syscall, sigtrap, uprobe };

struct Variant {
  const char* name;
  Kind kind;
  void (*target)();  // the function the hook is put on (sigtrap, uprobe variants)
  void (*loop)();    // the producer's hot loop: runs until stop_flag is set
};

const std::vector<Variant>& variants();
const Variant* find_variant(const std::string& name);

// ---- hooks.cpp: what a variant installs before the producers start.
class Hook {
 public:
  virtual ~Hook() = default;
  /// Called with the producers stopped but not yet exited; `counted` is the
  /// counters' total over the run. False means the run is invalid.
  virtual bool check(std::uint64_t counted) { (void)counted; return true; }
};
/// Installs the variant's hook (SIGTRAP handler, uprobe). nullptr on failure (reason printed).
std::unique_ptr<Hook> install_hook(const Variant& v, const Options& o);

// ---- report.cpp: the kernel bench's hits_drops_report_{progress,final}.
struct Result {
  double mean = 0, stddev = 0, median = 0;  // M/s over the non-warm-up samples
};
void report_progress(int iter, double hits_per_sec, long delta_ns, int producers);
Result report_final(const std::vector<double>& rates, int producers);

// ---- run.cpp / sweep.cpp
int run_benchmark(const Options& o, const Variant& v);
int run_sweep(const Options& o);

}  // namespace bench
