// SPDX-License-Identifier: MIT
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "elf_image.hpp"

#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "eh_frame.hpp"
#include "fork_fresh.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

std::string hex_str(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

bool LoadSegment::executable() const noexcept { return (flags & PF_X) != 0; }

const LoadSegment* ElfImage::segment_of_vaddr(std::uint64_t vaddr) const noexcept {
  for (const LoadSegment& s : loads)
    if (vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz) return &s;
  return nullptr;
}

const LoadSegment* ElfImage::segment_of_offset(std::uint64_t off) const noexcept {
  const LoadSegment* found = nullptr;
  for (const LoadSegment& s : loads) {
    if (off >= s.offset && off - s.offset < s.filesz) {
      if (s.executable()) return &s;
      if (!found) found = &s;
    }
  }
  return found;
}

const LoadSegment* ElfImage::exec_segment(std::uint64_t off) const noexcept {
  for (const LoadSegment& s : loads)
    if (s.executable() && off >= s.offset && off - s.offset < s.filesz) return &s;
  return nullptr;
}

bool ElfImage::has_landing_pads(std::uint64_t off) const noexcept {
  // Ranges may nest (a split function's parts); a covering one starts at or
  // before `off`, and FDEs are short: look back from the last such start.
  auto it = std::upper_bound(lsda_ranges.begin(), lsda_ranges.end(), std::pair{off, ~std::uint64_t{0}});
  for (int steps = 0; it != lsda_ranges.begin() && steps < 64; ++steps) {
    --it;
    if (off < it->second) return true;
  }
  return false;
}

const FuncSym* ElfImage::enclosing_function(std::uint64_t off) const noexcept {
  // funcs is sorted by file_offset; bounds may nest or alias, so scan the
  // candidates that start at or before off and pick the tightest.
  auto it = std::upper_bound(funcs.begin(), funcs.end(), off,
                             [](std::uint64_t o, const FuncSym& f) { return o < f.file_offset; });
  const FuncSym* best = nullptr;
  for (int steps = 0; it != funcs.begin() && steps < 64; ++steps) {
    // No function from here back reaches past off: none of them holds it.
    if (reach[static_cast<std::size_t>(it - funcs.begin()) - 1] <= off) break;
    --it;
    // off - start < size: no overflow for a hostile st_size (off >= start here).
    if (off - it->file_offset < it->size && (!best || it->size < best->size)) best = &*it;
  }
  return best;
}

std::string ElfSymbol::full_name() const {
  std::string out(name);
  if (!version.empty()) out.append(hidden_version ? "@" : "@@").append(version);
  return out;
}

Symbol ElfSymbol::to_symbol() const {
  Symbol s;
  s.name = name;
  s.version = version;
  s.hidden_version = hidden_version;
  s.address = address;
  s.size = size;
  s.offset = offset;
  s.in_file = in_file;
  s.executable = executable;
  s.type = type;
  s.binding = binding;
  s.dynamic = dynamic;
  return s;
}

const char* bounds_source_name(BoundsSource s) noexcept {
  switch (s) {
    case BoundsSource::symtab: return "symtab";
    case BoundsSource::dynsym: return "dynsym";
    case BoundsSource::debuginfo: return "debuginfo";
    case BoundsSource::eh_frame: return "eh_frame";
  }
  return "?";
}

std::string FuncSym::display_name() const {
  return name.empty() ? "the function at file offset " + hex_str(file_offset) : std::string(name);
}

namespace {

constexpr std::uint32_t kNtStapsdt = 3;

// Owns a libelf descriptor (not the file descriptor under it).
struct ElfHandle {
  Elf* elf = nullptr;
  ~ElfHandle() {
    if (elf) elf_end(elf);
  }
};

const char* section_name(Elf* e, std::size_t shstrndx, const GElf_Shdr& sh) {
  const char* n = elf_strptr(e, shstrndx, sh.sh_name);
  return n ? n : "";
}

std::vector<std::string> split_path_list(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = s; *p; ++p) {
    if (*p == ':') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

void read_dynamic(Elf* e, Elf_Scn* scn, ElfImage& img) {
  GElf_Shdr sh;
  if (!gelf_getshdr(scn, &sh) || !sh.sh_entsize) return;
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data) return;
  const std::size_t n = std::min<std::uint64_t>(sh.sh_size, data->d_size) / sh.sh_entsize;
  for (std::size_t i = 0; i < n; ++i) {
    GElf_Dyn dyn;
    if (!gelf_getdyn(data, static_cast<int>(i), &dyn) || dyn.d_tag == DT_NULL) break;
    if (dyn.d_tag != DT_SONAME && dyn.d_tag != DT_RPATH && dyn.d_tag != DT_RUNPATH) continue;
    const char* s = elf_strptr(e, sh.sh_link, dyn.d_un.d_val);
    if (!s) continue;
    if (dyn.d_tag == DT_SONAME) img.soname = s;
    else if (dyn.d_tag == DT_RPATH) img.rpath = split_path_list(s);
    else img.runpath = split_path_list(s);
  }
}

// Version index -> version name, from SHT_GNU_verdef.
void read_verdef(Elf* e, Elf_Scn* scn, std::unordered_map<unsigned, std::string>& names) {
  GElf_Shdr sh;
  if (!scn || !gelf_getshdr(scn, &sh)) return;
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data) return;
  std::size_t off = 0;
  // sh_info is the number of entries; bound the walk by it and by the data size.
  for (std::size_t i = 0; i < sh.sh_info && i < 65536; ++i) {
    GElf_Verdef vd;
    if (!gelf_getverdef(data, static_cast<int>(off), &vd)) break;
    GElf_Verdaux va;
    if (!(vd.vd_flags & VER_FLG_BASE) && gelf_getverdaux(data, static_cast<int>(off + vd.vd_aux), &va)) {
      if (const char* s = elf_strptr(e, sh.sh_link, va.vda_name)) names.emplace(vd.vd_ndx, s);
    }
    if (vd.vd_next == 0 || off + vd.vd_next >= data->d_size) break;
    off += vd.vd_next;
  }
}

/// Hands `e` (and what it read) to the image, for its lifetime: `symbols`
/// view its string tables. (Once it has read all it will, elf_cntl(e,
/// ELF_C_FDDONE): its file descriptor is closed by its owner.)
void keep_elf(Elf* e, ElfImage& img) {
  img.elf_handles.emplace_back(e, [](void* p) { elf_end(static_cast<Elf*>(p)); });
}

/// The number of entries of symbol table `scn` (0 when unreadable), for a
/// reservation: img.symbols is allocated once, never grown (and copied).
std::size_t symbol_count(Elf_Scn* scn) {
  GElf_Shdr sh;
  if (!scn || !gelf_getshdr(scn, &sh) || !sh.sh_entsize) return 0;
  Elf_Data* data = elf_getdata(scn, nullptr);  // (bounded by the bytes there are, as collect_symbols)
  return data ? std::min<std::uint64_t>(sh.sh_size, data->d_size) / sh.sh_entsize : 0;
}

/// The string table of a symbol table (section `ndx` of `e`), checked once
/// for what elf_strptr() checks per string (an SHT_STRTAB section, the offset
/// inside it, a NUL after it there) so that each name is a bound-checked read
/// of the bytes libelf read (elf_getdata(): the buffer elf_strptr() reads,
/// kept with the image). A table these checks do not cover (compressed,
/// unreadable) is read through elf_strptr() alone, as before.
class StrTab {
 public:
  StrTab(Elf* e, std::size_t ndx) : e_(e), ndx_(ndx) {
    Elf_Scn* scn = elf_getscn(e, ndx);
    GElf_Shdr sh;
    if (!scn || !gelf_getshdr(scn, &sh) || sh.sh_type != SHT_STRTAB || (sh.sh_flags & SHF_COMPRESSED)) return;
    Elf_Data* d = elf_getdata(scn, nullptr);
    if (!d || !d->d_buf || d->d_size == 0 || d->d_off != 0 || elf_getdata(scn, d) != nullptr) return;
    base_ = static_cast<const char*>(d->d_buf);
    size_ = std::min<std::uint64_t>(sh.sh_size, d->d_size);
    // elf_strptr() looks for the NUL up to the end of what it read (d_size).
    limit_ = d->d_size;
    terminated_ = base_[limit_ - 1] == '\0';
  }
  /// The string at `off`, or nullptr where elf_strptr() gives none.
  const char* at(std::uint64_t off) const {
    if (!base_) return elf_strptr(e_, ndx_, off);
    if (off >= size_) return nullptr;
    if (terminated_ || std::memchr(base_ + off, '\0', limit_ - off)) return base_ + off;
    return nullptr;
  }

 private:
  Elf* e_;
  std::size_t ndx_;
  const char* base_ = nullptr;
  std::size_t size_ = 0, limit_ = 0;
  bool terminated_ = false;
};

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
bool is_function_bounds(const ElfSymbol& s) {
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

/// Appends the defined symbols of symbol table `scn` to img.symbols, with
/// room reserved for `reserve_more` more (the table read next).
void collect_symbols(Elf* e, Elf_Scn* scn, bool dynamic, Elf_Scn* versym_scn, ElfImage& img, BoundsKeys& bounds,
                     std::size_t reserve_more = 0) {
  GElf_Shdr sh;
  if (!gelf_getshdr(scn, &sh) || !sh.sh_entsize) return;
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data) return;
  Elf_Data* vdata = dynamic && versym_scn ? elf_getdata(versym_scn, nullptr) : nullptr;
  // Bounded by the bytes libelf actually has, not by a header that may lie.
  const std::size_t n = std::min<std::uint64_t>(sh.sh_size, data->d_size) / sh.sh_entsize;
  // libelf hands the table over in memory form (ELF_T_SYM: an array of
  // Elf64_Sym for an ELFCLASS64 file, which read_image() requires): read in
  // place rather than through a gelf_getsym() copy per entry. Likewise the
  // version indexes (ELF_T_HALF).
  const bool raw = data->d_type == ELF_T_SYM && sh.sh_entsize == sizeof(Elf64_Sym) && data->d_buf;
  const auto* syms = static_cast<const Elf64_Sym*>(data->d_buf);
  const bool raw_versions = vdata && vdata->d_type == ELF_T_HALF && vdata->d_buf;
  const std::size_t nversions = raw_versions ? vdata->d_size / sizeof(Elf64_Versym) : 0;
  const auto* vsyms = raw_versions ? static_cast<const Elf64_Versym*>(vdata->d_buf) : nullptr;
  // Version index -> name, dense (what img.version_names holds; its strings
  // are never moved).
  std::vector<std::string_view> versions;
  if (vdata) {
    unsigned top = 0;
    for (const auto& [idx, name] : img.version_names) top = std::max(top, idx);
    versions.resize(std::min(top, 0x7fffu) + 1);
    for (const auto& [idx, name] : img.version_names)
      if (idx >= 2 && idx <= 0x7fff) versions[idx] = name;
  }
  const std::vector<std::string_view>::size_type nversion_names = versions.size();
  const StrTab strtab(e, sh.sh_link);
  img.symbols.reserve(img.symbols.size() + n + reserve_more);
  // (Reserved as the symbols: its untouched part is never faulted in.)
  if (bounds.packed) bounds.keys.reserve(bounds.keys.size() + n + reserve_more);
  SegmentFinder segment_of(img);
  for (std::size_t i = 1; i < n; ++i) {
    GElf_Sym sym;
    if (raw) sym = syms[i];
    else if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
    const unsigned type = GELF_ST_TYPE(sym.st_info);
    if (sym.st_shndx == SHN_UNDEF || sym.st_shndx == SHN_ABS || sym.st_shndx == SHN_COMMON) continue;
    if (type == STT_SECTION || type == STT_FILE || type == STT_TLS) continue;
    // (A view of libelf's copy of the string table, which the image keeps.)
    const char* raw_name = strtab.at(sym.st_name);
    if (!raw_name || !*raw_name) continue;
    ElfSymbol& s = img.symbols.emplace_back();
    if (!dynamic) {
      // Static symbol tables spell versions in the name: name@VER, name@@VER
      // (one scan: to the '@' or the end).
      const char* at = strchrnul(raw_name, '@');
      if (*at == '@' && at > raw_name) {
        const bool dflt = at[1] == '@';
        s.version = at + (dflt ? 2 : 1);
        s.hidden_version = !dflt;
        s.name = std::string_view(raw_name, static_cast<std::size_t>(at - raw_name));
      } else {
        s.name = std::string_view(raw_name, static_cast<std::size_t>(at - raw_name) + (*at ? std::strlen(at) : 0));
      }
    } else {
      s.name = raw_name;
      if (vdata) {
        GElf_Versym vs;
        bool have = false;
        if (raw_versions) {
          if (i < nversions) vs = vsyms[i], have = true;
        } else {
          have = gelf_getversym(vdata, static_cast<int>(i), &vs) != nullptr;
        }
        if (have) {
          const unsigned idx = vs & 0x7fff;
          // (A null view where version_names has no entry; an empty name is a non-null view.)
          if (idx >= 2 && idx < nversion_names && versions[idx].data()) {
            s.version = versions[idx];
            s.hidden_version = (vs & 0x8000) != 0;
          }
        }
      }
    }
    s.address = sym.st_value;
    s.size = sym.st_size;
    s.type = static_cast<std::uint8_t>(type);
    s.binding = static_cast<std::uint8_t>(GELF_ST_BIND(sym.st_info));
    s.dynamic = dynamic;
    if (const LoadSegment* seg = segment_of(s.address)) {
      s.in_file = true;
      s.offset = s.address - seg->vaddr + seg->offset;
      s.executable = seg->executable();
    }
    if (bounds.packed && is_function_bounds(s)) {
      const std::uint64_t at = img.symbols.size() - 1;
      if ((at >> BoundsKeys::kIndexBits) == 0 && (s.offset >> (64 - BoundsKeys::kIndexBits)) == 0) {
        bounds.keys.push_back(s.offset << BoundsKeys::kIndexBits | at);
      } else {
        bounds.packed = false;
        std::vector<std::uint64_t>().swap(bounds.keys);
      }
    }
  }
}

void read_stapsdt(Elf_Scn* scn, ElfImage& img) {
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data || !data->d_buf) return;
  const char* buf = static_cast<const char*>(data->d_buf);
  std::size_t off = 0;
  for (std::size_t guard = 0; guard < (1u << 22); ++guard) {
    GElf_Nhdr nh;
    std::size_t name_off = 0, desc_off = 0;
    std::size_t next = gelf_getnote(data, off, &nh, &name_off, &desc_off);
    if (next == 0 || next <= off) break;
    off = next;
    if (nh.n_type != kNtStapsdt || nh.n_namesz != 8 || name_off > data->d_size || data->d_size - name_off < 8 ||
        std::memcmp(buf + name_off, "stapsdt", 8) != 0)
      continue;
    if (desc_off > data->d_size || data->d_size - desc_off < nh.n_descsz) {
      ++img.malformed_notes;
      continue;
    }
    const char* desc = buf + desc_off;
    const std::size_t dsz = nh.n_descsz;
    if (dsz < 3 * 8 + 2) {
      ++img.malformed_notes;
      continue;
    }
    StapsdtNote note;
    std::memcpy(&note.pc, desc, 8);
    std::memcpy(&note.base, desc + 8, 8);
    std::memcpy(&note.semaphore, desc + 16, 8);
    std::size_t p = 24;
    auto take = [&](std::string& out, bool need_nul) {
      const void* nul = std::memchr(desc + p, '\0', dsz - p);
      if (!nul) {
        if (need_nul) return false;
        out.assign(desc + p, dsz - p);
        p = dsz;
        return true;
      }
      std::size_t len = static_cast<std::size_t>(static_cast<const char*>(nul) - (desc + p));
      out.assign(desc + p, len);
      p += len + 1;
      return true;
    };
    if (!take(note.provider, true) || p >= dsz || !take(note.name, true)) {
      ++img.malformed_notes;
      continue;
    }
    if (p < dsz) take(note.args, false);
    img.notes.push_back(std::move(note));
  }
}

/// The build-id of `e` (NT_GNU_BUILD_ID) as lowercase hex, "" when none.
std::string build_id_hex(Elf* e) {
  const void* id = nullptr;
  const ssize_t n = dwelf_elf_gnu_build_id(e, &id);
  if (n <= 1 || n > 64 || !id) return {};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * static_cast<std::size_t>(n), '\0');
  for (ssize_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<const unsigned char*>(id)[i];
    out[2 * static_cast<std::size_t>(i)] = kHex[c >> 4];
    out[2 * static_cast<std::size_t>(i) + 1] = kHex[c & 15];
  }
  return out;
}

/// The .symtab of the separate debug file of `e`, found by build-id in the
/// system's debug directory (/usr/lib/debug/.build-id/xx/yyyy.debug, where
/// Debian's -dbg packages install them), its build-id checked: its symbols
/// enter `img` as .symtab symbols (mapped through img's own segments, as the
/// debug file's sections hold no code). Returns the debug file's path, or ""
/// when there is none (or it is unreadable, or another build).
std::string read_debug_symtab(Elf* e, ElfImage& img, BoundsKeys& bounds, std::size_t reserve_more) {
  const std::string id = build_id_hex(e);
  if (id.empty()) return {};
  const std::string path = "/usr/lib/debug/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string used;
  if (Elf* d = elf_begin(fd, ELF_C_READ, nullptr)) {
    keep_elf(d, img);  // (ended with the image; views of its .strtab may be made below)
    GElf_Ehdr eh;
    if (elf_kind(d) == ELF_K_ELF && gelf_getehdr(d, &eh) && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
        eh.e_machine == EM_X86_64 && build_id_hex(d) == id) {
      for (Elf_Scn* scn = elf_nextscn(d, nullptr); scn; scn = elf_nextscn(d, scn)) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB) {
          collect_symbols(d, scn, false, nullptr, img, bounds, reserve_more);
          used = path;
          break;
        }
      }
    }
    elf_cntl(d, ELF_C_FDDONE);
    if (used.empty()) img.elf_handles.pop_back();  // (nothing views it)
  }
  ::close(fd);
  return used;
}

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

/// img.funcs and img.reach from img.symbols and the .eh_frame FDEs of `e`
/// (section `eh_frame`; read here, as they come), and img.fde_count and
/// img.lsda_ranges, built in place: every fresh page costs (a page fault is
/// ~10-40 us in a VM), so no entry is built twice, no second vector is
/// merged into, and no temporary is bigger than it must be (the radix
/// sort's room is img.reach's).
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

std::shared_ptr<ElfImage> read_image(const std::string& path, int fd) {
  // (A guarded static, not std::call_once: libstdc++'s call_once reaches
  // its thread-local state through __tls_get_addr, which waits for a
  // dlopen() in flight on another thread, e.g. uprobe-trace's agent loading
  // Capstone beside this.)
  static const bool elf_ok = elf_version(EV_CURRENT) != EV_NONE;
  if (!elf_ok) throw Error(Errc::system, path, 0, "libelf initialisation failed");

  ElfHandle h;
  h.elf = elf_begin(fd, ELF_C_READ, nullptr);
  if (!h.elf) throw Error(Errc::not_executable, path, 0, std::string("not readable as ELF: ") + elf_errmsg(-1));
  Elf* e = h.elf;
  GElf_Ehdr eh;
  if (elf_kind(e) != ELF_K_ELF || !gelf_getehdr(e, &eh))
    throw Error(Errc::not_executable, path, 0, "not an ELF file");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != EM_X86_64)
    throw Error(Errc::not_executable, path, 0, "not an x86-64 (ELFCLASS64, EM_X86_64) ELF file");
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)
    throw Error(Errc::not_executable, path, 0,
                "not an executable or shared object (ELF type " + std::to_string(eh.e_type) + ")");

  auto img = std::make_shared<ElfImage>();
  Elf* const kept = h.elf;
  h.elf = nullptr;
  keep_elf(kept, *img);  // (its symbols' names are views of its string tables)
  img->type = eh.e_type;
  std::size_t nph = 0;
  if (elf_getphdrnum(e, &nph) != 0) nph = 0;
  for (std::size_t i = 0; i < nph; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(e, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD)
      img->loads.push_back({ph.p_offset, ph.p_vaddr, ph.p_filesz, ph.p_memsz, ph.p_flags});
  }
  if (img->loads.empty()) throw Error(Errc::not_executable, path, 0, "the ELF file has no PT_LOAD segment");

  std::size_t shstrndx = 0;
  if (elf_getshdrstrndx(e, &shstrndx) != 0) shstrndx = 0;
  Elf_Scn *symtab = nullptr, *dynsym = nullptr, *versym = nullptr, *verdef = nullptr, *dynamic = nullptr,
          *stapsdt = nullptr, *eh_frame = nullptr;
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) continue;
    switch (sh.sh_type) {
      case SHT_SYMTAB: if (!symtab) symtab = scn; break;
      case SHT_DYNSYM: if (!dynsym) dynsym = scn; break;
      case SHT_GNU_versym: if (!versym) versym = scn; break;
      case SHT_GNU_verdef: if (!verdef) verdef = scn; break;
      case SHT_DYNAMIC: if (!dynamic) dynamic = scn; break;
      default: break;
    }
    if (!shstrndx) continue;
    const char* name = section_name(e, shstrndx, sh);
    if (sh.sh_type == SHT_NOTE && std::strcmp(name, ".note.stapsdt") == 0 && !stapsdt) stapsdt = scn;
    else if (std::strcmp(name, ".stapsdt.base") == 0 && !img->stapsdt_base) img->stapsdt_base = sh.sh_addr;
    if (sh.sh_type == SHT_PROGBITS && !eh_frame && std::strcmp(name, ".eh_frame") == 0) eh_frame = scn;
  }
  img->has_symtab = symtab != nullptr;
  img->has_dynsym = dynsym != nullptr;
  read_verdef(e, verdef, img->version_names);
  const std::size_t ndynsym = symbol_count(dynsym);
  BoundsKeys bounds;
  if (symtab) collect_symbols(e, symtab, false, nullptr, *img, bounds, ndynsym);
  else img->debug_file = read_debug_symtab(e, *img, bounds, ndynsym);
  if (dynsym) collect_symbols(e, dynsym, true, versym, *img, bounds);
  index_functions(*img, bounds, e, eh_frame);
  if (dynamic) read_dynamic(e, dynamic, *img);
  if (stapsdt) {
    img->has_stapsdt_section = true;
    read_stapsdt(stapsdt, *img);
  }
  elf_cntl(e, ELF_C_FDDONE);  // everything is read: the caller closes fd
  return img;
}

}  // namespace

std::shared_ptr<const ElfImage> load_elf_image(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(Errc::file_not_found, path, 0, std::string("cannot open file: ") + std::strerror(err), err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(Errc::file_not_found, path, 0, std::string("cannot stat file: ") + std::strerror(err), err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const bool dir = S_ISDIR(st.st_mode);
    throw Error(Errc::not_executable, path, 0, dir ? "a directory, not a regular file" : "not a regular file",
                dir ? EISDIR : 0);
  }
  try {
    auto img = load_elf_image(fd, path, st);
    ::close(fd);
    return img;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

namespace {

/// The image cache (fork_fresh(): a fork child starts a fresh one).
struct ImageCache {
  using Key = std::tuple<dev_t, ino_t, off_t, long, long, long, long>;
  std::mutex mu;
  std::map<Key, std::shared_ptr<const ElfImage>> images;
};

/// The last ElfImage::serial given (a fork child goes on from its parent's).
std::atomic<std::uint64_t> g_serials{0};

}  // namespace

std::shared_ptr<const ElfImage> load_elf_image(int fd, const std::string& path, const struct stat& st) {
  ImageCache& c = fork_fresh<ImageCache>();
  const ImageCache::Key key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                            st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
  {
    std::lock_guard<std::mutex> g(c.mu);
    if (auto it = c.images.find(key); it != c.images.end()) return it->second;
  }
  std::shared_ptr<ElfImage> img = read_image(path, fd);
  img->dev = st.st_dev;
  img->ino = st.st_ino;
  std::lock_guard<std::mutex> g(c.mu);
  img->serial = g_serials.fetch_add(1, std::memory_order_relaxed) + 1;
  if (c.images.size() >= 64) c.images.clear();
  c.images.emplace(key, img);
  return img;
}

}  // namespace uprobe::detail
