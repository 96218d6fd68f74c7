// SPDX-License-Identifier: MIT
#pragma once
// The function index of an ElfImage (func_index.cpp): what elf_image.cpp's
// symbol reading hands to it (the function bounds symbols' keys) and the
// helpers both use.

#include <gelf.h>
#include <libelf.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "elf_image.hpp"

namespace uprobe::detail {

/// img.segment_of_vaddr(), the last segment found tried first when no two
/// segments' file bytes overlap (then the one holding an address is the
/// only one): symbols and FDEs come in runs within one segment.
class SegmentFinder {
 public:
  explicit SegmentFinder(const ElfImage& img) : img_(img) {
    for (std::size_t x = 0; x < img.loads.size(); ++x)
      for (std::size_t y = x + 1; y < img.loads.size(); ++y) {
        const LoadSegment &l = img.loads[x], &m = img.loads[y];
        // (Overlap of [l.vaddr, + filesz) and [m.vaddr, + filesz), without overflow.)
        if (l.vaddr <= m.vaddr ? m.vaddr - l.vaddr < l.filesz && m.filesz : l.vaddr - m.vaddr < m.filesz && l.filesz)
          disjoint_ = false;
      }
  }
  const LoadSegment* operator()(std::uint64_t vaddr) {
    if (last_ && vaddr >= last_->vaddr && vaddr - last_->vaddr < last_->filesz) return last_;
    const LoadSegment* seg = img_.segment_of_vaddr(vaddr);
    if (disjoint_) last_ = seg;  // (none while segments overlap)
    return seg;
  }

 private:
  const ElfImage& img_;
  bool disjoint_ = true;
  const LoadSegment* last_ = nullptr;
};

/// Whether `s` gives the bounds of a function (an entry of ElfImage::funcs):
/// a sized code symbol in an executable segment.
inline bool is_function_bounds(const ElfSymbol& s) {
  return (s.type == STT_FUNC || s.type == STT_GNU_IFUNC) && s.size != 0 && s.in_file && s.executable;
}

/// The entries of img.symbols that give function bounds, as
/// collect_symbols() appends them (no second pass over the symbols): keys
/// (file_offset << 24 | symbol index), in symbol order, while every offset
/// is below 2^40 and every index below 2^24 (`packed`); else none (then
/// index_functions() finds them).
struct BoundsKeys {
  static constexpr unsigned kIndexBits = 24;
  std::vector<std::uint64_t> keys;
  bool packed = true;
};

/// img.funcs and img.reach from img.symbols and the .eh_frame FDEs of `e`
/// (section `eh_frame`; read here, as they come), and img.fde_count and
/// img.lsda_ranges, built in place: every fresh page costs (a page fault is
/// ~10-40 us in a VM), so no entry is built twice, no second vector is
/// merged into, and no temporary is bigger than it must be (the radix
/// sort's room is img.reach's).
void index_functions(ElfImage& img, BoundsKeys& bounds, Elf* e, Elf_Scn* eh_frame);

}  // namespace uprobe::detail
