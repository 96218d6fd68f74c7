// SPDX-License-Identifier: MIT
// --sweep: every variant for each producer count, each point in a fresh child
// process (fork + exec of this binary, so no handler, probe or runtime state
// leaks between points); results come back through a pipe. Prints the scaling
// line of run_bench_uprobes.sh after each point, then ratio tables computed
// from this one run.

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "bench.hpp"

namespace bench {
namespace {

struct Point {
  bool ok = false;
  Result r;
};

// Runs one point in a child; false if it failed (status printed).
bool run_child(const Options& o, const std::string& variant, int producers, Result& r) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("uprobe-bench: pipe");
    return false;
  }
  std::vector<std::string> args = {"uprobe-bench", variant, "-p", std::to_string(producers),
                                   "-w", std::to_string(o.warmup), "-d", std::to_string(o.duration),
                                   "--result-fd", std::to_string(fds[1])};
  if (o.affinity) args.push_back("-a");
  if (!o.config.empty()) args.insert(args.end(), {"--config", o.config});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("uprobe-bench: fork");
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  if (pid == 0) {
    close(fds[0]);
    execv("/proc/self/exe", argv.data());
    std::perror("uprobe-bench: execv /proc/self/exe");
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) != 0) {
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    else if (errno != EINTR) break;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const bool parsed = std::sscanf(out.c_str(), "%lf %lf %lf", &r.mean, &r.stddev, &r.median) == 3;
  if (exited_ok && parsed) return true;
  if (WIFSIGNALED(status))
    std::printf("%-21s (%2d cpus): FAILED (killed by signal %d)\n", variant.c_str(), producers, WTERMSIG(status));
  else
    std::printf("%-21s (%2d cpus): FAILED (exit status %d)\n", variant.c_str(), producers,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return false;
}

void print_scaling(const std::string& variant, int producers, const Result& r) {
  std::printf("%-21s (%2d cpus): %8.3f \u00B1 %5.3fM/s  (%7.3fM/s/cpu)\n", variant.c_str(), producers, r.mean,
              r.stddev, r.mean / producers);
}

using Table = std::map<std::pair<std::string, int>, Point>;

const Point* find(const Table& t, const std::string& v, int p) {
  auto it = t.find({v, p});
  return it != t.end() && it->second.ok ? &it->second : nullptr;
}

void print_ratios(const Options& o, const Table& t) {
  std::printf("\nScaling (this run):\n");
  for (const std::string& v : o.sweep_variants)
    for (int p : o.sweep_producers)
      if (const Point* pt = find(t, v, p)) print_scaling(v, p, pt->r);

  bool any_uprobe = false;
  for (const std::string& v : o.sweep_variants) any_uprobe |= v.rfind("uprobe-", 0) == 0;
  if (any_uprobe) {
    std::printf("\nRatio to sigtrap-floor at the same producer count (hits/s; >1 is faster than a bare int3 "
                "round trip):\n%-21s", "variant");
    for (int p : o.sweep_producers) std::printf(" %3d cpus", p);
    std::printf("\n");
    for (const std::string& v : o.sweep_variants) {
      if (v.rfind("uprobe-", 0) != 0) continue;
      std::printf("%-21s", v.c_str());
      for (int p : o.sweep_producers) {
        const Point* a = find(t, v, p);
        const Point* b = find(t, "sigtrap-floor", p);
        if (a && b && b->r.mean > 0) std::printf(" %8.3f", a->r.mean / b->r.mean);
        else std::printf(" %8s", "-");
      }
      std::printf("\n");
    }
  }

  std::vector<int> multi;
  for (int p : o.sweep_producers)
    if (p != 1) multi.push_back(p);
  if (multi.empty()) return;
  std::printf("\nPer-thread scaling: (hits/s per producer at P) / (hits/s at 1 producer); 1.000 is linear:\n%-21s",
              "variant");
  for (int p : multi) std::printf(" %3d cpus", p);
  std::printf("\n");
  for (const std::string& v : o.sweep_variants) {
    std::printf("%-21s", v.c_str());
    const Point* one = find(t, v, 1);
    for (int p : multi) {
      const Point* a = find(t, v, p);
      if (a && one && one->r.mean > 0) std::printf(" %8.3f", a->r.mean / p / one->r.mean);
      else std::printf(" %8s", "-");
    }
    std::printf("\n");
  }
}

}  // namespace

int run_sweep(const Options& o) {
  Table table;
  int failures = 0;
  std::printf("uprobe-bench sweep: %zu variant(s), producers", o.sweep_variants.size());
  for (int p : o.sweep_producers) std::printf(" %d", p);
  std::printf(", -w %d -d %d%s%s%s\n\n", o.warmup, o.duration, o.affinity ? " -a" : "",
              o.config.empty() ? "" : " --config ", o.config.c_str());
  for (const std::string& v : o.sweep_variants) {
    for (int p : o.sweep_producers) {
      Point& pt = table[{v, p}];
      pt.ok = run_child(o, v, p, pt.r);
      if (pt.ok) print_scaling(v, p, pt.r);
      else ++failures;
      std::printf("\n");
    }
  }
  print_ratios(o, table);
  if (failures) std::printf("\n%d point(s) FAILED\n", failures);
  return failures ? 1 : 0;
}

}  // namespace bench
