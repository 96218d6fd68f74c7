// SPDX-License-Identifier: MIT
// --cycles: the cost of one call of each variant's target by the time-stamp
// counter, the minimum over many short batches on one thread. Load from
// other processes only ever adds time to a batch, so the minimum is what a
// call costs on a quiet core; ratios between rows stay meaningful on a noisy
// shared machine, where the throughput rows' medians drift between variants
// measured seconds apart. Rounds (-r) alternate the variants and keep each
// one's best batch.

#include <x86intrin.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>
#include <string>

#include "bench.hpp"

namespace bench {
namespace {

constexpr int kBatch = 1000;  // calls per timed batch

long long mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/// TSC ticks per nanosecond, measured against CLOCK_MONOTONIC over 200 ms.
double tsc_per_ns() {
  const long long n0 = mono_ns();
  const std::uint64_t t0 = __rdtsc();
  while (mono_ns() - n0 < 200000000LL) {
  }
  const long long n1 = mono_ns();
  const std::uint64_t t1 = __rdtsc();
  return static_cast<double>(t1 - t0) / static_cast<double>(n1 - n0);
}

/// The fewest ticks one batch of kBatch calls of `target` took, over
/// `batches` batches (after a warm-up batch).
std::uint64_t min_batch(void (*target)(), int batches) {
  std::uint64_t best = ~std::uint64_t{0};
  for (int b = -1; b < batches; ++b) {
    _mm_lfence();
    const std::uint64_t t0 = __rdtsc();
    for (int i = 0; i < kBatch; ++i) {
      target();
      asm volatile("" ::: "memory");
    }
    _mm_lfence();
    const std::uint64_t dt = __rdtsc() - t0;
    if (b >= 0) best = std::min(best, dt);
  }
  return best;
}

struct Row {
  std::optional<std::uint64_t> best;  // ticks per kBatch calls
  std::string note;
};

}  // namespace

int run_cycles(const Options& o) {
  const int batches = std::max(10, o.duration * 100);
  const int rounds = std::max(1, o.repeat);
  const double per_ns = tsc_per_ns();
  std::map<std::string, Row> rows;
  bool failed = false;
  std::fprintf(text_out(), "uprobe-bench --cycles: %zu variant(s), %d round(s) of %d batches of %d calls, one thread\n",
               o.variants.size(), rounds, batches, kBatch);
  std::fprintf(text_out(), "Consumer (uprobe-*/uretprobe-*): %s\n", consumer_description(o.consumer));
  for (int r = 0; r < rounds; ++r) {
    for (const std::string& name : o.variants) {
      const Variant& v = *find_variant(name);
      Row& row = rows[name];
      if (!v.target) {
        row.note = "no single target to call (a loop-only variant)";
        continue;
      }
      counters[0].value.store(0, std::memory_order_relaxed);
      std::string error;
      bool skipped = false;
      std::unique_ptr<Hook> hook = install_hook(v, o, error, skipped);
      if (!hook) {
        row.note = error;
        failed = failed || !skipped;
        continue;
      }
      my_counter = &counters[0];
      const std::uint64_t best = min_batch(v.target, batches);
      const std::uint64_t calls = static_cast<std::uint64_t>(batches + 1) * kBatch;
      // The kernel's rows count in the perf event; the others in our counter.
      if (is_kernel(v)) counters[0].value.store(calls, std::memory_order_relaxed);
      const std::uint64_t counted = sum_counters(1);
      my_counter = nullptr;
      if (!hook->check(counted) || counted != calls) {
        std::fprintf(stderr, "uprobe-bench: ERROR: %s: %" PRIu64 " hits counted for %" PRIu64 " calls\n", v.name,
                     counted, calls);
        row.note = "hit counts did not check out";
        failed = true;
        continue;
      }
      hook.reset();
      if (!row.best || best < *row.best) row.best = best;
    }
  }
  auto per_call = [&](const std::string& n) -> std::optional<double> {
    auto it = rows.find(n);
    if (it == rows.end() || !it->second.best) return std::nullopt;
    return static_cast<double>(*it->second.best) / kBatch;
  };
  const std::optional<double> floor = per_call("trampoline-floor");
  std::fprintf(text_out(),
               "\nCost per call (TSC %.3f GHz; minimum over batches; ratios: floor / variant, kernel / variant;"
               " --consumer=%s)\n",
               per_ns, consumer_name(o.consumer));
  std::fprintf(text_out(), "%-22s %10s %9s %12s %11s\n", "variant", "ticks", "ns", "floor/this", "kernel/this");
  for (const std::string& name : o.variants) {
    const Row& row = rows[name];
    const std::optional<double> c = per_call(name);
    if (!c) {
      std::fprintf(text_out(), "%-22s %s\n", name.c_str(), row.note.c_str());
      continue;
    }
    char f[32] = "-", k[32] = "-";
    if (floor) std::snprintf(f, sizeof f, "%.3f", *floor / *c);
    if (const Variant* kv = kernel_counterpart(*find_variant(name)))
      if (const std::optional<double> kc = per_call(kv->name)) std::snprintf(k, sizeof k, "%.1fx", *kc / *c);
    std::fprintf(text_out(), "%-22s %10.1f %9.2f %12s %11s\n", name.c_str(), *c, *c / per_ns, f, k);
  }
  return failed ? 1 : 0;
}

}  // namespace bench
