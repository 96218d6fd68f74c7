// SPDX-License-Identifier: MIT
#include "record.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <set>

#include "counts.hpp"
#include "spec.hpp"

namespace uptrace {
namespace {

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  for (;;) {
    auto p = line.find('\t');
    out.push_back(line.substr(0, p));
    if (p == std::string_view::npos) break;
    line.remove_prefix(p + 1);
  }
  return out;
}

template <typename T>
bool num(std::string_view s, T& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string clean(std::string_view s) {  // no tabs or newlines inside a field
  std::string out(s);
  for (char& c : out)
    if (c == '\t' || c == '\n') c = ' ';
  return out;
}

// bpftrace's hist_index_label().
std::string index_label(unsigned power) {
  const char* suffix = "";
  if (power >= 60) suffix = "E", power -= 60;
  else if (power >= 50) suffix = "P", power -= 50;
  else if (power >= 40) suffix = "T", power -= 40;
  else if (power >= 30) suffix = "G", power -= 30;
  else if (power >= 20) suffix = "M", power -= 20;
  else if (power >= 10) suffix = "K", power -= 10;
  return std::to_string(1ull << power) + suffix;
}

std::vector<std::pair<std::string, std::uint64_t>> sorted_hits(const Report& r) {
  std::vector<std::pair<std::string, std::uint64_t>> v(r.hits.begin(), r.hits.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return v;
}

}  // namespace

std::string serialize_entry(std::string_view kind, std::string_view key, std::size_t index) {
  // One allocation (the agent makes one per key: 3,661 for `uprobe:libc:*`).
  char num[24];
  const int n = std::snprintf(num, sizeof num, "%zu", index);
  std::string s;
  s.reserve(kind.size() + key.size() + static_cast<std::size_t>(n) + 3);
  s.append(kind);
  s += '\t';
  const std::size_t at = s.size();
  s.append(key);
  for (std::size_t i = at; i < s.size(); ++i)  // as clean(): no tab or newline inside a field
    if (s[i] == '\t' || s[i] == '\n') s[i] = ' ';
  s += '\t';
  s.append(num, static_cast<std::size_t>(n));
  s += '\n';
  return s;
}

std::string serialize(const ImageRecord& r, bool end) {
  std::string s = "uprobe-trace-record 2\n";
  s += "process\t" + std::to_string(r.pid) + "\t" + std::to_string(r.ppid) + "\t" + clean(r.exe) + "\n";
  s += "layout\t" + std::to_string(r.layout) + "\t" + std::to_string(r.nkeys) + "\t" + std::to_string(r.nhists) +
       "\n";
  for (const auto& sp : r.specs)
    s += "spec\t" + clean(sp.spec) + "\t" + std::to_string(sp.attached) + "\t" + clean(sp.message) + "\n";
  for (const auto& [m, n] : r.modes) s += "mode\t" + clean(m) + "\t" + std::to_string(n) + "\n";
  if (r.elf_tables) s += "tables\t" + std::to_string(r.elf_tables) + "\n";
  for (const auto& [k, i] : r.keys) s += serialize_entry("key", k, i);
  for (const auto& [k, i] : r.hists) s += serialize_entry("hist", k, i);
  for (const auto& n : r.notes) s += "note\t" + clean(n) + "\n";
  if (end) s += "end\n";
  return s;
}

std::optional<ImageRecord> parse_image(std::string_view text) {
  ImageRecord r;
  bool header = false;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (!header) {
      if (line != "uprobe-trace-record 2") return std::nullopt;
      header = true;
      continue;
    }
    auto f = fields(line);
    if (f[0] == "process" && f.size() == 4) {
      num(f[1], r.pid), num(f[2], r.ppid);
      r.exe = std::string(f[3]);
    } else if (f[0] == "layout" && f.size() == 4) {
      num(f[1], r.layout), num(f[2], r.nkeys), num(f[3], r.nhists);
    } else if (f[0] == "spec" && f.size() == 4) {
      SpecStatus s{std::string(f[1]), 0, std::string(f[3])};
      num(f[2], s.attached);
      r.specs.push_back(std::move(s));
    } else if (f[0] == "mode" && f.size() == 3) {
      unsigned n = 0;
      if (num(f[2], n)) r.modes[std::string(f[1])] += n;
    } else if (f[0] == "tables" && f.size() == 2) {
      num(f[1], r.elf_tables);
    } else if ((f[0] == "key" || f[0] == "hist") && f.size() == 3) {
      std::size_t i = 0;
      if (num(f[2], i)) (f[0] == "key" ? r.keys : r.hists).emplace_back(std::string(f[1]), i);
    } else if (f[0] == "note" && f.size() == 2) {
      r.notes.emplace_back(f[1]);
    } else if (f[0] == "end") {
      r.complete = true;
    }
  }
  if (!header) return std::nullopt;
  // Indexes outside the geometry would read past a block: drop them.
  std::erase_if(r.keys, [&](const auto& k) { return k.second >= r.nkeys; });
  std::erase_if(r.hists, [&](const auto& k) { return k.second >= r.nhists; });
  return r;
}

std::size_t block_words(std::size_t nkeys, std::size_t nhists) {
  return counts::kHeaderWords + nkeys + nhists * kBuckets;
}

ProcessRecord process_of(const ImageRecord& img, long pid, long ppid) {
  ProcessRecord r;
  r.pid = pid, r.ppid = ppid;
  r.exe = img.exe;
  r.specs = img.specs;
  r.modes = img.modes;
  r.elf_tables = img.elf_tables;
  for (const auto& [k, i] : img.keys) r.keys.push_back(k);
  for (const auto& [k, i] : img.hists) r.hist_keys.push_back(k);
  r.notes = img.notes;
  return r;
}

bool add_block(ProcessRecord& r, const ImageRecord& img, const std::uint64_t* b, std::size_t words) {
  if (words != block_words(img.nkeys, img.nhists)) return false;
  const long tid = static_cast<long>(static_cast<std::int64_t>(b[counts::kBlockTid]));
  for (const auto& [k, i] : img.keys)
    if (std::uint64_t n = __atomic_load_n(&b[counts::kHeaderWords + i], __ATOMIC_RELAXED))
      r.counts.push_back({k, tid, n});
  const std::size_t hist_base = counts::kHeaderWords + img.nkeys;
  for (const auto& [k, h] : img.hists)
    for (unsigned j = 0; j < kBuckets; ++j)
      if (std::uint64_t n = __atomic_load_n(&b[hist_base + h * kBuckets + j], __ATOMIC_RELAXED))
        r.buckets.push_back({k, tid, j, n});
  return true;
}

void Report::add(const ProcessRecord& r) {
  processes.push_back({r.pid, r.ppid, r.exe, r.modes, r.elf_tables});
  for (const auto& s : r.specs) {
    spec_attached[s.spec] += s.attached;
    if (!s.message.empty()) messages.push_back({r.pid, r.exe, s.spec, s.message});
  }
  for (const auto& n : r.notes) messages.push_back({r.pid, r.exe, "", n});
  for (const auto& k : r.keys) hits.try_emplace(k, 0);
  for (const auto& k : r.hist_keys) hists.try_emplace(k, Hist{});
  for (const auto& c : r.counts) {
    hits[c.key] += c.n;
    per_thread[{c.key, r.pid, c.tid}] += c.n;
  }
  for (const auto& b : r.buckets) {
    auto [it, fresh] = hists.try_emplace(b.key, Hist{});
    (void)fresh;
    it->second[b.index] += b.n;
  }
}

std::vector<std::string> Report::unattached() const {
  std::vector<std::string> out;
  for (const auto& [spec, n] : spec_attached)
    if (n == 0) out.push_back(spec);
  return out;
}

std::string format_hist(const Report::Hist& h) {
  int lo = -1, hi = -1;
  std::uint64_t max = 0;
  for (unsigned i = 0; i < kBuckets; ++i) {
    if (h[i] == 0) continue;
    if (lo < 0) lo = static_cast<int>(i);
    hi = static_cast<int>(i);
    max = std::max(max, h[i]);
  }
  std::string out;
  if (lo < 0) return out;
  for (int i = lo; i <= hi; ++i) {
    std::string head;
    if (i == 0) head = "(..., 0)";
    else if (i == 1) head = "[0]";
    else if (i == 2) head = "[1]";
    else head = "[" + index_label(i - 2) + ", " + index_label(i - 1) + ")";
    const int width = 52;
    int bar = static_cast<int>(static_cast<double>(h[i]) / static_cast<double>(max) * width);
    char line[256];
    std::snprintf(line, sizeof line, "%-16s%8llu |%-*s|\n", head.c_str(), static_cast<unsigned long long>(h[i]),
                  width, std::string(static_cast<std::size_t>(bar), '@').c_str());
    out += line;
  }
  return out;
}

std::string format_text(const Report& r, bool per_thread) {
  std::string out;
  const auto sorted = sorted_hits(r);
  const std::size_t zeros = static_cast<std::size_t>(
      std::count_if(sorted.begin(), sorted.end(), [](const auto& kv) { return kv.second == 0; }));
  if (zeros > kMaxZeroLines)
    out += "@hits: " + std::to_string(zeros) + " of " + std::to_string(sorted.size()) +
           " probes attached had no hits (--format json lists them)\n";
  for (const auto& [k, n] : sorted)
    if (n != 0 || zeros <= kMaxZeroLines) out += "@hits[" + k + "]: " + std::to_string(n) + "\n";
  for (const auto& [k, h] : r.hists) {
    out += "\n@latency_ns[" + k + "]:\n";
    out += format_hist(h);
  }
  if (per_thread && !r.per_thread.empty()) {
    out += "\n";
    for (const auto& [k, n] : r.per_thread)
      out += "@hits_per_thread[" + std::get<0>(k) + ", " + std::to_string(std::get<1>(k)) + ", " +
             std::to_string(std::get<2>(k)) + "]: " + std::to_string(n) + "\n";
  }
  return out;
}

std::string json_escape(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string format_json(const Report& r, bool per_thread) {
  std::string out = "{\n  \"hits\": {";
  bool first = true;
  for (const auto& [k, n] : sorted_hits(r)) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    out += json_escape(k) + ": " + std::to_string(n);
  }
  out += first ? "},\n" : "\n  },\n";
  out += "  \"latency_ns\": {";
  first = true;
  for (const auto& [k, h] : r.hists) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    out += json_escape(k) + ": [";
    bool fb = true;
    for (unsigned i = 1; i < kBuckets; ++i) {
      if (h[i] == 0) continue;
      std::uint64_t lo = i == 1 ? 0 : 1ull << (i - 2);
      std::uint64_t hi = i == 1 ? 0 : (i - 2 >= 63 ? ~0ull : (1ull << (i - 1)) - 1);
      out += fb ? "" : ", ";
      fb = false;
      out += "{\"min\": " + std::to_string(lo) + ", \"max\": " + std::to_string(hi) +
             ", \"count\": " + std::to_string(h[i]) + "}";
    }
    out += "]";
  }
  out += first ? "},\n" : "\n  },\n";
  if (per_thread) {
    out += "  \"per_thread\": [";
    first = true;
    for (const auto& [k, n] : r.per_thread) {
      out += first ? "\n    " : ",\n    ";
      first = false;
      out += "{\"probe\": " + json_escape(std::get<0>(k)) + ", \"pid\": " + std::to_string(std::get<1>(k)) +
             ", \"tid\": " + std::to_string(std::get<2>(k)) + ", \"count\": " + std::to_string(n) + "}";
    }
    out += first ? "],\n" : "\n  ],\n";
  }
  out += "  \"processes\": [";
  first = true;
  for (const auto& p : r.processes) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    std::string modes;
    for (const auto& [m, n] : p.modes) modes += (modes.empty() ? "" : ", ") + json_escape(m) + ": " + std::to_string(n);
    out += "{\"pid\": " + std::to_string(p.pid) + ", \"ppid\": " + std::to_string(p.ppid) +
           ", \"exe\": " + json_escape(p.exe) + ", \"sites\": {" + modes + "}}";
  }
  out += first ? "],\n" : "\n  ],\n";
  out += "  \"specs\": {";
  first = true;
  for (const auto& [s, n] : r.spec_attached) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    out += json_escape(s) + ": {\"sites_attached\": " + std::to_string(n) + "}";
  }
  out += first ? "},\n" : "\n  },\n";
  out += "  \"unrecorded_hits\": " + std::to_string(r.unrecorded) + ",\n";
  out += "  \"missed_hits\": " + std::to_string(r.missed) + ",\n";
  out += "  \"messages\": [";
  first = true;
  for (const auto& m : r.messages) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    out += "{\"pid\": " + std::to_string(m.pid) + ", \"exe\": " + json_escape(m.exe) +
           ", \"spec\": " + json_escape(m.spec) + ", \"message\": " + json_escape(m.text) + "}";
  }
  out += first ? "]\n" : "\n  ]\n";
  out += "}\n";
  return out;
}

}  // namespace uptrace
