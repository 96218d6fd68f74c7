// SPDX-License-Identifier: MIT
#pragma once
// The address-space model, writer side: reading /proc/self/maps into the
// immutable sorted snapshot (src/hit/vma_snapshot.hpp) that is published
// with RCU and replaced, never edited (the kernel's VMA tree read under
// mm_lock_seq), and resolving addresses through it.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/uprobe.hpp"
#include "vma_snapshot.hpp"  // Vma, VmaSnapshot: the read side, owned by the hit path

namespace uprobe::detail {

/// Reads /proc/self/maps, sorted by start. Not async-signal-safe.
/// @throws uprobe::Error(Errc::system) when it cannot be read.
std::vector<Vma> read_proc_maps();

/// Same (start, end, prot, pgoff, dev, ino) for every VMA of `a` and `b`.
bool same_layout(const VmaSnapshot& a, const VmaSnapshot& b) noexcept;

/// True when the file-backed mappings of the process that hold code or
/// writable data are exactly those of `snap` (start, end, protection,
/// shared, offset, device and inode of every one): what the registry and the
/// trap path use a snapshot for (a file's code: sites; its data: USDT
/// semaphores). False when any differs (a file mapped, unmapped, moved or
/// changed protection), nullopt when the kernel cannot say (no PROCMAP_QUERY
/// ioctl on /proc/self/maps: Linux < 6.11). The read-only file mappings
/// (headers, .rodata, RELRO) are not compared; like the anonymous ones, only
/// XOL placement looks at them, and it reads the address space afresh when
/// it needs a new region. One query per compared mapping, no text formatted:
/// a few microseconds where reading /proc/self/maps costs tens to hundreds.
/// Not async-signal-safe (open, ioctl).
std::optional<bool> file_mappings_unchanged(const VmaSnapshot& snap);

/// The same for one mapping `v` of a snapshot: whether the process maps
/// exactly `v` at v.start now (one query where file_mappings_unchanged()
/// makes one per file-backed mapping). What resolve_address() needs of a
/// snapshot. Not async-signal-safe.
std::optional<bool> mapping_unchanged(const Vma& v);

/// The file and file offset mapped at `addr` in `vmas` (offset = pgoff +
/// addr - start): resolve_address() on a snapshot.
/// @throws uprobe::Error(not_file_backed) for anonymous memory, no mapping,
/// or a deleted file.
FileOffset file_offset_of(const VmaSnapshot& vmas, std::uint64_t addr);

/// file_offset_of() on `snap` when the mapping holding `addr` there is still
/// exactly what the process maps (mapping_unchanged()); nullopt otherwise,
/// or when the snapshot's answer is an error (e.g. a deleted file): the
/// caller then reads the address space afresh, which says. The one place
/// that decides whether a kept snapshot can answer for an address (the
/// snapshot itself is kept while only anonymous and read-only file mappings
/// changed: refresh_vmas()). Not async-signal-safe.
std::optional<FileOffset> file_offset_if_unchanged(const VmaSnapshot& snap, std::uint64_t addr);

}  // namespace uprobe::detail
