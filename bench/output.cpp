// SPDX-License-Identifier: MIT
// --format csv|json: every sample and the summaries, for tools/plot-scaling.
//
// CSV: '# key: value' comment lines (the machine and the command), a header,
// then one row per record; `kind` says which columns are filled:
//   sample   iteration, warmup (1: dropped from the summary), hits_per_sec
//   summary  mean_mps, stddev_mps, median_mps, per_cpu_mps (mean / producers), samples
//   ratio    ratio = after/before of the medians at that producer count (--compare)
//   skip     note: why the variant could not run here
//   failed   note
// The switch columns hold the runtime configuration the run reported (empty
// for variants that do not use libuprobe). JSON holds the same records in
// "samples", "summaries", "ratios" and "skipped", with "meta".

#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include "bench.hpp"

namespace bench {
namespace {

const char* const kSwitchColumns[] = {"lookup", "xol", "signal_mask", "emulate", "ri_pool", "ri_lock", "optimize"};

// "lookup=speculative xol=jump-back" -> value of `key`, or "".
std::string config_value(const std::string& config, const std::string& key) {
  std::istringstream in(config);
  std::string item;
  while (in >> item) {
    const std::size_t eq = item.find('=');
    if (eq != std::string::npos && item.substr(0, eq) == key) return item.substr(eq + 1);
  }
  return "";
}

std::string num(double v, const char* fmt = "%.6f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  out += json_escape(s);
  out += '"';
  return out;
}

std::string json_config(const std::string& config) {
  if (config.empty()) return "null";
  std::string out = "{";
  bool first = true;
  for (const char* k : kSwitchColumns) {
    if (!first) out += ", ";
    out += quoted(k) + ": " + quoted(config_value(config, k));
    first = false;
  }
  return out + "}";
}

std::string json_head(const Point& p) {
  return "\"variant\": " + quoted(p.variant) + ", \"compare\": " + quoted(p.compare) +
         ", \"design\": " + quoted(p.design) + ", \"config\": " + json_config(p.config) +
         ", \"producers\": " + std::to_string(p.producers);
}

}  // namespace

// ---- The data file (-o FILE, or stdout).

namespace {

std::map<std::string, FILE*>& prepared() {
  static std::map<std::string, FILE*> files;  // opened by prepare_data(), not yet handed out
  return files;
}

bool stdout_reported = false;  // "cannot write standard output" said once
std::map<FILE*, int>& write_errors() {
  static std::map<FILE*, int> errors;  // the first failed flush of each stream: its errno
  return errors;
}

// errno values a failed write leaves (and other calls hardly do): a stream
// whose error flag is set but whose flush errno was not recorded (glibc drops
// the buffer of a failed write) most likely failed with the errno still set.
bool write_errno(int e) {
  return e == ENOSPC || e == EIO || e == EPIPE || e == EFBIG || e == EDQUOT || e == EROFS || e == EBADF;
}

std::string where(const std::string& path) { return path.empty() ? "standard output" : path; }

}  // namespace

bool prepare_data(const std::string& path) {
  if (path.empty() || prepared().count(path)) return true;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "uprobe-bench: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  prepared()[path] = f;
  return true;
}

FILE* open_data(const std::string& path) {
  if (path.empty()) return stdout;
  if (auto it = prepared().find(path); it != prepared().end()) {
    FILE* f = it->second;
    prepared().erase(it);
    return f;
  }
  return prepare_data(path) ? open_data(path) : nullptr;
}

void flush_data(FILE* f) {
  if (!f) return;
  const int before = errno;  // a line-buffered stream failed in the fprintf that filled the line
  errno = 0;
  int err = std::fflush(f) != 0 ? errno : std::ferror(f) && write_errno(before) ? before : 0;
  if (err && !write_errors().count(f)) write_errors()[f] = err;
}

bool close_data(FILE* f, const std::string& path) {
  const int before = errno;
  errno = 0;
  bool ok = std::fflush(f) == 0;
  int err = errno;
  if (ok && std::ferror(f)) {  // an earlier write failed
    ok = false;
    const auto it = write_errors().find(f);
    err = it != write_errors().end() ? it->second : write_errno(before) ? before : 0;
  }
  write_errors().erase(f);
  if (f != stdout && std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok) return true;
  if (f == stdout && stdout_reported) return false;
  if (f == stdout) stdout_reported = true;
  std::fprintf(stderr, "uprobe-bench: cannot write %s: %s\n", where(path).c_str(),
               err ? std::strerror(err) : "write error");
  return false;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> run_meta(const Options& o) {
  std::vector<std::pair<std::string, std::string>> m;
  std::string model = "?";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  utsname u{};
  uname(&u);
  char date[64] = "?";
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  m.emplace_back("tool", "uprobe-bench");
  m.emplace_back("date", date);
  m.emplace_back("cpu", model);
  m.emplace_back("cpus_online", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
  m.emplace_back("cpus_allowed", std::to_string(allowed_cpus().size()));
  m.emplace_back("kernel", std::string(u.sysname) + " " + u.release + " " + u.machine);
  std::string load;
  std::ifstream loadavg("/proc/loadavg");
  std::getline(loadavg, load);
  m.emplace_back("loadavg", load);  // at the end of the run (JSON) / its start (CSV): the machine is shared
  m.emplace_back("command", o.command_line);
  m.emplace_back("warmup_s", std::to_string(o.warmup));
  m.emplace_back("duration_s", std::to_string(o.duration));
  m.emplace_back("repeat", std::to_string(o.repeat));
  m.emplace_back("affinity", o.affinity ? "1" : "0");
  m.emplace_back("compare", o.compare);
  return m;
}

const char* const kCsvColumns[] = {
    "kind",     "variant",  "compare",   "design",       "lookup",       "xol",        "signal_mask", "emulate",
    "ri_pool",  "ri_lock",  "optimize",  "producers",    "affinity",     "repeat",     "iteration",   "warmup",
    "hits_per_sec", "mean_mps", "stddev_mps", "median_mps", "per_cpu_mps", "samples", "ratio", "note"};

namespace {

// One CSV row: column name -> value; the others empty.
class Row {
 public:
  Row& set(const std::string& column, const std::string& value) {
    for (std::size_t i = 0; i < std::size(kCsvColumns); ++i)
      if (column == kCsvColumns[i]) values_[i] = value;
    return *this;
  }
  Row& config(const std::string& config) {
    for (const char* k : kSwitchColumns) set(k, config_value(config, k));
    return *this;
  }
  void write(FILE* out) const {
    for (std::size_t i = 0; i < std::size(kCsvColumns); ++i)
      std::fprintf(out, "%s%s", i ? "," : "", csv_escape(values_[i]).c_str());
    std::fprintf(out, "\n");
  }

 private:
  std::string values_[std::size(kCsvColumns)];
};

}  // namespace

Recorder::Recorder(const Options& o, FILE* out) : o_(o), out_(out) {
  if (o_.format != Format::csv) return;
  for (const auto& [k, v] : run_meta(o_)) std::fprintf(out_, "# %s: %s\n", k.c_str(), v.c_str());
  for (std::size_t i = 0; i < std::size(kCsvColumns); ++i) std::fprintf(out_, "%s%s", i ? "," : "", kCsvColumns[i]);
  std::fprintf(out_, "\n");
  flush_data(out_);
}

void Recorder::add(const Point& p) {
  if (o_.format == Format::json) {
    points_.push_back(p);
    return;
  }
  if (o_.format != Format::csv) return;
  auto head = [&](const char* kind) {
    Row r;
    r.set("kind", kind).set("variant", p.variant).set("compare", p.compare).set("design", p.design);
    r.config(p.config).set("producers", std::to_string(p.producers)).set("affinity", o_.affinity ? "1" : "0");
    return r;
  };
  for (const Point::Sample& s : p.samples)
    head("sample")
        .set("repeat", std::to_string(s.repeat))
        .set("iteration", std::to_string(s.iteration))
        .set("warmup", s.warmup ? "1" : "0")
        .set("hits_per_sec", num(s.hits_per_sec, "%.1f"))
        .write(out_);
  if (p.ok)
    head("summary")
        .set("mean_mps", num(p.result.mean))
        .set("stddev_mps", num(p.result.stddev))
        .set("median_mps", num(p.result.median))
        .set("per_cpu_mps", num(p.result.mean / p.producers))
        .set("samples", std::to_string(p.measured.size()))
        .write(out_);
  else
    head(p.skipped ? "skip" : "failed").set("note", p.note).write(out_);
  flush_data(out_);
}

void Recorder::add(const Ratio& r) {
  if (o_.format == Format::json) {
    ratios_.push_back(r);
    return;
  }
  if (o_.format != Format::csv) return;
  Row()
      .set("kind", "ratio")
      .set("variant", r.variant)
      .set("compare", r.compare)
      .set("producers", std::to_string(r.producers))
      .set("affinity", o_.affinity ? "1" : "0")
      .set("ratio", num(r.ratio))
      .set("note", "after/before of the medians: " + num(r.after_median) + " / " + num(r.before_median) + " M/s")
      .write(out_);
  flush_data(out_);
}

void Recorder::skip(const std::string& variant, const std::string& note) {
  if (o_.format == Format::json) {
    skips_.emplace_back(variant, note);
    return;
  }
  if (o_.format != Format::csv) return;
  Row().set("kind", "skip").set("variant", variant).set("note", note).write(out_);
  flush_data(out_);
}

void Recorder::finish() {
  if (o_.format != Format::json) {
    flush_data(out_);
    return;
  }
  std::string s = "{\n  \"meta\": {";
  bool first = true;
  for (const auto& [k, v] : run_meta(o_)) {
    s += std::string(first ? "\n    " : ",\n    ") + quoted(k) + ": " + quoted(v);
    first = false;
  }
  s += "\n  },\n  \"samples\": [";
  first = true;
  for (const Point& p : points_)
    for (const Point::Sample& x : p.samples) {
      s += std::string(first ? "\n    {" : ",\n    {") + json_head(p) + ", \"repeat\": " + std::to_string(x.repeat) +
           ", \"iteration\": " + std::to_string(x.iteration) + ", \"warmup\": " + (x.warmup ? "true" : "false") +
           ", \"hits_per_sec\": " + num(x.hits_per_sec, "%.1f") + "}";
      first = false;
    }
  s += "\n  ],\n  \"summaries\": [";
  first = true;
  for (const Point& p : points_) {
    s += std::string(first ? "\n    {" : ",\n    {") + json_head(p) + ", \"ok\": " + (p.ok ? "true" : "false");
    if (p.ok)
      s += ", \"mean_mps\": " + num(p.result.mean) + ", \"stddev_mps\": " + num(p.result.stddev) +
           ", \"median_mps\": " + num(p.result.median) + ", \"per_cpu_mps\": " + num(p.result.mean / p.producers) +
           ", \"samples\": " + std::to_string(p.measured.size());
    else
      s += ", \"note\": " + quoted(p.note);
    s += "}";
    first = false;
  }
  s += "\n  ],\n  \"ratios\": [";
  first = true;
  for (const Ratio& r : ratios_) {
    s += std::string(first ? "\n    {" : ",\n    {") + std::string("\"compare\": ") + quoted(r.compare) +
         ", \"variant\": " + quoted(r.variant) + ", \"producers\": " + std::to_string(r.producers) +
         ", \"before_median_mps\": " + num(r.before_median) + ", \"after_median_mps\": " + num(r.after_median) +
         ", \"ratio\": " + num(r.ratio) + "}";
    first = false;
  }
  s += "\n  ],\n  \"skipped\": [";
  first = true;
  for (const auto& [v, note] : skips_) {
    s += std::string(first ? "\n    {" : ",\n    {") + std::string("\"variant\": ") + quoted(v) + ", \"note\": " + quoted(note) +
         "}";
    first = false;
  }
  s += "\n  ]\n}\n";
  std::fputs(s.c_str(), out_);
  flush_data(out_);
}

}  // namespace bench
