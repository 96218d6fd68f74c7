// SPDX-License-Identifier: MIT
// One benchmark run, sampled as the kernel bench does: producers run the
// variant's loop; the main thread takes one sample a second, prints it, drops
// the warm-up samples and summarizes the rest.

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <latch>
#include <thread>

#include "bench.hpp"

namespace bench {
namespace {

long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void pin_self(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set))
    std::fprintf(stderr, "uprobe-bench: cannot pin to CPU %d: error %d\n", cpu, err);
}

// Samples once a second on an absolute 1 s grid (as the kernel bench's
// interval timer) and returns the hit rates (hits/s) of every sample.
std::vector<double> sample(int iterations, int producers) {
  std::vector<double> rates;
  timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  long long prev_ns = now_ns();
  std::uint64_t prev = sum_counters(producers);
  for (int iter = 0; iter < iterations; ++iter) {
    next.tv_sec += 1;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr) == EINTR) {
    }
    const long long t = now_ns();
    const std::uint64_t cur = sum_counters(producers);
    const long delta_ns = static_cast<long>(t - prev_ns);
    const double rate = static_cast<double>(cur - prev) * 1e9 / static_cast<double>(delta_ns);
    report_progress(iter, rate, delta_ns, producers);
    rates.push_back(rate);
    prev = cur;
    prev_ns = t;
  }
  return rates;
}

}  // namespace

int run_benchmark(const Options& o, const Variant& v) {
  if (o.result_fd >= 0) alarm(static_cast<unsigned>(o.warmup + o.duration + 60));  // sweep child watchdog
  std::printf("Setting up benchmark '%s'...\n", v.name);
  std::unique_ptr<Hook> hook = install_hook(v, o);
  if (!hook) return 1;

  const std::vector<int> cpus = o.affinity ? allowed_cpus() : std::vector<int>{};
  std::latch left_loop(o.producers);  // every producer is out of its loop
  std::latch may_exit(1);             // the check is done: producers may exit
  std::vector<std::thread> producers;
  for (int i = 0; i < o.producers; ++i) {
    producers.emplace_back([&, i] {
      if (!cpus.empty()) pin_self(cpus[static_cast<std::size_t>(i) % cpus.size()]);
      my_counter = &counters[i];
      v.loop();
      left_loop.count_down();
      may_exit.wait();  // stay alive while the per-thread counts are checked
    });
  }
  std::printf("Benchmark '%s' started.\n", v.name);

  const std::vector<double> rates = sample(o.warmup + o.duration, o.producers);

  stop_flag.store(true, std::memory_order_relaxed);
  left_loop.wait();
  const bool ok = hook->check(sum_counters(o.producers));
  may_exit.count_down();
  for (std::thread& t : producers) t.join();
  hook.reset();  // unregister / restore the SIGTRAP disposition
  if (!ok) return 1;

  const Result r = report_final(std::vector<double>(rates.begin() + o.warmup, rates.end()), o.producers);
  if (o.result_fd >= 0) {
    dprintf(o.result_fd, "%.17g %.17g %.17g\n", r.mean, r.stddev, r.median);
    close(o.result_fd);
  }
  return 0;
}

}  // namespace bench
