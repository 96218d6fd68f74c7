// SPDX-License-Identifier: MIT
// check_neighbours() and the neighbour index it keeps per ELF image.
#include "neighbours.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "format.hpp"
#include "fork_fresh.hpp"
#include "thread_object.hpp"

namespace uprobe::detail {

/// An ELF image's neighbour index: per function of the image (by position
/// in ElfImage::funcs), the targets of its direct branches and rip-relative
/// leas (arch::neighbour_branch_targets()), [begin, end) of `targets`. An entry
/// is all zero until swept (`ix` is fresh anonymous memory: only the pages
/// of the entries swept are ever touched).
struct NeighbourCache {
  struct Entry {
    std::uint32_t begin = 0, end = 0;
    enum : std::uint8_t { unswept, whole, undecodable } state = unswept;
  };
  std::mutex mu;  ///< held while a check reads or sweeps
  std::uint64_t image = 0;  ///< the ElfImage::serial it indexes
  std::size_t nfuncs = 0;
  Entry* ix = nullptr;  ///< nfuncs entries (mmap), or nullptr: no index
  std::vector<std::int32_t> targets;
  explicit NeighbourCache(const ElfImage& img) : image(img.serial), nfuncs(img.funcs.size()) {
    void* p = ::mmap(nullptr, std::max<std::size_t>(nfuncs, 1) * sizeof(Entry), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) ix = static_cast<Entry*>(p);
  }
  ~NeighbourCache() {
    if (ix) ::munmap(ix, std::max<std::size_t>(nfuncs, 1) * sizeof(Entry));
  }
  bool indexes(const ElfImage& img) const { return image == img.serial && nfuncs == img.funcs.size(); }
};

void release_neighbour_cache(NeighbourCache* own) noexcept { delete own; }

namespace {

/// How far around a function entry its neighbours are searched for a
/// branch into the entry's window: hand-written assembly shares labels
/// between adjacent functions of one source file.
constexpr std::uint64_t kNeighbourReach = 4096;


/// The kept neighbour indexes (fork_fresh(); never freed: a target in
/// flight may hold one).
struct NeighbourTable {
  std::mutex mu;
  std::vector<NeighbourCache*> caches;
};

/// The neighbour index of `info` (the image of `t`'s file): kept per image
/// (ElfImage::serial: the content read, so never that of a file since
/// rewritten in place) for the process's life, for up to 32 images
/// (beyond, the target's own, for this transaction); found once per target.
NeighbourCache& neighbour_cache(const Target& t, const ElfImage& info) {
  if (t.neighbour_cache && t.neighbour_cache->indexes(info)) return *t.neighbour_cache;
  NeighbourTable& table = fork_fresh<NeighbourTable>();
  std::lock_guard<std::mutex> lock(table.mu);
  for (NeighbourCache* c : table.caches)
    if (c->indexes(info)) return *(t.neighbour_cache = c);
  if (table.caches.size() < 32) {
    table.caches.push_back(new NeighbourCache(info));
    return *(t.neighbour_cache = table.caches.back());
  }
  delete t.own_neighbour_cache;
  t.own_neighbour_cache = new NeighbourCache(info);
  return *(t.neighbour_cache = t.own_neighbour_cache);
}

}  // namespace

// (neighbours.hpp)
bool check_neighbours(const Target& t, const ElfImage& info, const FuncSym& fn, const LoadSegment& seg,
                      std::uint64_t site, std::size_t len, std::string& why) {
  const std::uint64_t entry = fn.file_offset;
  const std::uint64_t seg_end = seg.offset + seg.filesz;
  const std::uint64_t lo = std::max(seg.offset, entry - std::min(entry, kNeighbourReach));
  const std::uint64_t fn_end = fn.size > seg_end - entry ? seg_end : entry + fn.size;
  const std::uint64_t hi = std::min(seg_end, fn_end + kNeighbourReach);
  const auto& funcs = info.funcs;
  auto first = std::lower_bound(funcs.begin(), funcs.end(), lo,
                                [](const FuncSym& f, std::uint64_t o) { return f.file_offset < o; });
  // Back to the functions that start before lo and reach into it.
  for (int steps = 0; first != funcs.begin() && steps < 64; ++steps) {
    if (info.reach[static_cast<std::size_t>(first - funcs.begin()) - 1] <= lo) break;
    --first;
  }
  // The neighbourhood, from the first neighbour's start (one that starts
  // more than kMaxLead before lo is swept from lo's side only by the
  // others: its own sweep would read too much), read at most once.
  constexpr std::uint64_t kMaxLead = 64u << 10;
  std::uint64_t from = lo;
  for (auto it = first; it != funcs.end() && it->file_offset < lo; ++it)
    if (it->file_offset >= seg.offset && lo - it->file_offset <= kMaxLead) from = std::min(from, it->file_offset);
  // (A batch reads ~10 KB per entry: a view of its window of the file, not
  // a copy.)
  struct Scratch {
    std::vector<std::uint8_t> bytes;
  };
  std::vector<std::uint8_t>& scratch = thread_object<Scratch>().bytes;  // (no dynamic-linker lock: thread_object.hpp)
  const auto want = static_cast<std::size_t>(hi - from);
  std::span<const std::uint8_t> code;
  bool read = false;
  const auto bytes = [&]() -> std::span<const std::uint8_t> {
    if (!read) code = view_code(t, from, want, scratch), read = true;
    return code;
  };
  NeighbourCache& nc = neighbour_cache(t, info);
  std::lock_guard<std::mutex> lock(nc.mu);
  const FuncSym* passed = nullptr;  // the last neighbour found not to branch into the window
  for (auto it = first; it != funcs.end() && it->file_offset < hi; ++it) {
    const FuncSym& f = *it;
    if (f.file_offset < from || f.file_offset >= seg_end) continue;
    if (f.file_offset == entry && f.size == fn.size) continue;  // fn itself, or an alias of it
    // An alias of the neighbour just cleared (funcs is sorted by bounds: the
    // same bytes, the same answer; libc has 9,642 entries and ~3,700 distinct bounds).
    if (passed && f.file_offset == passed->file_offset && f.size == passed->size) continue;
    const std::uint64_t at = f.file_offset - from;
    const auto win = static_cast<std::int64_t>(site - f.file_offset);
    // Through the index: a neighbour that lies whole in the neighbourhood.
    if (nc.ix && f.size <= hi - f.file_offset && win > INT32_MIN / 2 && win < INT32_MAX / 2) {
      const auto i = static_cast<std::size_t>(it - funcs.begin());
      NeighbourCache::Entry& ni = nc.ix[i];
      if (ni.state == NeighbourCache::Entry::unswept) {
        // An alias with the same bounds may have been swept (they are adjacent in funcs).
        for (std::size_t j = i; j > 0 && funcs[j - 1].file_offset == f.file_offset && funcs[j - 1].size == f.size; --j)
          if (nc.ix[j - 1].state != NeighbourCache::Entry::unswept) {
            ni = nc.ix[j - 1];
            break;
          }
      }
      if (ni.state == NeighbourCache::Entry::unswept && at < bytes().size() && code.size() - at >= f.size) {
        const auto begin = static_cast<std::uint32_t>(nc.targets.size());
        const bool whole = arch::neighbour_branch_targets(code.data() + at, f.size, nc.targets);
        ni.begin = begin;
        ni.end = static_cast<std::uint32_t>(nc.targets.size());
        ni.state = whole ? NeighbourCache::Entry::whole : NeighbourCache::Entry::undecodable;
      }
      if (ni.state == NeighbourCache::Entry::whole) {
        const auto b = nc.targets.begin() + ni.begin, e = nc.targets.begin() + ni.end;
        const auto next = std::upper_bound(b, e, static_cast<std::int32_t>(win));
        if (next == e || *next >= win + static_cast<std::int64_t>(len)) {
          passed = &f;
          continue;
        }
      }
    }
    if (at >= bytes().size()) continue;
    // Its bytes up to hi: a branch further on is beyond the neighbourhood.
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(f.size, code.size() - at));
    if (!arch::check_neighbour_branches(code.data() + at, n, win, len, why)) {
      why = "a neighbour, " + f.display_name() + " (file offset " + hex(f.file_offset) + ", bounds from " +
            bounds_source_name(f.source) + "): " + why;
      return false;
    }
    passed = &f;
  }
  return true;
}

}  // namespace uprobe::detail
