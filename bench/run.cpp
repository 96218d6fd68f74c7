// SPDX-License-Identifier: MIT
// One benchmark point, sampled as the kernel bench does: producers run the
// variant's loop; the main thread takes one sample a second, prints it, drops
// the warm-up samples and summarizes the rest. A lab child (sweeps,
// comparisons) sends its samples to the parent over a pipe.

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <latch>
#include <sstream>
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
// interval timer) and records the hit rate (hits/s) of every sample.
void sample(int iterations, int producers, Hook& hook, RunOutcome& out) {
  timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  long long prev_ns = now_ns();
  std::uint64_t prev = hook.hits(producers);
  for (int iter = 0; iter < iterations; ++iter) {
    next.tv_sec += 1;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr) == EINTR) {
    }
    const long long t = now_ns();
    const std::uint64_t cur = hook.hits(producers);
    const long delta_ns = static_cast<long>(t - prev_ns);
    const double rate = static_cast<double>(cur - prev) * 1e9 / static_cast<double>(delta_ns);
    report_progress(iter, rate, delta_ns, producers);
    out.rates.push_back(rate);
    out.delta_ns.push_back(delta_ns);
    prev = cur;
    prev_ns = t;
  }
}

std::vector<double> measured(const RunOutcome& r, int warmup) {
  if (static_cast<int>(r.rates.size()) <= warmup) return {};
  return std::vector<double>(r.rates.begin() + warmup, r.rates.end());
}

}  // namespace

RunOutcome run_point(const Options& o, const Variant& v, int nproducers) {
  RunOutcome out;
  if (o.result_fd >= 0) alarm(static_cast<unsigned>(o.warmup + o.duration + 60));  // lab child watchdog
  std::fprintf(text_out(), "Setting up benchmark '%s'...\n", v.name);
  for (int i = 0; i < nproducers; ++i) counters[i].value.store(0, std::memory_order_relaxed);
  stop_flag.store(false, std::memory_order_relaxed);

  std::unique_ptr<Hook> hook = install_hook(v, o, out.note, out.skipped);
  if (!hook) return out;
  out.config = hook->config;

  const std::vector<int> cpus = o.affinity ? allowed_cpus() : std::vector<int>{};
  std::latch left_loop(nproducers);  // every producer is out of its loop
  std::latch may_exit(1);            // the check is done: producers may exit
  std::vector<std::thread> producers;
  for (int i = 0; i < nproducers; ++i) {
    producers.emplace_back([&, i] {
      if (!cpus.empty()) pin_self(cpus[static_cast<std::size_t>(i) % cpus.size()]);
      my_counter = &counters[i];
      v.loop();
      left_loop.count_down();
      may_exit.wait();  // stay alive while the per-thread counts are checked
    });
  }
  std::fprintf(text_out(), "Benchmark '%s' started.\n", v.name);

  sample(o.warmup + o.duration, nproducers, *hook, out);

  stop_flag.store(true, std::memory_order_relaxed);
  left_loop.wait();
  out.ok = hook->check(sum_counters(nproducers));
  if (!out.ok) out.note = "the run's hit counts did not check out (see above)";
  may_exit.count_down();
  for (std::thread& t : producers) t.join();
  hook.reset();  // unregister / restore the SIGTRAP disposition / close the perf event
  return out;
}

std::string encode_outcome(const RunOutcome& r) {
  std::ostringstream s;
  s.precision(17);
  if (!r.config.empty()) s << "config " << r.config << '\n';
  for (std::size_t i = 0; i < r.rates.size(); ++i)
    s << "sample " << r.rates[i] << ' ' << (i < r.delta_ns.size() ? r.delta_ns[i] : 0) << '\n';
  if (r.skipped) s << "skip " << r.note << '\n';
  else if (!r.ok) s << "fail " << r.note << '\n';
  else s << "ok\n";
  return s.str();
}

bool decode_outcome(const std::string& text, RunOutcome& r) {
  r = RunOutcome{};
  std::istringstream in(text);
  std::string line;
  bool ended = false;
  while (std::getline(in, line)) {
    const std::size_t sp = line.find(' ');
    const std::string key = line.substr(0, sp), rest = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "config") {
      r.config = rest;
    } else if (key == "sample") {
      double rate = 0;
      long delta = 0;
      if (std::sscanf(rest.c_str(), "%lf %ld", &rate, &delta) != 2) return false;
      r.rates.push_back(rate);
      r.delta_ns.push_back(delta);
    } else if (key == "skip" || key == "fail") {
      r.skipped = key == "skip";
      r.note = rest;
      ended = true;
    } else if (key == "ok") {
      r.ok = true;
      ended = true;
    } else {
      return false;
    }
  }
  return ended;
}

int run_child(const Options& o) {
  const RunOutcome r = run_point(o, *find_variant(o.variants.front()), o.producers.front());
  const std::string text = encode_outcome(r);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(o.result_fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  close(o.result_fd);
  return r.ok || r.skipped ? 0 : 1;
}

int run_single(const Options& o) {
  const Variant& v = *find_variant(o.variants.front());
  const int producers = o.producers.front();
  // The data file first: one that cannot be written is refused before the run.
  FILE* data = nullptr;
  if (o.format != Format::text) {
    data = open_data(o.output);
    if (!data) return write_error_status;
  }
  const RunOutcome r = run_point(o, v, producers);

  int status = 0;
  Point p;
  p.variant = v.name;
  p.producers = producers;
  p.config = r.config;
  p.ok = r.ok;
  p.skipped = r.skipped;
  p.note = r.note;
  for (std::size_t i = 0; i < r.rates.size(); ++i)
    p.samples.push_back({0, static_cast<int>(i), static_cast<int>(i) < o.warmup, r.rates[i]});
  p.measured = measured(r, o.warmup);
  if (r.skipped) {
    std::fprintf(text_out(), "%s: skipped: %s\n", v.name, r.note.c_str());
  } else if (!r.ok) {
    std::fprintf(stderr, "uprobe-bench: %s\n", r.note.c_str());
    status = 1;
  } else {
    p.result = summarize(p.measured);
    report_final(p.result, producers);
  }
  if (data) {
    Recorder rec(o, data);
    if (r.skipped) rec.skip(v.name, r.note);
    else rec.add(p);
    rec.finish();
    if (!close_data(data, o.output)) return write_error_status;
  }
  return status;
}

}  // namespace bench
