// SPDX-License-Identifier: MIT
#pragma once
/// @file record.hpp
/// What the agent writes about each image it attached in (one record file per
/// image: the program, and every program it execs), how the CLI combines
/// those with the counts file (counts.hpp) into per-process records, and the
/// report it prints from them in bpftrace's text format or as JSON.
///
/// Record file DIR/LAYOUT.rec, written once the image's probes are attached
/// (UTF-8 lines of tab-separated fields):
///   uprobe-trace-record 2
///   process PID PPID EXE
///   layout ID KEYS HISTS       its blocks in the counts file: KEYS counters, HISTS histograms
///   spec SPEC N MESSAGE        N sites attached here; MESSAGE: why not (all or some)
///   mode MODE N                N sites attached in MODE (int3, optimized-nop5, pending)
///   key KEY INDEX              an attached counter (uprobe:/uretprobe:/usdt: key): counter INDEX
///   hist KEY INDEX             an attached latency histogram (key PATH:SYM): histogram INDEX
///   note TEXT                  something the report should say about this process
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

/// One image's record file.
struct ImageRecord {
  std::uint64_t layout = 0;  ///< its id in the counts file (blocks' kBlockLayout word)
  long pid = 0, ppid = 0;
  std::string exe;
  std::size_t nkeys = 0, nhists = 0;  ///< block geometry: counters, histograms
  std::vector<SpecStatus> specs;
  std::map<std::string, unsigned> modes;  ///< probe mode at attach (int3, optimized-nop5, pending) -> sites
  unsigned elf_tables = 0;  ///< files whose ELF tables the agent took from the CLI (uprobe::import_elf_tables())
  std::vector<std::pair<std::string, std::size_t>> keys, hists;  ///< attached ones: name, index
  std::vector<std::string> notes;  ///< about the process (a rival DF_1_INITFIRST object)
  bool complete = false;  ///< the `end` line was read
};

/// The record file's text (format above). Not async-signal-safe (allocates).
/// Without `end`, the text stops before its `end` line (a writer appends
/// lines of its own, then "end\n").
std::string serialize(const ImageRecord& r, bool end = true);
/// One `key` or `hist` line (`kind`) of the record file, with its newline:
/// what serialize() writes for each of ImageRecord::keys and ::hists.
std::string serialize_entry(std::string_view kind, std::string_view key, std::size_t index);
/// nullopt when the text is not a record file.
std::optional<ImageRecord> parse_image(std::string_view text);

/// Words of a block (counts.hpp) of an image with `nkeys` counters and
/// `nhists` histograms.
std::size_t block_words(std::size_t nkeys, std::size_t nhists);

/// What one process counted: the image's record with the counts of its blocks.
struct ProcessRecord {
  long pid = 0, ppid = 0;
  std::string exe;
  std::vector<SpecStatus> specs;
  std::map<std::string, unsigned> modes;  ///< probe mode at attach (int3, optimized-nop5, pending) -> sites
  unsigned elf_tables = 0;                ///< ImageRecord::elf_tables
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
  std::vector<std::string> notes;
};

/// A process of image `img` with no counts yet.
ProcessRecord process_of(const ImageRecord& img, long pid, long ppid);
/// Adds the non-zero counters and buckets of one block (counts.hpp: `words`
/// words, the header's tid) of an image `img` process to `r`. A block whose
/// size does not match the image's geometry is ignored (false). Reads the
/// counters with relaxed atomic loads: the block may still be counting.
bool add_block(ProcessRecord& r, const ImageRecord& img, const std::uint64_t* block, std::size_t words);

struct Report {
  using Hist = std::array<std::uint64_t, kBuckets>;
  std::map<std::string, std::uint64_t> hits;                            ///< attached keys, summed
  std::map<std::string, Hist> hists;                                    ///< latency histograms (ns)
  std::map<std::tuple<std::string, long, long>, std::uint64_t> per_thread;  ///< (key, pid, tid)
  struct Proc {
    long pid, ppid;
    std::string exe;
    std::map<std::string, unsigned> modes;
    unsigned elf_tables = 0;
  };
  std::vector<Proc> processes;
  std::map<std::string, unsigned> spec_attached;  ///< spec -> sites attached, summed over processes
  struct Message {
    long pid;
    std::string exe, spec, text;
  };
  /// Why a spec did not attach (fully) in some process; with an empty spec,
  /// a note about the process.
  std::vector<Message> messages;
  std::uint64_t unrecorded = 0;   ///< hits that no counting block could take (counts.hpp)
  std::uint64_t missed = 0;       ///< probe hits not run: inside another hit (counts.hpp)

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
