// SPDX-License-Identifier: MIT
// The function index of an ElfImage (func_index.hpp): funcs and reach from
// the symbols' bounds (radix-sorted) and the .eh_frame FDEs (the FDE walk,
// eh_frame.hpp), fde_count and lsda_ranges.

#include "func_index.hpp"

#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "eh_frame.hpp"
#include "populate.hpp"

namespace uprobe::detail {

namespace {

/// Reads a DW_EH_PE-encoded value of format `enc & 0x0f` at `p` (before
/// `end`) into `v` (sign-extended for the sdata forms); its size, or 0 for a
/// format this reader does not take (uleb128/sleb128, unknown).
inline std::size_t read_encoded(std::uint8_t enc, const std::uint8_t* p, const std::uint8_t* end, std::uint64_t& v) {
  auto get = [&](auto x) -> std::size_t {
    if (end - p < static_cast<std::ptrdiff_t>(sizeof x)) return 0;
    std::memcpy(&x, p, sizeof x);
    v = static_cast<std::uint64_t>(static_cast<std::int64_t>(x));
    if constexpr (std::is_unsigned_v<decltype(x)>) v = static_cast<std::uint64_t>(x);
    return sizeof x;
  };
  switch (enc & 0x0f) {
    case 0x00: return get(std::uint64_t{});  // DW_EH_PE_absptr
    case 0x02: return get(std::uint16_t{});
    case 0x03: return get(std::uint32_t{});
    case 0x04: return get(std::uint64_t{});
    case 0x0a: return get(std::int16_t{});
    case 0x0b: return get(std::int32_t{});
    case 0x0c: return get(std::int64_t{});
    default: return 0;
  }
}

/// The FDE pointer encoding a CIE's augmentation gives ('R'), DW_EH_PE_absptr
/// without one; -1 when the augmentation cannot be read.
int fde_encoding(const Dwarf_CIE& cie) {
  const char* aug = cie.augmentation;
  if (!aug || aug[0] != 'z') return aug && aug[0] == '\0' ? 0 : -1;
  const std::uint8_t* d = cie.augmentation_data;
  const std::uint8_t* end = d + cie.augmentation_data_size;
  for (const char* c = aug + 1; *c; ++c) {
    if (*c == 'R') return d < end ? *d : -1;
    if (*c == 'L') {
      ++d;
    } else if (*c == 'P') {
      if (d >= end) return -1;
      const std::uint8_t penc = *d++;
      std::uint64_t ignored;
      const std::size_t n = read_encoded(penc, d, end, ignored);
      if (n == 0) return -1;
      d += n;
    } else if (*c != 'S' && *c != 'B') {
      return -1;
    }
  }
  return 0;
}

}  // namespace

int next_cfi_entry(const char* ident, Elf_Data* data, Dwarf_Off off, Dwarf_Off& next, Dwarf_CFI_Entry& entry) {
  const auto* base = static_cast<const std::uint8_t*>(data->d_buf);
  const std::size_t size = data->d_size;
  if (off < size && size - off > 8) {
    std::uint32_t length = 0, id = 0;
    std::memcpy(&length, base + off, 4);
    std::memcpy(&id, base + off + 4, 4);
    const std::uint64_t pos = off + 4;  // where the CIE pointer is
    // (length >= 5 is libdw's floor: the pointer and one byte.)
    if (length >= 5 && length != 0xffffffffu && length <= size - pos && id != 0 && id <= pos && pos > 4) {
      next = pos + length;
      entry.fde.CIE_pointer = pos - id;
      entry.fde.start = base + off + 8;
      entry.fde.end = base + next;
      return 0;
    }
  }
  return dwarf_next_cfi(reinterpret_cast<const unsigned char*>(ident), data, true, off, &next, &entry);
}

namespace {

/// Calls `on_fde(start, end, lsda)` for the function bounds [start, end),
/// as link-time addresses, of each .eh_frame FDE of `e` (one per function,
/// or per part of a split function, in what GCC and glibc's assembly emit;
/// kept by strip), section `eh` (nullptr: none), in section order; `lsda`:
/// it points to an LSDA (the function has exception landing pads). libdw
/// reads its CIEs (dwarf_next_cfi), the walk its FDEs (next_cfi_entry());
/// each FDE's initial_location and address_range are read in its CIE's
/// pointer encoding (absolute or pc-relative; an FDE in another encoding is
/// skipped). Returns the number of calls.
template <class OnFde>
std::size_t for_each_fde(Elf* e, Elf_Scn* eh, OnFde&& on_fde) {
  std::size_t count = 0;
  GElf_Shdr sh{};
  if (!eh || !gelf_getshdr(eh, &sh)) return count;
  Elf_Data* data = elf_rawdata(eh, nullptr);
  const char* ident = elf_getident(e, nullptr);
  if (!data || !data->d_buf || !ident) return count;
  const auto* base = static_cast<const std::uint8_t*>(data->d_buf);
  struct Cie {
    Dwarf_Off offset;
    int encoding;  // its FDE encoding
    bool lsda;     // its augmentation has 'L': its FDEs' augmentation data hold an LSDA pointer
    bool signal;   // 'S': a signal trampoline's frame (glibc's __restore_rt), whose FDE starts one byte
                   // before its code (inside the filler before it) so that unwinders looking up pc - 1
                   // find it: not a function's bounds (a sweep from there decodes out of step)
  };
  std::vector<Cie> cies;  // in section order (a few: the linker merges equal ones)
  const Cie* last = nullptr;
  Dwarf_Off off = 0;
  for (std::size_t guard = 0; guard < (1u << 22); ++guard) {
    Dwarf_Off next = 0;
    Dwarf_CFI_Entry entry;
    if (next_cfi_entry(ident, data, off, next, entry) != 0 || next <= off) break;
    const Dwarf_Off here = off;
    off = next;
    if (dwarf_cfi_cie_p(&entry)) {
      const char* aug = entry.cie.augmentation;
      const bool z = aug && aug[0] == 'z';
      const Cie c{here, fde_encoding(entry.cie), z && std::strchr(aug, 'L') != nullptr,
                  z && std::strchr(aug, 'S') != nullptr};
      last = nullptr;  // (cies may move)
      cies.push_back(c);
      continue;
    }
    if (!last || last->offset != entry.fde.CIE_pointer) {
      last = nullptr;
      for (const Cie& c : cies)
        if (c.offset == entry.fde.CIE_pointer) last = &c;
      if (!last) continue;
    }
    const Cie& cie = *last;
    if (cie.encoding < 0 || cie.signal) continue;
    const auto enc = static_cast<std::uint8_t>(cie.encoding);
    const std::uint8_t app = enc & 0x70;
    if ((app != 0x00 && app != 0x10) || (enc & 0x80)) continue;  // absolute or pcrel, not indirect
    const std::uint8_t* p = entry.fde.start;
    const std::uint8_t* end = std::min(entry.fde.end, base + data->d_size);
    if (!p || p < base || p >= end) continue;
    std::uint64_t loc = 0, range = 0;
    std::size_t n = 0;
    if (enc == 0x1b && end - p >= 8) {  // pcrel sdata4, what GCC and GNU as emit: read as below, inline
      std::int32_t l = 0;
      std::uint32_t r = 0;
      std::memcpy(&l, p, 4);
      std::memcpy(&r, p + 4, 4);
      loc = static_cast<std::uint64_t>(static_cast<std::int64_t>(l));
      range = r;  // (a range is never negative)
      n = 4;
      if (range == 0) continue;
    } else {
      n = read_encoded(enc, p, end, loc);
      if (n == 0 || read_encoded(enc & 0x0f, p + n, end, range) == 0 || range == 0) continue;
      if ((enc & 0x0f) == 0x0b || (enc & 0x0f) == 0x0a || (enc & 0x0f) == 0x0c)  // a range is never negative
        read_encoded(static_cast<std::uint8_t>((enc & 0x0f) - 0x08), p + n, end, range);
    }
    if (app == 0x10) loc += sh.sh_addr + static_cast<std::uint64_t>(p - base);
    if (loc + range < loc) continue;
    // The LSDA pointer is the only augmentation data of an FDE ('L'); a
    // null one (all bytes 0, in any encoding) means none, as libgcc reads it.
    bool lsda = false;
    if (cie.lsda) {
      const std::uint8_t* a = p + 2 * n;
      std::uint64_t alen = 0;
      for (unsigned shift = 0; a < end && shift < 64; shift += 7) {
        alen |= static_cast<std::uint64_t>(*a & 0x7f) << shift;
        if (!(*a++ & 0x80)) break;
      }
      for (std::uint64_t i = 0; i < alen && a + i < end; ++i) lsda = lsda || a[i] != 0;
    }
    on_fde(loc, loc + range, lsda);
    ++count;
  }
  return count;
}

/// img.reach[from..] from img.funcs (sorted) and img.reach[0, from).
void index_reach(ElfImage& img, std::size_t from = 0) {
  img.reach.resize(img.funcs.size());
  std::uint64_t reach = from ? img.reach[from - 1] : 0;
  for (std::size_t i = from; i < img.funcs.size(); ++i) {
    const FuncSym& f = img.funcs[i];
    const std::uint64_t end = f.file_offset + f.size < f.file_offset ? ~std::uint64_t{0} : f.file_offset + f.size;
    reach = std::max(reach, end);
    img.reach[i] = reach;
  }
}

/// Sorts `keys` (ascending already in their low `low_bits` bits, within
/// equal high bits: kept so) by their value, with `tmp` as room (as many
/// entries): a stable LSD radix sort over the high bits where the keys
/// differ, in passes of at most 11 bits (libc's function offsets span 21
/// bits: two passes). The result is in `keys`.
void radix_sort_high(std::vector<std::uint64_t>& keys, std::uint64_t* tmp, unsigned low_bits) {
  const std::size_t n = keys.size();
  if (n < 2) return;
  std::uint64_t differ = 0;
  const std::uint64_t k0 = keys[0] >> low_bits;
  for (const std::uint64_t k : keys) differ |= (k >> low_bits) ^ k0;
  if (differ == 0) return;
  const unsigned low = low_bits + static_cast<unsigned>(__builtin_ctzll(differ));
  const unsigned bits = 64 - static_cast<unsigned>(__builtin_clzll(differ)) - (low - low_bits);
  const unsigned passes = (bits + 10) / 11;  // <= 4 (at most 40 bits: read_image's packing)
  const unsigned width = (bits + passes - 1) / passes;
  const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
  const std::size_t buckets = static_cast<std::size_t>(mask) + 2;  // (count[b + 1]: keys with digit b)
  std::vector<std::uint32_t> counts(passes * buckets);  // (<= 32 KiB)
  std::uint32_t* count[4] = {};
  for (unsigned p = 0; p < passes; ++p) count[p] = counts.data() + p * buckets;
  auto histogram = [&](auto npasses) {  // every pass's in one read of the keys
    for (const std::uint64_t k : keys)
      for (unsigned p = 0; p < npasses; ++p) ++count[p][((k >> (low + p * width)) & mask) + 1];
  };
  switch (passes) {  // (the inner loop unrolled)
    case 1: histogram(std::integral_constant<unsigned, 1>{}); break;
    case 2: histogram(std::integral_constant<unsigned, 2>{}); break;
    case 3: histogram(std::integral_constant<unsigned, 3>{}); break;
    default: histogram(std::integral_constant<unsigned, 4>{}); break;
  }
  std::uint64_t* from = keys.data();
  std::uint64_t* to = tmp;
  for (unsigned p = 0; p < passes; ++p) {
    std::uint32_t* c = count[p];
    for (std::size_t b = 1; b <= mask + 1; ++b) c[b] += c[b - 1];
    const unsigned shift = low + p * width;
    for (std::size_t i = 0; i < n; ++i) to[c[(from[i] >> shift) & mask]++] = from[i];
    std::swap(from, to);
  }
  if (from != keys.data()) std::copy(from, from + n, keys.data());
}

}  // namespace

void index_functions(ElfImage& img, BoundsKeys& bounds, Elf* e, Elf_Scn* eh_frame) {
  const BoundsSource sym_source = img.debug_file.empty() ? BoundsSource::symtab : BoundsSource::debuginfo;
  constexpr unsigned kIndexBits = BoundsKeys::kIndexBits;
  // The function bounds symbols sorted by (file_offset, symbol_index): a
  // radix sort of the keys' offset bits (stable: in index order among
  // equals), or when they could not be packed, their indexes sorted by
  // offset (std::stable_sort).
  std::vector<std::uint64_t>& keys = bounds.keys;
  if (!bounds.packed) {
    keys.clear();
    for (std::size_t i = 0; i < img.symbols.size(); ++i)
      if (is_function_bounds(img.symbols[i])) keys.push_back(i);
  }
  // Room for the FDEs' entries too (an FDE takes 16 bytes at least): one
  // allocation, its untouched part never faulted in.
  std::size_t fde_room = 0;
  if (GElf_Shdr sh; eh_frame && gelf_getshdr(eh_frame, &sh))
    fde_room = std::min<std::uint64_t>(sh.sh_size / 16, 1u << 16);
  img.funcs.reserve(keys.size() + fde_room);
  img.reach.reserve(keys.size() + fde_room);
  // (The symbols' part of the room, which is filled next, in one call; the
  // FDEs' part is a bound, most of it never touched.)
  populate_pages(img.funcs.data(), keys.size() * sizeof(FuncSym));
  populate_pages(img.reach.data(), keys.size() * sizeof(std::uint64_t));
  if (bounds.packed) {
    img.reach.resize(keys.size());
    radix_sort_high(keys, img.reach.data(), kIndexBits);
  } else {
    std::stable_sort(keys.begin(), keys.end(), [&](std::uint64_t a, std::uint64_t b) {
      return img.symbols[a].offset < img.symbols[b].offset;
    });
  }
  // Then each run of equal offsets (aliases: a few entries) by (size,
  // source), stably: the order (file_offset, size, source, symbol_index).
  const std::uint64_t index_mask = bounds.packed ? (std::uint64_t{1} << kIndexBits) - 1 : ~std::uint64_t{0};
  const auto before = [](const FuncSym& a, const FuncSym& b) {  // (of equal file_offset)
    return std::tie(a.size, a.source) < std::tie(b.size, b.source);
  };
  for (const std::uint64_t k : keys) {
    const std::uint64_t index = k & index_mask;
    const ElfSymbol& s = img.symbols[index];
    const FuncSym f{s.name, s.offset, s.size, s.dynamic ? BoundsSource::dynsym : sym_source,
                    static_cast<std::uint32_t>(index)};
    std::size_t m = img.funcs.size();
    if (m == 0 || img.funcs[m - 1].file_offset != f.file_offset || !before(f, img.funcs[m - 1])) {
      img.funcs.push_back(f);
      continue;
    }
    // (Insertion: stable, and the runs are short.)
    img.funcs.push_back(img.funcs[--m]);
    for (; m > 0 && img.funcs[m - 1].file_offset == f.file_offset && before(f, img.funcs[m - 1]); --m)
      img.funcs[m] = img.funcs[m - 1];
    img.funcs[m] = f;
  }
  std::vector<std::uint64_t>().swap(keys);
  index_reach(img);
  // An FDE adds the function it describes when no symbol's bounds hold its
  // start (a symbol names it and says how long it is; an FDE may cover only
  // a part of a split function). Looked up in the symbols' index alone; the
  // FDEs so added, sorted among themselves (in their order among equals),
  // are then merged in after the symbols' entries of equal bounds (an FDE's
  // source sorts last).
  // Whether a symbol's bounds hold `off`: the entries that start at or
  // before it are funcs[0, at), and one of them holds it when their largest
  // end (reach) is past it. FDEs come mostly in address order, so `at` moves
  // on from the previous FDE's (a galloping search; ~0.2 ms less than a
  // binary search of libc's 10,000 entries for each of its 3,700 FDEs).
  std::size_t at = 0;
  auto held_by_symbol = [&](std::uint64_t off) {
    const std::vector<FuncSym>& f = img.funcs;
    const auto starts_after = [](std::uint64_t o, const FuncSym& e) { return o < e.file_offset; };
    if (at > 0 && f[at - 1].file_offset > off) {
      at = static_cast<std::size_t>(std::upper_bound(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(at), off,
                                                     starts_after) - f.begin());
    } else {
      std::size_t step = 1;
      while (at + step <= f.size() && f[at + step - 1].file_offset <= off) at += step, step *= 2;
      const std::size_t hi = std::min(f.size(), at + step);
      at = static_cast<std::size_t>(std::upper_bound(f.begin() + static_cast<std::ptrdiff_t>(at),
                                                     f.begin() + static_cast<std::ptrdiff_t>(hi), off, starts_after) -
                                    f.begin());
    }
    return at > 0 && img.reach[at - 1] > off;
  };
  std::vector<FuncSym> extra;
  SegmentFinder segment_of(img);
  img.fde_count = for_each_fde(e, eh_frame, [&](std::uint64_t start, std::uint64_t end, bool lsda) {
    const LoadSegment* seg = segment_of(start);
    if (!seg || !seg->executable() || end - seg->vaddr > seg->filesz) return;
    const std::uint64_t off = start - seg->vaddr + seg->offset;
    if (lsda) img.lsda_ranges.emplace_back(off, off + (end - start));
    if (held_by_symbol(off)) return;
    extra.push_back({{}, off, end - start, BoundsSource::eh_frame});
  });
  if (!std::is_sorted(img.lsda_ranges.begin(), img.lsda_ranges.end()))
    std::sort(img.lsda_ranges.begin(), img.lsda_ranges.end());
  if (extra.empty()) return;
  const auto by_bounds = [](const FuncSym& a, const FuncSym& b) {
    return std::tie(a.file_offset, a.size) < std::tie(b.file_offset, b.size);
  };
  if (!std::is_sorted(extra.begin(), extra.end(), by_bounds)) std::stable_sort(extra.begin(), extra.end(), by_bounds);
  // Merged from the back, in place: each FDE's entry after the symbols'
  // entries of equal bounds (stable, as std::merge), the entries after it
  // moved up in one block (with their reach, raised below); the entries
  // before the first FDE's place stay, and their reach.
  static_assert(std::is_trivially_copyable_v<FuncSym>);
  const std::size_t n = img.funcs.size();
  std::size_t i = n, w = n + extra.size();
  img.funcs.resize(w);
  img.reach.resize(w);
  std::vector<std::size_t> placed(extra.size());
  for (std::size_t j = extra.size(); j-- > 0;) {
    const auto pos = static_cast<std::size_t>(
        std::upper_bound(img.funcs.begin(), img.funcs.begin() + static_cast<std::ptrdiff_t>(i), extra[j], by_bounds) -
        img.funcs.begin());
    std::memmove(&img.funcs[w - (i - pos)], &img.funcs[pos], (i - pos) * sizeof(FuncSym));
    std::memmove(&img.reach[w - (i - pos)], &img.reach[pos], (i - pos) * sizeof(std::uint64_t));
    w -= i - pos;
    i = pos;
    img.funcs[--w] = extra[j];
    placed[j] = w;
  }
  // reach: each FDE's entry raises it for the entries after it until one's
  // own (a symbols' prefix maximum, moved) is as large.
  for (std::size_t j = 0; j < extra.size(); ++j) {
    const std::size_t q = placed[j];
    const FuncSym& f = img.funcs[q];
    const std::uint64_t end = f.file_offset + f.size < f.file_offset ? ~std::uint64_t{0} : f.file_offset + f.size;
    const std::uint64_t r = std::max(q ? img.reach[q - 1] : 0, end);
    img.reach[q] = r;
    const std::size_t stop = j + 1 < extra.size() ? placed[j + 1] : img.funcs.size();
    for (std::size_t p = q + 1; p < stop && img.reach[p] < r; ++p) img.reach[p] = r;
  }
}

}  // namespace uprobe::detail
