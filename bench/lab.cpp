// SPDX-License-Identifier: MIT
// The scalability lab: sweeps (--sweep, -p LIST, several variants) and
// before/after comparisons (--compare SWITCH). Every point runs in a fresh
// child process (fork + exec of this binary, so no handler, probe, runtime or
// configuration state leaks between points); samples come back through a
// pipe. After each point the scaling line of run_bench_uprobes.sh is printed;
// at the end the tables of this run and ratios computed from it (the figures
// to quote on a shared, noisy machine).

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "bench.hpp"

namespace bench {
namespace {

struct Design {
  std::string label;  // "before", "after", or "" (no comparison / switch-independent variant)
  std::string title;  // "lookup=locked", for the table headings
  Switches switches;
};

// Runs one point in a child and returns what it sent back.
RunOutcome run_in_child(const Options& o, const Variant& v, int producers, const Switches& sw) {
  RunOutcome r;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    r.note = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  const int child_end = fcntl(fds[1], F_DUPFD, 3);  // without O_CLOEXEC: the child keeps it
  close(fds[1]);
  std::vector<std::string> args = {"uprobe-bench", v.name, "-p", std::to_string(producers),
                                   "-w", std::to_string(o.warmup), "-d", std::to_string(o.duration),
                                   "--result-fd", std::to_string(child_end)};
  if (o.affinity) args.push_back("-a");
  args.push_back(std::string("--consumer=") + consumer_name(o.consumer));
  for (const std::string& a : switch_args(sw)) args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int text_fd = o.quiet ? open("/dev/null", O_WRONLY | O_CLOEXEC) : fileno(text_out());
  flush_data(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    r.note = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    close(child_end);
    if (o.quiet) close(text_fd);
    return r;
  }
  if (pid == 0) {
    if (text_fd != STDOUT_FILENO) dup2(text_fd, STDOUT_FILENO);
    execv("/proc/self/exe", argv.data());
    std::perror("uprobe-bench: execv /proc/self/exe");
    _exit(127);
  }
  close(child_end);
  if (o.quiet) close(text_fd);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) != 0) {
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    else if (errno != EINTR) break;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const bool parsed = decode_outcome(out, r);
  if (WIFSIGNALED(status)) {
    r.ok = false;
    r.skipped = false;
    r.note = "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !parsed) {
    r.ok = false;
    r.skipped = false;
    if (r.note.empty())
      r.note = "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return r;
}

using Key = std::tuple<std::string, std::string, int>;  // variant, design, producers

const Point* find(const std::map<Key, Point>& t, const std::string& v, const std::string& d, int p) {
  auto it = t.find({v, d, p});
  return it != t.end() && it->second.ok ? &it->second : nullptr;
}

void print_ratio_table(FILE* out, const std::string& title, const std::vector<int>& producers,
                       const std::vector<std::pair<std::string, std::vector<std::optional<double>>>>& rows) {
  if (rows.empty()) return;
  std::fprintf(out, "\n%s\n%-21s", title.c_str(), "variant");
  for (int p : producers) std::fprintf(out, " %3d cpus", p);
  std::fprintf(out, "\n");
  for (const auto& [name, values] : rows) {
    std::fprintf(out, "%-21s", name.c_str());
    for (const auto& v : values)
      if (v) std::fprintf(out, " %8.3f", *v);
      else std::fprintf(out, " %8s", "-");
    std::fprintf(out, "\n");
  }
}

std::optional<double> ratio(const Point* a, const Point* b) {
  if (!a || !b || b->result.median <= 0) return std::nullopt;
  return a->result.median / b->result.median;
}

/// --compare all -o F.csv: switch S's data goes to F-S.csv.
std::string switch_output(const std::string& output, const std::string& name) {
  const std::size_t slash = output.rfind('/');
  std::size_t dot = output.rfind('.');
  if (dot != std::string::npos && slash != std::string::npos && dot < slash) dot = std::string::npos;
  return output.substr(0, dot) + "-" + name + (dot == std::string::npos ? "" : output.substr(dot));
}

/// --compare all: every comparison in turn at the same producer counts, then
/// one table of all before/after pairs.
int run_compare_all(const Options& o) {
  FILE* out = text_out();
  std::vector<Ratio> ratios;
  std::vector<std::string> skipped;
  int rc = 0;
  for (const Comparison& c : comparisons()) {
    if (o.switches.has(c.name)) {
      skipped.push_back(c.name + " (set on the command line)");
      continue;
    }
    Options one = o;
    one.compare = c.name;
    if (!o.variants_given) {
      one.variants = c.default_variants;
    } else {
      one.variants.clear();
      for (const std::string& v : o.variants)
        if (uses_switches(*find_variant(v)) || is_kernel(*find_variant(v))) one.variants.push_back(v);
    }
    if (!o.output.empty()) one.output = switch_output(o.output, c.name);
    std::fprintf(out, "\n################ --compare %s ################\n", c.name.c_str());
    rc = std::max(rc, run_lab(one, &ratios));  // 2 (cannot write) over 1 (a run failed)
  }
  std::fprintf(out, "\n--compare all: before vs after of every switch (medians of the per-second samples, M/s; "
               "same run)\n");
  if (!skipped.empty()) {
    std::fprintf(out, "not compared:");
    for (const std::string& s : skipped) std::fprintf(out, " %s", s.c_str());
    std::fprintf(out, "\n");
  }
  std::fprintf(out, "%-12s %-24s %-21s %9s %9s %9s %12s\n", "switch", "before / after design", "variant",
               "producers", "before", "after", "after/before");
  for (const Ratio& r : ratios) {
    const Comparison* c = find_comparison(r.compare);
    const std::string designs = c ? c->before_label.substr(c->before_label.find('=') + 1) + " / " +
                                        c->after_label.substr(c->after_label.find('=') + 1)
                                  : "";
    std::fprintf(out, "%-12s %-24s %-21s %9d %9.3f %9.3f %12.3f\n", r.compare.c_str(), designs.c_str(),
                 r.variant.c_str(), r.producers, r.before_median, r.after_median, r.ratio);
  }
  return rc;
}

}  // namespace

int run_lab(const Options& o, std::vector<Ratio>* ratios) {
  if (o.compare == "all") return run_compare_all(o);
  FILE* out = text_out();
  FILE* data = nullptr;
  if (o.format != Format::text) {
    data = open_data(o.output);
    if (!data) return write_error_status;
  }
  Recorder rec(o, data);

  // What can run here.
  std::vector<const Variant*> vars;
  for (const std::string& n : o.variants) vars.push_back(find_variant(n));
  std::set<std::string> skipped;
  auto skip_all = [&](auto pred, const std::string& what, const std::string& why) {
    bool any = false;
    for (const Variant* v : vars)
      if (pred(*v)) {
        any = true;
        skipped.insert(v->name);
        rec.skip(v->name, why);
      }
    if (any) std::fprintf(out, "%s skipped: %s\n", what.c_str(), why.c_str());
  };
  if (std::any_of(vars.begin(), vars.end(), [](const Variant* v) { return is_kernel(*v); })) {
    const std::string why = kernel::preflight();
    if (!why.empty()) skip_all([](const Variant& v) { return is_kernel(v); }, "kernel rows", why);
  }
  if (!uretprobes_available())
    skip_all([](const Variant& v) { return v.kind == Kind::uretprobe; }, "uretprobe rows",
             "this libuprobe has no return probes (UPROBE_HAS_URETPROBE is not defined)");
  vars.erase(std::remove_if(vars.begin(), vars.end(), [&](const Variant* v) { return skipped.count(v->name) != 0; }),
             vars.end());

  // The designs: one, or before/after of the compared switch.
  const Comparison* cmp = o.compare.empty() ? nullptr : find_comparison(o.compare);
  std::vector<Design> designs;
  if (cmp) {
    Switches base = cmp->implied;
    base.merge(o.switches);
    for (int i = 0; i < 2; ++i) {
      Design d{i == 0 ? "before" : "after", i == 0 ? cmp->before_label : cmp->after_label, base};
      d.switches.merge(i == 0 ? cmp->before : cmp->after);
      const std::string rest = describe(base);
      if (!rest.empty()) d.title += ";" + rest;
      designs.push_back(d);
    }
  } else {
    designs.push_back({"", describe(o.switches), o.switches});
  }

  std::size_t runs = 0;
  for (const Variant* v : vars) runs += o.producers.size() * o.repeat * (uses_switches(*v) ? designs.size() : 1);
  std::fprintf(out, "uprobe-bench: %zu variant(s), producers", vars.size());
  for (int p : o.producers) std::fprintf(out, " %d", p);
  std::fprintf(out, ", -w %d -d %d%s", o.warmup, o.duration, o.affinity ? " -a" : "");
  if (o.repeat > 1) std::fprintf(out, " --repeat %d", o.repeat);
  if (cmp) std::fprintf(out, ", --compare %s (%s)", cmp->name.c_str(), cmp->seed.c_str());
  else if (!o.switches.empty()) std::fprintf(out, ",%s", describe(o.switches).c_str());
  std::fprintf(out, ", --consumer=%s", consumer_name(o.consumer));
  std::fprintf(out, "; %zu run(s), about %.1f min\n\n", runs,
               static_cast<double>(runs) * (o.warmup + o.duration + 0.3) / 60.0);

  std::map<Key, Point> table;
  int failures = 0;
  for (const Variant* v : vars) {
    const std::vector<Design> mine = uses_switches(*v) ? designs : std::vector<Design>{{"", "", {}}};
    for (int p : o.producers) {
      if (skipped.count(v->name)) break;
      for (int r = 0; r < o.repeat && !skipped.count(v->name); ++r) {
        for (std::size_t k = 0; k < mine.size() && !skipped.count(v->name); ++k) {
          // Alternate before/after between repeats so that drift hits both alike.
          const Design& d = mine[r % 2 ? mine.size() - 1 - k : k];
          Point& pt = table[{v->name, d.label, p}];
          if (pt.variant.empty()) {
            pt.variant = v->name;
            pt.compare = d.label.empty() ? "" : cmp->name;
            pt.design = d.label;
            pt.producers = p;
            pt.ok = true;
          }
          const RunOutcome res = run_in_child(o, *v, p, d.switches);
          if (res.skipped) {
            std::fprintf(out, "%s skipped: %s\n", v->name, res.note.c_str());
            skipped.insert(v->name);
            rec.skip(v->name, res.note);
            break;
          }
          if (!res.config.empty()) pt.config = res.config;
          for (std::size_t i = 0; i < res.rates.size(); ++i) {
            const bool warm = static_cast<int>(i) < o.warmup;
            pt.samples.push_back({r, static_cast<int>(i), warm, res.rates[i]});
            if (!warm && res.ok) pt.measured.push_back(res.rates[i]);
          }
          const std::string tag = d.label.empty() ? "" : "  [" + d.label + ": " + d.title + "]";
          if (res.ok) {
            std::fprintf(out, o.quiet ? "%s%s\n" : "%s%s\n\n",
                         scaling_line(v->name, p, summarize(std::vector<double>(res.rates.begin() + std::min<std::size_t>(res.rates.size(), static_cast<std::size_t>(o.warmup)), res.rates.end()))).c_str(),
                         tag.c_str());
          } else {
            ++failures;
            pt.ok = false;
            pt.note = res.note;
            std::fprintf(out, o.quiet ? "%-21s (%2d cpus): FAILED (%s)%s\n" : "%-21s (%2d cpus): FAILED (%s)%s\n\n",
                         v->name, p, res.note.c_str(), tag.c_str());
          }
        }
      }
      // The point is complete (all repeats, both designs): record it.
      for (const Design& d : mine) {
        auto it = table.find({v->name, d.label, p});
        if (it == table.end() || skipped.count(v->name)) continue;
        Point& pt = it->second;
        pt.result = summarize(pt.measured);
        rec.add(pt);
      }
      if (cmp && uses_switches(*v) && !skipped.count(v->name)) {
        const Point* b = find(table, v->name, "before", p);
        const Point* a = find(table, v->name, "after", p);
        if (auto x = ratio(a, b)) {
          rec.add(Ratio{cmp->name, v->name, p, b->result.median, a->result.median, *x});
          if (ratios) ratios->push_back(Ratio{cmp->name, v->name, p, b->result.median, a->result.median, *x});
        }
      }
    }
  }

  // The tables of this run.
  // The scaling lines of one design, for the variants the switches change
  // (switched), the others (!switched), or all (nullopt), in the order given.
  auto lines = [&](const std::string& design, std::optional<bool> switched) {
    for (const Variant* v : vars) {
      if (switched && uses_switches(*v) != *switched) continue;
      for (int p : o.producers)
        if (const Point* pt = find(table, v->name, design, p))
          std::fprintf(out, "%s\n", scaling_line(v->name, p, pt->result).c_str());
    }
  };
  const std::vector<int>& ps = o.producers;
  if (cmp) {
    std::fprintf(out, "\n--compare %s: seed %s\n", cmp->name.c_str(), cmp->seed.c_str());
    for (const Design& d : designs) {
      std::string head = d.label == "before" ? "BEFORE" : "AFTER";
      std::fprintf(out, "\n%s (%s)\n%s\n", head.c_str(), d.title.c_str(), std::string(head.size(), '=').c_str());
      lines(d.label, true);
    }
    std::vector<std::pair<std::string, std::vector<std::optional<double>>>> rows;
    for (const Variant* v : vars) {
      if (!uses_switches(*v)) continue;
      std::vector<std::optional<double>> vals;
      for (int p : ps) vals.push_back(ratio(find(table, v->name, "after", p), find(table, v->name, "before", p)));
      rows.emplace_back(v->name, vals);
    }
    print_ratio_table(out, "Ratio after/before (" + cmp->after_label + " / " + cmp->before_label +
                                "; medians of the per-second samples, same run; >1: after is faster):",
                      ps, rows);
    if (std::any_of(vars.begin(), vars.end(), [](const Variant* v) { return !uses_switches(*v); })) {
      std::fprintf(out, "\nReference rows (independent of the switch):\n");
      lines("", false);
    }
  } else {
    std::fprintf(out, "\nScaling (this run):\n");
    lines("", std::nullopt);
    std::vector<std::pair<std::string, std::vector<std::optional<double>>>> floor_rows, tramp_rows, kernel_rows,
        thread_rows;
    for (const Variant* v : vars) {
      std::vector<std::optional<double>> f, tr, k, t;
      const Variant* kv = kernel_counterpart(*v);
      for (int p : ps) {
        const Point* a = find(table, v->name, "", p);
        f.push_back(ratio(a, find(table, "sigtrap-floor", "", p)));
        tr.push_back(ratio(a, find(table, "trampoline-floor", "", p)));
        if (kv) k.push_back(ratio(a, find(table, kv->name, "", p)));
        const Point* one = find(table, v->name, "", 1);
        if (a && one && one->result.median > 0) t.push_back(a->result.median / p / one->result.median);
        else t.push_back(std::nullopt);
      }
      if (uses_switches(*v) && std::any_of(f.begin(), f.end(), [](auto& x) { return x.has_value(); }))
        floor_rows.emplace_back(v->name, f);
      if (uses_switches(*v) && std::any_of(tr.begin(), tr.end(), [](auto& x) { return x.has_value(); }))
        tramp_rows.emplace_back(v->name, tr);
      if (kv && std::any_of(k.begin(), k.end(), [](auto& x) { return x.has_value(); }))
        kernel_rows.emplace_back(v->name, k);
      thread_rows.emplace_back(v->name, t);
    }
    print_ratio_table(out,
                      "Ratio to sigtrap-floor at the same producer count (medians; >1 is faster than a bare int3 "
                      "round trip):",
                      ps, floor_rows);
    print_ratio_table(out,
                      "Ratio to trampoline-floor at the same producer count (medians; an optimized probe's cost "
                      "against a bare jump, GPR save and C call):",
                      ps, tramp_rows);
    print_ratio_table(out, "Ratio to the kernel's uprobe on the same target (libuprobe / kernel-*, medians):", ps,
                      kernel_rows);
    std::vector<int> multi;
    for (int p : ps)
      if (p != 1) multi.push_back(p);
    if (!multi.empty() && std::find(ps.begin(), ps.end(), 1) != ps.end()) {
      for (auto& [name, vals] : thread_rows) {
        std::vector<std::optional<double>> m;
        for (std::size_t i = 0; i < ps.size(); ++i)
          if (ps[i] != 1) m.push_back(vals[i]);
        vals = m;
      }
      print_ratio_table(out,
                        "Per-thread scaling: (hits/s per producer at P) / (hits/s at 1 producer), medians; 1.000 is "
                        "linear:",
                        multi, thread_rows);
    }
  }
  if (failures) std::fprintf(out, "\n%d run(s) FAILED\n", failures);
  rec.finish();
  if (data && !close_data(data, o.output)) return write_error_status;
  return failures ? 1 : 0;
}

std::vector<std::string> data_paths(const Options& o) {
  if (o.output.empty() || o.format == Format::text) return {};
  if (o.compare != "all") return {o.output};
  std::vector<std::string> paths;
  for (const Comparison& c : comparisons())
    if (!o.switches.has(c.name)) paths.push_back(switch_output(o.output, c.name));
  return paths;
}

}  // namespace bench
