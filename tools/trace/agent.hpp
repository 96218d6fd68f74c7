// SPDX-License-Identifier: MIT
// libuprobe-agent.so's parts, what they share (internal to the agent):
//   agent.cpp         its initializers (the first one, the constructor that
//                     attaches, the destructor), the counting memory's set-up,
//                     fork and exit handling, the image's record file;
//   agent_attach.cpp  the specs resolved in this process and every site
//                     registered in one transaction (attach());
//   agent_hit.cpp     what runs at a hit: the consumers, the thread's block of
//                     the counts file, a bpftrace program's probe blocks.
// agent.cpp's header comment says how the agent works.

#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

#include <uprobe/uprobe.hpp>
#include <uprobe/usdt.hpp>

#include "counts.hpp"
#include "record.hpp"

// The bpftrace interpreter (bt_vm.hpp), which runs at hits: general
// registers only, string operations inline, no loop made into a libc call
// (agent_hit.cpp says why).
#pragma GCC push_options
#pragma GCC target("general-regs-only,inline-all-stringops")
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#include "bt_vm.hpp"
#pragma GCC pop_options

namespace uptrace::agent {

/// libc's own getenv(), unsetenv() and setenv() (agent.cpp says why not the
/// program's).
const char* libc_getenv(const char* name);
int libc_unsetenv(const char* name);
int libc_setenv(const char* name, const char* value, int overwrite);

constexpr unsigned kMaxBlocks = 4096;  // per process; more threads share its overflow block
constexpr std::uint64_t kEpochBusy = ~std::uint64_t{0};

// ---------------------------------------------------------------- handler-side state

/// This process's own page (MADV_WIPEONFORK: a fork child sees 0).
struct alignas(counts::kPage) ProcessLocal {
  /// Nonzero while the process state in Counters (pid, blocks, overflow)
  /// is this process's; a thread whose tls_epoch differs has no block here.
  std::atomic<std::uint64_t> epoch{0};
};

struct Counters {
  std::atomic<bool> enabled{false};
  std::size_t nkeys = 0, nhists = 0;
  std::size_t hist_base = 0;    // first histogram word
  std::size_t block_words = 0;  // header + counts + histograms
  std::size_t block_bytes = 0;  // rounded up to pages
  // The counts file (nullptr without the CLI: private blocks).
  counts::Header* header = nullptr;
  char path[PATH_MAX] = {};
  std::uint64_t layout = 0;
  bool wipe_on_fork = false;  // MADV_WIPEONFORK took on `local`
  ProcessLocal* local = nullptr;
  // This process's (reset in a fork child, see reinit_process).
  pid_t pid = 0;
  std::uint64_t last_epoch = 0;
  std::atomic<unsigned> nblocks{0};
  std::atomic<std::uint64_t*> blocks[kMaxBlocks];  // without the CLI: what the report reads
  std::atomic<std::uint64_t*> overflow{nullptr};   // shared by threads past kMaxBlocks: atomic adds
  // A bpftrace program (bt_vm.hpp): its area in each block starts at word bt_area (0: no program).
  bt::Program bt;
  std::size_t bt_area = 0;
};

/// The handler-side state (make_counters()): published before counting is
/// enabled; never freed.
extern Counters* g;

/// The agent's own work while probes are attached (setting up, making a
/// block, a fork child's set-up) runs with this thread's depth raised: nothing
/// it calls (getppid, open, malloc, free, ...) is counted. tls_exit_dtors
/// covers libuprobe's thread_local destructors at exit() (see ExitDtorGuard).
extern __attribute__((tls_model("initial-exec"))) thread_local int tls_in_agent;
extern __attribute__((tls_model("initial-exec"))) thread_local bool tls_exit_dtors;

/// Marks the calling thread as running the agent's own code (nestable).
struct Scope {
  Scope() noexcept { ++tls_in_agent; }
  ~Scope() { --tls_in_agent; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

/// Registers this process in the counts file's process table (with the CLI).
void register_process(pid_t pid, pid_t ppid) noexcept;
/// A fork child's first point as a process of its own: its parent's blocks
/// forgotten, itself registered; returns its epoch (0 when another thread is
/// doing it). Async-signal-safe.
std::uint64_t reinit_process() noexcept;
/// The calling thread's block when it has none in this process yet (made
/// now); nullptr when none can be made. Async-signal-safe.
std::uint64_t* new_block() noexcept;
/// libuprobe's RecursionMissHook while counting: a probe hit not run (its
/// thread was inside another hit: a signal handler that interrupted one),
/// counted in the counts file's header for the CLI's warning.
/// Async-signal-safe.
void missed_hit(const uprobe::Uprobe* probe) noexcept;

/// One probe block of a bpftrace program at one site: its index and the
/// `probe` and `func` strings of the site (never freed), and the block as a
/// bt::FastAgg when it is one (run without the interpreter).
struct BtHit {
  std::uint32_t probe;
  const char* probe_name;
  const char* func;
  bt::FastAgg fast{};
};

/// A function site: entry counts, return counts, a latency histogram (any of
/// them), the probe blocks of a bpftrace program. Several specs may name one
/// site (aliases, a glob and a name): each has its own key, all counted.
/// Its handlers (agent_hit.cpp) run at hits.
class FnConsumer final : public uprobe::Consumer {
 public:
  /// `entry_frame`: the site's instruction sets up the frame (`push %rbp`;
  /// `endbr64` on a kernel built with IBT):
  /// ustack there reads the caller's return address at the stack pointer
  /// (bt::HitContext::entry_sp), as the kernel's walker.
  FnConsumer(uprobe::Callbacks cb, std::vector<long> entries, std::vector<long> rets, long hist,
             std::vector<BtHit> bt_entries, std::vector<BtHit> bt_rets, bool entry_frame);
  uprobe::Action handler(uprobe::Regs& regs) override;
  void ret_handler(uprobe::Regs& regs, std::uint64_t) override;

  /// Hits taken while the agent was attaching (the site is on the path of
  /// registration itself): shown with UPROBE_TRACE_DEBUG=1.
  unsigned setup_hits() const noexcept { return setup_hits_.load(std::memory_order_relaxed); }
  bool entry_frame() const noexcept { return entry_frame_; }

 private:
  void setup_hit() noexcept { setup_hits_.fetch_add(1, std::memory_order_relaxed); }

  const std::vector<long> entries_, rets_;  // read-only once registered
  const long hist_;
  const std::vector<BtHit> bt_entries_, bt_rets_;
  const bool entry_frame_;
  std::atomic<unsigned> setup_hits_{0};
};

/// A USDT site: a count (the key is its probe's, shared by its sites), the
/// probe blocks of a bpftrace program with the site's arguments.
class CountConsumer final : public uprobe::Consumer {
 public:
  CountConsumer(long key, std::vector<BtHit> bt, const uprobe::usdt::ArgSpec& args);
  uprobe::Action handler(uprobe::Regs& regs) override;

 private:
  long key_;
  const std::vector<BtHit> bt_;
  const uprobe::usdt::ArgSpec args_;  // the site's (fixed size: no heap)
};

// ---------------------------------------------------------------- set-up (not signal context)

struct Meta {
  std::string out_dir;   // "" : report to stderr
  std::string format = "text";
  bool per_thread = false;
  std::vector<std::string> keys, hist_keys;
  std::vector<SpecStatus> specs;
  std::map<std::string, unsigned> modes;  // probe_info().mode at attach -> sites
  unsigned elf_tables = 0;                // files whose ELF tables came from the CLI (kElfTablesFile)
  std::vector<std::string> notes;
};
/// What this image attached and how (never freed: other threads may still
/// hit probes while the process exits).
extern Meta* meta;

/// The bpftrace program (UPROBE_TRACE_PROGRAM: the CLI's compiled blob),
/// read once by load_bt_program(); never freed. Null without one.
extern std::vector<unsigned char>* g_bt_blob;
extern bt::Program g_bt;
void load_bt_program(const char* path);

/// Sets a spec's message unless it has one.
void add_message(SpecStatus& s, const std::string& m);
/// The handler-side state for meta's keys, published in g (counting stays
/// off until setup_counting() is done).
void make_counters();
/// Resolves the specs `texts` (UPROBE_TRACE_SPECS' lines) in this process and
/// registers every site in one transaction; what happened goes to meta.
void attach(const std::vector<std::string>& texts);
/// The record's key and hist lines, made before the probes are in (agent.cpp).
void prepare_record_lines();

}  // namespace uptrace::agent
