// SPDX-License-Identifier: MIT
#pragma once
// The address-space model: the process's VMAs as /proc/self/maps shows them,
// kept as an immutable sorted snapshot that is published with RCU and
// replaced, never edited (the kernel's VMA tree read under mm_lock_seq).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

/// One mapping. prot bits: 1 read, 2 write, 4 exec; shared = 's' in maps.
struct Vma {
  std::uint64_t start = 0, end = 0, pgoff = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  std::uint8_t prot = 0;
  bool shared = false;
  std::string path;
  bool executable() const noexcept { return prot & 4; }
  bool contains(std::uint64_t a) const noexcept { return a >= start && a < end; }
};

/// Reads /proc/self/maps, sorted by start. Not async-signal-safe.
/// @throws uprobe::Error(Errc::system) when it cannot be read.
std::vector<Vma> read_proc_maps();

/// An immutable set of VMAs, searched by address. Lookups are
/// async-signal-safe and allocation-free.
class VmaSnapshot {
 public:
  explicit VmaSnapshot(std::vector<Vma> vmas) : vmas_(std::move(vmas)) {}
  /// The VMA that holds `addr`, or nullptr.
  const Vma* find(std::uint64_t addr) const noexcept;
  const std::vector<Vma>& vmas() const noexcept { return vmas_; }
  /// Same (start, end, prot, pgoff, dev, ino) for every VMA.
  bool same_layout(const VmaSnapshot& other) const noexcept;

 private:
  std::vector<Vma> vmas_;
};

/// True when the file-backed mappings of the process are exactly those of
/// `snap` (start, end, protection, shared, offset, device and inode of every
/// one), false when any differs (a file mapped, unmapped, moved or changed
/// protection), nullopt when the kernel cannot say (no PROCMAP_QUERY ioctl on
/// /proc/self/maps: Linux < 6.11). It visits the file-backed mappings only
/// and formats no text: a few microseconds where reading /proc/self/maps
/// costs tens to hundreds (anonymous mappings such as thread stacks are most
/// of a big process's maps). Not async-signal-safe (open, ioctl).
std::optional<bool> file_mappings_unchanged(const VmaSnapshot& snap);

/// The file and file offset mapped at `addr` in `vmas` (offset = pgoff +
/// addr - start): resolve_address() on a snapshot.
/// @throws uprobe::Error(not_file_backed) for anonymous memory, no mapping,
/// or a deleted file.
FileOffset file_offset_of(const VmaSnapshot& vmas, std::uint64_t addr);

}  // namespace uprobe::detail
