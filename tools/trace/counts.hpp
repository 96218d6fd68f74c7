// SPDX-License-Identifier: MIT
#pragma once
/// @file counts.hpp
/// The counts file: DIR/counts in uprobe-trace's private directory. The CLI
/// creates it; every traced process maps it (MAP_SHARED) and its threads
/// count in their own blocks there, so the counts outlive the process: the
/// CLI reads them after the process is gone, however it ended (exit,
/// _exit, exec, a fatal signal, SIGKILL), or while it still runs (a second
/// Ctrl-C). Internal to uprobe-trace (CLI and agent of one build).
///
/// Layout: a Header (kHeaderPages pages, sparse), then blocks, each a whole
/// number of pages at a page offset handed out by Header::next_page. A block
/// starts with kHeaderWords words (BlockWord) and holds one counter word per
/// key of its image's layout, then kBuckets words per latency histogram; its
/// image's record file (DIR/LAYOUT.rec, record.hpp) names the keys.
///
/// Only the process that owns a block writes it (plain stores by its
/// thread, or atomic adds in the process's shared overflow block); the header
/// is written only when a block, a process or a layout is added (atomic
/// fetch_add, then the entry, then a release store that publishes it).
/// std::atomic<std::uint64_t> is lock-free and address-free on x86-64, so it
/// works across processes that map the same file.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace uptrace::counts {

/// The counts file's name in the directory UPROBE_TRACE_OUT names.
inline constexpr char kFileName[] = "counts";

inline constexpr std::uint64_t kMagic = 0x31746e756f637075ull;       ///< "upcount1"
inline constexpr std::uint64_t kBlockMagic = 0x316b636f6c627075ull;  ///< "upblock1", written last
inline constexpr std::size_t kPage = 4096;                           ///< x86-64's page size

/// Blocks over the whole trace (every thread of every process that hit a
/// probe, plus one overflow block per process with more than the agent's
/// per-process block limit): 8 MiB of slot words.
inline constexpr std::size_t kMaxSlots = std::size_t{1} << 20;
/// Processes (images and fork children) over the whole trace: 8 MiB.
inline constexpr std::size_t kMaxProcs = std::size_t{1} << 18;

/// Words of a block before its counters (one cache line).
inline constexpr std::size_t kHeaderWords = 8;
enum BlockWord : std::size_t {
  kBlockMagicWord = 0,  ///< kBlockMagic once the rest is written
  kBlockPid = 1,        ///< the process that counts here
  kBlockTid = 2,        ///< its thread, or -1 (as int64) for the shared overflow block
  kBlockLayout = 3,     ///< the image's layout id (its record file)
  kBlockWords = 4,      ///< words in the block (kHeaderWords + keys + histograms * kBuckets)
  kBlockShared = 5,     ///< 1: several threads add here atomically
  kBlockBt = 6,         ///< words from the block's start to its bpftrace-program area (bt_vm.hpp), 0: none
};

/// One process: an image that loaded the agent (after every exec too) or a
/// fork child of one (same layout as its parent).
struct Proc {
  std::atomic<std::uint64_t> ready;  ///< 1 once the other fields are written
  std::int64_t pid;
  std::int64_t ppid;
  std::uint64_t layout;
};
static_assert(sizeof(Proc) == 32);

struct Header {
  std::uint64_t magic;      ///< kMagic (written by the CLI)
  std::uint64_t page_size;  ///< kPage
  alignas(64) std::atomic<std::uint64_t> next_page;  ///< first free page (starts at kHeaderPages)
  alignas(64) std::atomic<std::uint64_t> nslots;     ///< slots handed out (may exceed kMaxSlots: full)
  alignas(64) std::atomic<std::uint64_t> nprocs;     ///< procs handed out (may exceed kMaxProcs: full)
  alignas(64) std::atomic<std::uint64_t> nlayouts;   ///< layout ids handed out (ids start at 1)
  /// Hits no block could take (the counts file could not be opened or
  /// extended in that process, the tables were full): counted here so that
  /// the CLI can say how many hits are missing from the report.
  alignas(64) std::atomic<std::uint64_t> unrecorded;
  /// Probe hits libuprobe did not run because their thread was inside
  /// another hit (a signal handler of the program that interrupted one:
  /// uprobe::RecursionMissHook), which the kernel's uprobes would have run:
  /// counted here so that the CLI can say how many are missing.
  alignas(64) std::atomic<std::uint64_t> missed;
  /// A bpftrace program's exit() was called (1): no probe runs its actions any more.
  alignas(64) std::atomic<std::uint64_t> bt_exit;
  /// CLOCK_MONOTONIC when the CLI started (ns): the program's `elapsed`.
  std::uint64_t bt_start_ns;
  /// Block i: (first page << 24) | pages; 0 while not (or never) published.
  alignas(64) std::atomic<std::uint64_t> slots[kMaxSlots];
  Proc procs[kMaxProcs];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

inline constexpr std::size_t kHeaderPages = (sizeof(Header) + kPage - 1) / kPage;
inline constexpr std::size_t kHeaderBytes = kHeaderPages * kPage;

inline constexpr std::uint64_t slot_word(std::uint64_t first_page, std::uint64_t pages) {
  return first_page << 24 | pages;
}
inline constexpr std::uint64_t slot_first_page(std::uint64_t w) { return w >> 24; }
inline constexpr std::uint64_t slot_pages(std::uint64_t w) { return w & 0xffffff; }

}  // namespace uptrace::counts
