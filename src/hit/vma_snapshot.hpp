// SPDX-License-Identifier: MIT
#pragma once
// The address space as the hit path reads it: an immutable sorted snapshot of
// the process's mappings (g_hot.vmas), searched by address on every int3 hit.
// Built and published by the attach side (src/attach/vma.cpp reads
// /proc/self/maps, runtime.cpp's refresh_vmas() publishes); the hit path
// owns the type because it is what it reads.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace uprobe::detail {

/// One mapping. prot bits: 1 read, 2 write, 4 exec; shared = 's' in maps.
struct Vma {
  std::uint64_t start = 0, end = 0, pgoff = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  std::uint8_t prot = 0;
  bool shared = false;
  /// Holds pages libuprobe detached from the file (src/attach/text_pages.hpp):
  /// the kernel shows them as anonymous memory; the model, as the file's.
  bool detached = false;
  std::string path;
  bool executable() const noexcept { return prot & 4; }
  bool contains(std::uint64_t a) const noexcept { return a >= start && a < end; }
};

/// An immutable set of VMAs, searched by address. Lookups are
/// async-signal-safe and allocation-free.
class VmaSnapshot {
 public:
  explicit VmaSnapshot(std::vector<Vma> vmas) : vmas_(std::move(vmas)) {}
  /// The VMA that holds `addr`, or nullptr: the last one starting at or
  /// below it (binary search), if it contains it. Async-signal-safe, no
  /// allocation.
  const Vma* find(std::uint64_t addr) const noexcept {
    std::size_t lo = 0, hi = vmas_.size();
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (vmas_[mid].start <= addr)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == 0) return nullptr;
    const Vma& v = vmas_[lo - 1];
    return v.contains(addr) ? &v : nullptr;
  }
  const std::vector<Vma>& vmas() const noexcept { return vmas_; }

 private:
  std::vector<Vma> vmas_;
};

}  // namespace uprobe::detail
