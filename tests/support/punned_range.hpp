// SPDX-License-Identifier: MIT
#pragma once
/// @file punned_range.hpp
/// Where ASLR may decide a punned jump's form: the pages a punned jump
/// (E9Patch's B2; after `pad` redundant prefixes, T1) may put its hop on
/// are fixed by the bytes after the probed instruction, often within 1 GiB
/// after the executable, where the kernel puts the heap at a random place.
/// A test that expects one form accepts another only where these say the
/// expected form's pages are all mapped now; a test that takes pages on
/// purpose accepts those already mapped (taken either way). No GoogleTest.

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "proc_text.hpp"

namespace uprobe_test {

/// Whether the page at `p` is mapped now (/proc/self/maps).
inline bool page_mapped(std::uint64_t p) {
  for (const MapLine& m : read_maps())
    if (m.start <= p && p < m.end) return true;
  return false;
}

/// Whether the punned jump with `pad` prefixes of the instruction of `len`
/// bytes at `site` has no page for its hop here: every page the library
/// would try for it is mapped now. `bytes` holds the original bytes from
/// the site on (at least pad + 5). The jump's rel32 is bytes pad + 1 ..
/// pad + 4: the instruction's own (free), then the following ones (fixed),
/// so its targets are [site + pad + 5 + fixed, + 2^(8 * (len - 1 - pad))),
/// clipped to user space; the hop needs 5 bytes within one page, and the
/// library tries the first 16 such pages of the range (XolArea::hop_in()).
/// Else false with `err` saying which page is free.
inline bool punned_range_taken(std::uint64_t site, std::size_t len, std::size_t pad, const std::uint8_t* bytes,
                               std::string& err) {
  if (len == 0 || len >= 5 || pad >= len) {
    err = "an instruction of " + std::to_string(len) + " bytes has no punned jump with " + std::to_string(pad) +
          " prefixes";
    return false;
  }
  std::uint8_t rel[4] = {};
  for (std::size_t i = len; i < pad + 5; ++i) rel[i - pad - 1] = bytes[i];
  std::int32_t fixed = 0;
  std::memcpy(&fixed, rel, 4);
  const std::int64_t base = static_cast<std::int64_t>(site + pad + 5) + fixed;
  const std::int64_t lo = std::max<std::int64_t>(base, 0x10000);
  const std::int64_t hi =
      std::min<std::int64_t>(base + (std::int64_t{1} << (8 * (len - 1 - pad))), 0x7ffffffff000);
  if (lo >= hi) return true;  // no user address
  const std::vector<MapLine> maps = read_maps();
  const auto mapped = [&](std::uint64_t p) {
    for (const MapLine& m : maps)
      if (m.start <= p && p < m.end) return true;
    return false;
  };
  int tries = 0;
  for (std::int64_t p = lo & ~std::int64_t{4095}; p < hi && tries < 16; p += 4096) {
    const std::int64_t a = std::max(lo, p);
    if (a >= hi || a + 5 > p + 4096) continue;
    ++tries;
    if (!mapped(static_cast<std::uint64_t>(p))) {
      err = "the punned jump with " + std::to_string(pad) + " prefixes has a free page " +
            hex(static_cast<std::uint64_t>(p)) + " in its range [" + hex(static_cast<std::uint64_t>(lo)) + ", " +
            hex(static_cast<std::uint64_t>(hi)) + ")";
      return false;
    }
  }
  return true;
}

/// Whether every form of punned jump (pads 0 .. `max_pad`) of the
/// instruction has no page for its hop here (punned_range_taken()).
inline bool punned_ranges_taken(std::uint64_t site, std::size_t len, std::size_t max_pad, const std::uint8_t* bytes,
                                std::string& err) {
  for (std::size_t pad = 0; pad <= max_pad && pad < len; ++pad)
    if (!punned_range_taken(site, len, pad, bytes, err)) return false;
  return true;
}

/// The pages of [lo, hi) taken (PROT_NONE, MAP_FIXED_NOREPLACE) for the
/// life of the object: ok() when every page of it is mapped now, by this
/// object or already (the heap, ASLR's choice, may lie there: the pages are
/// taken either way). Only the pages this object mapped are unmapped.
class TakenPages {
 public:
  TakenPages(std::uint64_t lo, std::uint64_t hi) {
    for (std::uint64_t p = lo & ~std::uint64_t{4095}; p < hi; p += 4096) {
      void* m = ::mmap(reinterpret_cast<void*>(p), 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                       -1, 0);
      if (m != MAP_FAILED && reinterpret_cast<std::uint64_t>(m) == p) {
        pages_.push_back(p);
      } else if (m != MAP_FAILED) {
        ::munmap(m, 4096);
        ok_ = false;
      } else if (errno != EEXIST || !page_mapped(p)) {
        ok_ = false;
      }
    }
  }
  ~TakenPages() { release(); }
  TakenPages(const TakenPages&) = delete;
  TakenPages& operator=(const TakenPages&) = delete;
  bool ok() const { return ok_; }
  /// Whether every page is this object's (none was mapped before).
  bool all_ours(std::uint64_t lo, std::uint64_t hi) const {
    return pages_.size() == ((hi + 4095) & ~std::uint64_t{4095}) / 4096 - lo / 4096;
  }
  /// Unmaps the pages this object mapped.
  void release() {
    for (std::uint64_t p : pages_) ::munmap(reinterpret_cast<void*>(p), 4096);
    pages_.clear();
  }

 private:
  std::vector<std::uint64_t> pages_;
  bool ok_ = true;
};

}  // namespace uprobe_test
