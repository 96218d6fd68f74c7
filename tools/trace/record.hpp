// SPDX-License-Identifier: MIT
#pragma once
/// @file record.hpp
/// The per-process result file the agent writes (one per process, also one
/// before each exec) and the report the CLI merges from them and prints in
/// bpftrace's text format or as JSON.
///
/// Record file: UTF-8 lines of tab-separated fields:
///   uprobe-trace-record 1
///   process PID PPID EXE
///   spec SPEC N MESSAGE        N sites attached here; MESSAGE: why not (all or some)
///   mode MODE N                N sites attached in MODE (int3, optimized-nop5, pending)
///   key KEY                    an attached counter (uprobe:/uretprobe:/usdt: key)
///   hist KEY                   an attached latency histogram (key PATH:SYM)
///   count KEY TID N            hits by thread TID (N > 0)
///   bucket KEY TID INDEX N     histogram bucket INDEX of thread TID (N > 0)
///   end

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace uptrace {

/// Histogram buckets, numbered as bpftrace's hist(): 1 is [0], 2 is [1], k+2
/// is [2^k, 2^(k+1)); 0 (negative values) is never used.
inline constexpr unsigned kBuckets = 66;

/// The bucket of a non-negative value. Async-signal-safe.
inline unsigned hist_index(std::uint64_t v) noexcept {
  if (v == 0) return 1;
  return static_cast<unsigned>(63 - __builtin_clzll(v)) + 2;
}

struct SpecStatus {
  std::string spec;
  unsigned attached = 0;
  std::string message;
  unsigned failed = 0;  ///< sites refused (agent-side bookkeeping; not serialized)
};

struct ProcessRecord {
  long pid = 0, ppid = 0;
  std::string exe;
  bool complete = false;  ///< the `end` line was read
  std::vector<SpecStatus> specs;
  std::map<std::string, unsigned> modes;  ///< probe mode at attach (int3, optimized-nop5, pending) -> sites
  std::vector<std::string> keys, hist_keys;
  struct Count {
    std::string key;
    long tid;
    std::uint64_t n;
  };
  struct Bucket {
    std::string key;
    long tid;
    unsigned index;
    std::uint64_t n;
  };
  std::vector<Count> counts;
  std::vector<Bucket> buckets;
};

std::string serialize(const ProcessRecord& r);
/// nullopt when the text is not a record file.
std::optional<ProcessRecord> parse_record(std::string_view text);

struct Report {
  using Hist = std::array<std::uint64_t, kBuckets>;
  std::map<std::string, std::uint64_t> hits;                            ///< attached keys, summed
  std::map<std::string, Hist> hists;                                    ///< latency histograms (ns)
  std::map<std::tuple<std::string, long, long>, std::uint64_t> per_thread;  ///< (key, pid, tid)
  struct Proc {
    long pid, ppid;
    std::string exe;
    bool complete;
    std::map<std::string, unsigned> modes;
  };
  std::vector<Proc> processes;
  std::map<std::string, unsigned> spec_attached;  ///< spec -> sites attached, summed over processes
  struct Message {
    long pid;
    std::string exe, spec, text;
  };
  std::vector<Message> messages;  ///< why a spec did not attach (fully) in some process
  std::vector<Proc> lost;         ///< processes that started but never reported (_exit, fatal signal)

  void add(const ProcessRecord& r);
  /// Specs attached in no process.
  std::vector<std::string> unattached() const;
};

/// Text output lists attached probes without hits (`@hits[KEY]: 0`) only up
/// to this many; more (a glob over a library) are summarized in one line.
inline constexpr std::size_t kMaxZeroLines = 20;

/// bpftrace's text output: @hits[KEY]: N (ascending), @latency_ns[FN]: hist,
/// and with per_thread @hits_per_thread[KEY, PID, TID]: N.
std::string format_text(const Report& r, bool per_thread);
/// One JSON object with the same data.
std::string format_json(const Report& r, bool per_thread);
/// bpftrace's hist() rendering of one histogram.
std::string format_hist(const Report::Hist& h);

std::string json_escape(std::string_view s);

}  // namespace uptrace
