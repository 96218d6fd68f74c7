// SPDX-License-Identifier: MIT
// --attach-libc N: attach and detach latency of N entry probes on libc's
// .dynsym functions. libuprobe: one register_uprobes() batch and one
// unregister_uprobes() batch, then (for reference) the same N one by one with
// register_uprobe()/unregister_uprobe(). With --kernel: the kernel's uprobes
// on the same (file, offset) pairs, one perf event (uprobe PMU) opened and
// closed at a time, as the kernel rows of the throughput bench attach them.
//
// Every round runs in a fresh child process (fork + exec of this binary), so
// each attach is cold: no XOL slot, stub or ELF cache left from a previous
// round. The first child also says which candidates libuprobe refuses (its
// own trap path's libc functions, forbidden_target); the measured rounds then
// skip those, so that exactly N probes are attached.

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <elf.h>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "uprobe/batch.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// CPU time of the calling thread (user + system), in ms: what the attach or
/// detach itself costs, without the time other processes of a loaded machine
/// take the CPU away (wall time includes that, and sleeps).
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

struct Hits final : uprobe::Consumer {
  Hits() { set_vector_state_unused(); }
  std::atomic<std::uint64_t> n{0};
  uprobe::Action handler(uprobe::Regs&) override {
    n.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// libc's file and its .dynsym function entries (sized STT_FUNC in an
/// executable segment), one per file offset, in offset order.
bool libc_functions(std::string& path, std::vector<std::uint64_t>& offsets, std::string& error) {
  try {
    path = uprobe::resolve_library("libc.so.6");
    std::set<std::uint64_t> seen;
    for (const uprobe::Symbol& s : uprobe::read_symbols(path))
      if (s.dynamic && s.type == STT_FUNC && s.executable && s.in_file && s.size > 0) seen.insert(s.offset);
    offsets.assign(seen.begin(), seen.end());
    return true;
  } catch (const std::exception& e) {
    error = e.what();
    return false;
  }
}

std::vector<std::uint64_t> parse_list(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::strtoull(item.c_str(), nullptr, 0));
  return out;
}

// ---- child side: one round, results as "key value" lines on stdout.

int child(const Options& o) {
  std::string path, error;
  std::vector<std::uint64_t> all;
  if (!libc_functions(path, all, error)) {
    std::printf("error %s\n", error.c_str());
    return 1;
  }
  const std::vector<std::uint64_t> skip = parse_list(o.attach_skip);
  std::vector<std::uint64_t> offsets;
  for (std::uint64_t off : all) {
    if (static_cast<int>(offsets.size()) == o.attach_libc) break;
    if (std::find(skip.begin(), skip.end(), off) == skip.end()) offsets.push_back(off);
  }
  std::printf("path %s\nrequested %zu\n", path.c_str(), offsets.size());
  // The switches (e.g. --no-optimize: the attach writes int3s only, as the
  // kernel's does; the conversion to jumps is then timed on its own).
  if (!o.switches.empty()) uprobe::configure(apply(o.switches, uprobe::configuration()));
  const bool convert_after = !uprobe::configuration().optimize;

  // libuprobe, one batch.
  Hits hits;
  std::vector<uprobe::ProbeRequest> reqs;
  reqs.reserve(offsets.size());
  for (std::uint64_t off : offsets) reqs.push_back(uprobe::ProbeRequest::at(path, off, hits));
  double c0 = cpu_ms();
  auto t0 = Clock::now();
  std::vector<uprobe::RegisterResult> res = uprobe::register_uprobes(reqs);
  const double attach_ms = ms_since(t0), attach_cpu = cpu_ms() - c0;
  std::vector<uprobe::ProbeConsumer> pairs;
  std::string refused;
  std::map<std::string, int> reasons;
  for (std::size_t i = 0; i < res.size(); ++i) {
    if (res[i].probe) {
      pairs.push_back({res[i].probe, &hits});
      continue;
    }
    char b[32];
    std::snprintf(b, sizeof b, "%s0x%llx", refused.empty() ? "" : ",", static_cast<unsigned long long>(offsets[i]));
    refused += b;
    std::string why = res[i].error->what();
    if (auto at = why.find(": "); at != std::string::npos) why = why.substr(at + 2);
    ++reasons[why];
  }
  const std::uint64_t hits_attached = hits.n.load();
  // What the attach left (after the clock stopped): the times include the
  // conversion of every entry that became a jump.
  std::map<std::string, int> modes;
  for (const uprobe::ProbeConsumer& pc : pairs) ++modes[uprobe::to_string(uprobe::probe_info(pc.probe).mode)];
  if (convert_after) {
    // configure(optimize on) converts the attached probes (one batch run of
    // the protocol for those whose sites are all int3).
    uprobe::Config cfg = uprobe::configuration();
    cfg.optimize = true;
    c0 = cpu_ms();
    t0 = Clock::now();
    uprobe::configure(cfg);
    std::printf("convert_ms %.3f\nconvert_cpu %.3f\n", ms_since(t0), cpu_ms() - c0);
    std::map<std::string, int> after;
    for (const uprobe::ProbeConsumer& pc : pairs) ++after[uprobe::to_string(uprobe::probe_info(pc.probe).mode)];
    for (const auto& [mode, count] : after) std::printf("converted_%s %d\n", mode.c_str(), count);
  }
  c0 = cpu_ms();
  t0 = Clock::now();
  std::vector<std::optional<uprobe::Error>> errs = uprobe::unregister_uprobes(pairs);
  const double detach_ms = ms_since(t0), detach_cpu = cpu_ms() - c0;
  const std::size_t detach_errors = std::count_if(errs.begin(), errs.end(), [](auto& e) { return e.has_value(); });
  std::printf("batch_attach_ms %.3f\nbatch_detach_ms %.3f\nbatch_attach_cpu %.3f\nbatch_detach_cpu %.3f\n"
              "attached %zu\ndetach_errors %zu\nhits %llu\n",
              attach_ms, detach_ms, attach_cpu, detach_cpu, pairs.size(), detach_errors,
              static_cast<unsigned long long>(hits_attached));
  std::printf("refused %s\n", refused.empty() ? "-" : refused.c_str());
  for (const auto& [mode, count] : modes) std::printf("mode_%s %d\n", mode.c_str(), count);
  for (const auto& [why, n] : reasons) std::printf("reason %d %s\n", n, why.c_str());

  // libuprobe, one call per probe (register_uprobe()/unregister_uprobe()),
  // on the same probes: their XOL slots exist by now, so this is the warm
  // per-probe cost.
  if (!o.attach_no_single) {
    std::vector<uprobe::Uprobe*> single;
    single.reserve(pairs.size());
    c0 = cpu_ms();
    t0 = Clock::now();
    for (std::size_t i = 0; i < res.size(); ++i)
      if (res[i].probe) single.push_back(uprobe::register_uprobe(path, offsets[i], hits));
    const double sattach = ms_since(t0), sattach_cpu = cpu_ms() - c0;
    c0 = cpu_ms();
    t0 = Clock::now();
    for (uprobe::Uprobe* p : single) uprobe::unregister_uprobe(p, hits);
    const double sdetach = ms_since(t0), sdetach_cpu = cpu_ms() - c0;
    std::printf("single_attach_ms %.3f\nsingle_detach_ms %.3f\nsingle_attach_cpu %.3f\nsingle_detach_cpu %.3f\n",
                sattach, sdetach, sattach_cpu, sdetach_cpu);
  }
  std::fflush(stdout);

  // The kernel: one perf event per probe.
  if (o.kernel) {
    const std::string why = kernel::preflight();
    if (!why.empty()) {
      std::printf("kernel_skipped %s\n", why.c_str());
      return 0;
    }
    const std::size_t n = std::min<std::size_t>(offsets.size(), static_cast<std::size_t>(o.kernel_count));
    std::vector<kernel::Location> where(n);
    std::vector<int> fds;
    fds.reserve(n);
    const std::vector<std::uint64_t> refused_list = parse_list(refused);
    const std::set<std::uint64_t> bad(refused_list.begin(), refused_list.end());
    std::size_t k = 0;
    for (std::uint64_t off : offsets) {
      if (k == n) break;
      if (bad.count(off)) continue;
      where[k].path = path;
      where[k++].offset = off;
    }
    where.resize(k);
    std::string err;
    c0 = cpu_ms();
    t0 = Clock::now();
    std::size_t krefused = 0;
    std::string first_err;
    for (const kernel::Location& w : where) {
      const int fd = kernel::open_uprobe(w, false, err);
      if (fd >= 0) {
        fds.push_back(fd);
      } else if (++krefused == 1) {
        first_err = err;
      }
    }
    const double kattach = ms_since(t0), kattach_cpu = cpu_ms() - c0;
    if (krefused)
      std::printf("kernel_error the kernel refused %zu of %zu (first: %s)\n", krefused, where.size(),
                  first_err.c_str());
    c0 = cpu_ms();
    t0 = Clock::now();
    for (int fd : fds) close(fd);
    const double kdetach = ms_since(t0), kdetach_cpu = cpu_ms() - c0;
    std::printf("kernel_attached %zu\nkernel_attach_ms %.3f\nkernel_detach_ms %.3f\nkernel_attach_cpu %.3f\n"
                "kernel_detach_cpu %.3f\n",
                fds.size(), kattach, kdetach, kattach_cpu, kdetach_cpu);
  }
  return 0;
}

// ---- parent side.

/// Runs one round in a fresh child; its "key value" lines.
bool run_round(const Options& o, const std::string& skip, std::map<std::string, std::string>& kv,
               std::vector<std::string>& reasons, std::string& error) {
  std::vector<std::string> args = {"uprobe-bench", "--attach-libc", std::to_string(o.attach_libc), "--attach-child"};
  if (!skip.empty()) args.insert(args.end(), {"--attach-skip", skip});
  if (o.kernel) args.insert(args.end(), {"--kernel", "--kernel-count", std::to_string(o.kernel_count)});
  if (o.attach_no_single) args.push_back("--attach-no-single");
  for (const std::string& a : switch_args(o.switches)) args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  flush_data(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    error = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(fds[1]);
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
  std::stringstream ss(out);
  std::string line;
  while (std::getline(ss, line)) {
    const auto sp = line.find(' ');
    const std::string key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "reason") reasons.push_back(value);
    else kv[key] = value;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    error = kv.count("error") ? kv["error"]
                              : WIFSIGNALED(status) ? std::string("child killed by signal ") + strsignal(WTERMSIG(status))
                                                    : "child exit status " + std::to_string(WEXITSTATUS(status));
    return false;
  }
  return true;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// The run's metadata without the throughput-only settings.
std::vector<std::pair<std::string, std::string>> attach_meta(const Options& o) {
  std::vector<std::pair<std::string, std::string>> m;
  for (auto& kv : run_meta(o))
    if (kv.first != "warmup_s" && kv.first != "duration_s" && kv.first != "affinity" && kv.first != "compare")
      m.push_back(std::move(kv));
  return m;
}

/// --format csv|json: every round's figures (ms), to -o FILE or stdout.
/// CSV: one row per round and measurement (batch, single, kernel, convert);
/// JSON: the run's metadata, the refusals, and the rounds with every value
/// the child reported.
bool write_attach_data(const Options& o, const std::vector<std::map<std::string, std::string>>& rounds,
                       const std::vector<std::string>& reasons) {
  FILE* data = open_data(o.output);
  if (!data) return false;
  std::vector<std::string> refused;  // "offset 0x...: why", as the text lists them
  for (const std::string& r : reasons) {
    const std::size_t at = r.find("at offset ");
    refused.push_back(at == std::string::npos ? r : r.substr(at + 3));
  }
  auto get = [](const std::map<std::string, std::string>& r, const std::string& key) {
    auto it = r.find(key);
    return it == r.end() ? std::string() : it->second;
  };
  static const char* const kRows[] = {"batch", "single", "kernel"};
  if (o.format == Format::csv) {
    for (const auto& [k, v] : attach_meta(o)) std::fprintf(data, "# %s: %s\n", k.c_str(), v.c_str());
    for (const std::string& r : refused) std::fprintf(data, "# refused: %s\n", r.c_str());
    std::fprintf(data, "round,measurement,probes,attach_wall_ms,attach_cpu_ms,detach_wall_ms,detach_cpu_ms\n");
    for (std::size_t i = 0; i < rounds.size(); ++i) {
      const auto& r = rounds[i];
      for (const char* row : kRows) {
        const std::string p = row;
        if (get(r, p + "_attach_ms").empty()) continue;
        const std::string n = get(r, p == "kernel" ? "kernel_attached" : "attached");
        std::fprintf(data, "%zu,%s,%s,%s,%s,%s,%s\n", i + 1, row, n.c_str(), get(r, p + "_attach_ms").c_str(),
                     get(r, p + "_attach_cpu").c_str(), get(r, p + "_detach_ms").c_str(),
                     get(r, p + "_detach_cpu").c_str());
      }
      if (!get(r, "convert_ms").empty())
        std::fprintf(data, "%zu,convert,%s,%s,%s,,\n", i + 1, get(r, "attached").c_str(), get(r, "convert_ms").c_str(),
                     get(r, "convert_cpu").c_str());
    }
  } else {
    std::fprintf(data, "{\n  \"meta\": {");
    bool first = true;
    for (const auto& [k, v] : attach_meta(o)) {
      std::fprintf(data, "%s\"%s\": \"%s\"", first ? "" : ", ", json_escape(k).c_str(), json_escape(v).c_str());
      first = false;
    }
    std::fprintf(data, "},\n  \"mode\": \"attach-libc\",\n  \"refused\": [");
    for (std::size_t i = 0; i < refused.size(); ++i)
      std::fprintf(data, "%s\"%s\"", i ? ", " : "", json_escape(refused[i]).c_str());
    std::fprintf(data, "],\n  \"rounds\": [");
    for (std::size_t i = 0; i < rounds.size(); ++i) {
      std::fprintf(data, "%s\n    {\"round\": %zu", i ? "," : "", i + 1);
      for (const auto& [k, v] : rounds[i]) {
        if (k == "reason" || k == "error") continue;
        char* end = nullptr;
        std::strtod(v.c_str(), &end);
        const bool number = !v.empty() && end && *end == '\0';
        if (number)
          std::fprintf(data, ", \"%s\": %s", json_escape(k).c_str(), v.c_str());
        else
          std::fprintf(data, ", \"%s\": \"%s\"", json_escape(k).c_str(), json_escape(v).c_str());
      }
      std::fprintf(data, "}");
    }
    std::fprintf(data, "\n  ]\n}\n");
  }
  return close_data(data, o.output);
}

}  // namespace

int run_attach(const Options& o) {
  FILE* out = text_out();
  if (o.attach_child) return child(o);
  std::map<std::string, std::string> kv;
  std::vector<std::string> reasons;
  std::string error;
  // Round 0 finds what libuprobe refuses among the first N candidates (again
  // with the refused ones skipped, until N are accepted).
  std::string skip;
  std::vector<std::string> all_reasons;
  Options light = o;  // the classification rounds: libuprobe's batch only
  light.kernel = false;
  light.attach_no_single = true;
  for (int tries = 0;; ++tries) {
    kv.clear();
    reasons.clear();
    if (!run_round(light, skip, kv, reasons, error)) {
      std::fprintf(out, "attach-libc: FAILED (%s)\n", error.c_str());
      return 1;
    }
    all_reasons.insert(all_reasons.end(), reasons.begin(), reasons.end());
    if (kv["refused"] == "-" || tries == 10) break;
    skip += (skip.empty() ? "" : ",") + kv["refused"];
  }
  reasons = all_reasons;  // (the measured rounds below are fresh ones)
  // libc may have fewer candidates than asked for: say how many there are.
  // (The last classification round's candidates, with the refused skipped.)
  const int requested = std::atoi(kv["requested"].c_str());
  const int refused_n = static_cast<int>(parse_list(skip).size());
  if (requested < o.attach_libc)
    std::fprintf(out, "attach-libc: %s, all %d .dynsym function entries (asked %d)", kv["path"].c_str(), requested,
                 o.attach_libc);
  else
    std::fprintf(out, "attach-libc: %s, the first %d .dynsym function entries (by file offset)", kv["path"].c_str(),
                 o.attach_libc);
  if (!skip.empty()) {
    std::fprintf(out, " that libuprobe accepts; it refuses %d of them:\n", refused_n);
    for (const std::string& r : reasons) {
      const std::size_t at = r.find("at offset ");
      std::fprintf(out, "  %s\n", (at == std::string::npos ? r : r.substr(at + 3)).c_str());
    }
  } else {
    std::fprintf(out, "\n");
  }
  std::fprintf(out, "%d round(s), each in a fresh process; ms, median of the rounds (min-max); wall = elapsed, "
               "cpu = the attaching thread's CPU time (user + system)\n",
               o.repeat);
  std::vector<std::map<std::string, std::string>> rounds;
  int failures = 0;
  std::vector<std::string> round_reasons;  // (the measured rounds refuse nothing: the refused are skipped)
  for (int round = 0; round < o.repeat; ++round) {
    {
      kv.clear();
      round_reasons.clear();
      if (!run_round(o, skip, kv, round_reasons, error)) {
        std::fprintf(out, "round %d: FAILED (%s)\n", round + 1, error.c_str());
        ++failures;
        continue;
      }
    }
    if (kv.count("kernel_skipped")) std::fprintf(out, "kernel rows skipped: %s\n", kv["kernel_skipped"].c_str());
    if (kv.count("kernel_error")) std::fprintf(out, "kernel: %s\n", kv["kernel_error"].c_str());
    if (kv["detach_errors"] != "0") {
      std::fprintf(out, "round %d: %s detach errors\n", round + 1, kv["detach_errors"].c_str());
      ++failures;
    }
    rounds.push_back(kv);
  }
  if (rounds.empty()) return 1;
  auto stat = [&](const std::string& key) {
    std::vector<double> v;
    for (auto& r : rounds)
      if (r.count(key)) v.push_back(std::atof(r[key].c_str()));
    char b[64];
    if (v.empty()) return std::string("-");
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    // Counts (hits, probes per mode) print as counts; times with decimals.
    const bool counts = std::all_of(v.begin(), v.end(), [](double x) { return x == static_cast<double>(static_cast<long long>(x)); }) &&
                        key.find("_ms") == std::string::npos && key.find("_cpu") == std::string::npos;
    if (counts && *lo == *hi) std::snprintf(b, sizeof b, "%.0f", v[0]);
    else if (counts) std::snprintf(b, sizeof b, "%.0f (%.0f-%.0f)", median(v), *lo, *hi);
    else if (v.size() == 1) std::snprintf(b, sizeof b, "%.2f", v[0]);
    else std::snprintf(b, sizeof b, "%.2f (%.1f-%.1f)", median(v), *lo, *hi);
    return std::string(b);
  };
  std::fprintf(out, "\n%-34s %22s %22s %22s %22s\n", "", "attach wall", "attach cpu", "detach wall", "detach cpu");
  auto row = [&](const std::string& label, const std::string& prefix) {
    if (stat(prefix + "_attach_ms") == "-") return;
    std::fprintf(out, "%-34s %22s %22s %22s %22s\n", label.c_str(), stat(prefix + "_attach_ms").c_str(),
                 stat(prefix + "_attach_cpu").c_str(), stat(prefix + "_detach_ms").c_str(),
                 stat(prefix + "_detach_cpu").c_str());
  };
  const std::string n = rounds[0]["attached"];
  row("libuprobe, one batch (" + n + ")", "batch");
  row("libuprobe, one by one (" + n + ")", "single");
  if (rounds[0].count("kernel_attached"))
    row("kernel, perf_event_open (" + rounds[0]["kernel_attached"] + ")", "kernel");
  std::fprintf(out, "probe hits during the batch attach (the bench calls some of these functions): %s\n",
               stat("hits").c_str());
  std::string modes;
  for (const auto& [key, value] : rounds[0])
    if (key.rfind("mode_", 0) == 0) modes += (modes.empty() ? "" : ", ") + key.substr(5) + " " + stat(key);
  if (!modes.empty())
    std::fprintf(out, "probe modes when register_uprobes() returned (the attach time includes the conversions): %s\n",
                 modes.c_str());
  if (rounds[0].count("convert_ms")) {
    std::string after;
    for (const auto& [key, value] : rounds[0])
      if (key.rfind("converted_", 0) == 0) after += (after.empty() ? "" : ", ") + key.substr(10) + " " + stat(key);
    std::fprintf(out, "then configure(optimize on) converted them: %s ms wall, %s ms cpu; modes after: %s\n",
                 stat("convert_ms").c_str(), stat("convert_cpu").c_str(), after.c_str());
  }
  if (o.format != Format::text && !write_attach_data(o, rounds, reasons)) return write_error_status;
  return failures ? 1 : 0;
}

}  // namespace bench
