// SPDX-License-Identifier: MIT
#pragma once
// The neighbour check of a window (the kprobes optimizer's "no jump into the
// displaced range" over the functions around the probed one, not only its
// own): check_neighbours(), with the per-ELF-image index of the neighbours'
// branch targets it keeps across transactions. Attach side, not hot.

#include <cstddef>
#include <cstdint>
#include <string>

#include "elf_image.hpp"
#include "validate.hpp"

namespace uprobe::detail {

/// Whether no function whose bounds lie within 4 KiB of `fn` (a
/// neighbour, swept from its own start) branches into the window of `len`
/// bytes at file offset `site` (fn's entry, or an instruction inside fn)
/// past its first byte; false with the reason in `why`. Code between known
/// functions (no symbol, no FDE) is not searched. A neighbour seen whole is
/// swept once (the file's neighbour index): the targets of its branches
/// clear it for every window they miss, and only a window one of them
/// reaches (or a neighbour that cannot be swept to its end) is checked
/// here, for the exact answer and its reason. The neighbourhood's bytes are
/// read only when a neighbour needs them.
/// Thread-safe (the index's own lock); not async-signal-safe.
bool check_neighbours(const Target& t, const ElfImage& info, const FuncSym& fn, const LoadSegment& seg,
                      std::uint64_t site, std::size_t len, std::string& why);

/// Frees a target's own index (Target::own_neighbour_cache; nullptr: nothing).
void release_neighbour_cache(NeighbourCache* own) noexcept;

}  // namespace uprobe::detail
