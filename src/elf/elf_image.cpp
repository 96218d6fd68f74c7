// SPDX-License-Identifier: MIT
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "elf_image.hpp"

#include <elfutils/libdw.h>
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
#include <unordered_map>

#include "debug_file.hpp"
#include "fork_fresh.hpp"
#include "func_index.hpp"
#include "populate.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

std::atomic<bool> g_elfutils_deferred{false};

// (libuprobe.a and uprobe-trace's command line link elfutils: here they
// are always there. libuprobe.so's elfutils_lazy.cpp defines the strong one.)
__attribute__((weak)) bool elfutils_available(std::string&) noexcept { return true; }

namespace {
/// libelf_ready() has succeeded.
std::atomic<bool> g_libelf_ready{false};
}  // namespace

bool libelf_ready(std::string& why) noexcept {
  // (An atomic, not std::call_once: libstdc++'s call_once reaches its
  // thread-local state through __tls_get_addr, which waits for a dlopen()
  // in flight on another thread, e.g. uprobe-trace's agent loading Capstone
  // beside this. A failure is not kept: the next read tries again.)
  if (g_libelf_ready.load(std::memory_order_acquire)) return true;
  if (!elfutils_available(why)) return false;
  if (elf_version(EV_CURRENT) == EV_NONE) {
    why = "libelf refuses its version (EV_CURRENT)";
    return false;
  }
  g_libelf_ready.store(true, std::memory_order_release);
  return true;
}

bool elfutils_load_pending() noexcept {
  return g_elfutils_deferred.load(std::memory_order_relaxed) && !g_libelf_ready.load(std::memory_order_acquire);
}

void prepare_elf_reads() noexcept {
  if (!elfutils_load_pending()) return;
  std::string why;
  (void)libelf_ready(why);
}

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

int binding_rank(const ElfSymbol& s) noexcept {
  switch (s.binding) {
    case STB_GLOBAL:
    case STB_GNU_UNIQUE: return 0;
    case STB_WEAK: return 1;
    default: return 2;
  }
}

namespace {

/// Among the aliases of one function's bounds, the one whose name to give
/// (messages, probe_info()'s bounds): a symbol's before an FDE's, an
/// exported (global or weak) one before a local one, a public name before
/// one with a leading '_' (glibc exports `lseek` weak beside its global
/// `__lseek`, `getc` beside `_IO_getc`: what a user wrote), the shortest
/// name (`lseek` before `llseek`), global before weak, a default version
/// before a hidden one, by name, the most trusted source. The same at every
/// ImageDepth: the debug file's copies of exported symbols tie with them but
/// for the source, its local aliases (`__GI_...`) lose.
bool named_before(const ElfImage& img, const FuncSym& a, const FuncSym& b) noexcept {
  const auto rank = [&](const FuncSym& f) {
    const bool sym = f.symbol_index < img.symbols.size();
    const ElfSymbol* s = sym ? &img.symbols[f.symbol_index] : nullptr;
    const int bind = s ? binding_rank(*s) : 3;
    return std::make_tuple(f.source == BoundsSource::eh_frame, bind >= 2, f.name.empty() || f.name[0] == '_',
                           f.name.size(), bind, s && s->hidden_version, f.name, f.source);
  };
  return rank(a) < rank(b);
}

}  // namespace

const FuncSym* ElfImage::enclosing_function(std::uint64_t off) const noexcept {
  // funcs is sorted by file_offset; bounds may nest or alias, so scan the
  // candidates that start at or before off and pick the tightest (among
  // aliases of the same bounds, named_before()'s first).
  auto it = std::upper_bound(funcs.begin(), funcs.end(), off,
                             [](std::uint64_t o, const FuncSym& f) { return o < f.file_offset; });
  const FuncSym* best = nullptr;
  for (int steps = 0; it != funcs.begin() && steps < 64; ++steps) {
    // No function from here back reaches past off: none of them holds it.
    if (reach[static_cast<std::size_t>(it - funcs.begin()) - 1] <= off) break;
    --it;
    // off - start < size: no overflow for a hostile st_size (off >= start here).
    if (off - it->file_offset >= it->size) continue;
    if (!best || it->size < best->size ||
        (it->size == best->size && it->file_offset == best->file_offset && named_before(*this, *it, *best)))
      best = &*it;
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
  populate_pages(img.symbols.data() + img.symbols.size(), n * sizeof(ElfSymbol));  // (this table's part of the room)
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

/// The .symtab of the separate debug file of `e`, found by build-id in the
/// system's debug directory (/usr/lib/debug/.build-id/xx/yyyy.debug, where
/// Debian's -dbg packages install them), its build-id checked: its symbols
/// enter `img` as .symtab symbols (mapped through img's own segments, as the
/// debug file's sections hold no code). Returns the debug file's path, or ""
/// when there is none (or it is unreadable, or another build).
std::string read_debug_symtab(Elf* e, ElfImage& img, BoundsKeys& bounds, std::size_t reserve_more) {
  const std::string id = build_id_hex(e);
  if (id.empty()) return {};
  const std::string path = debug_file_path(id);
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

std::shared_ptr<ElfImage> read_image(const std::string& path, int fd, ImageDepth depth) {
  if (std::string why; !libelf_ready(why)) throw Error(Errc::system, path, 0, "cannot read ELF files: " + why);

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
  if (!symtab) img->build_id = build_id_hex(e);
  if (symtab) {
    collect_symbols(e, symtab, false, nullptr, *img, bounds, ndynsym);
  } else if (depth == ImageDepth::with_debug_file) {
    img->debug_file = read_debug_symtab(e, *img, bounds, ndynsym);
  } else if (!img->build_id.empty()) {
    // (Left out only when there is one to read: else this is the
    // with_debug_file image too.)
    std::string dbg = debug_file_path(img->build_id);
    img->debug_deferred = ::access(dbg.c_str(), R_OK) == 0;
    if (img->debug_deferred) img->deferred_debug_file = std::move(dbg), img->deferred_build_id = img->build_id;
  }
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

std::shared_ptr<const ElfImage> load_elf_image(const std::string& path, ImageDepth depth) {
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
    auto img = load_elf_image(fd, path, st, depth);
    ::close(fd);
    return img;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

namespace {

/// The image cache (fork_fresh(): a fork child starts a fresh one). An
/// image read at ImageDepth::file_tables that left nothing out
/// (debug_deferred false) is cached at both depths.
struct ImageCache {
  using Key = std::tuple<dev_t, ino_t, off_t, long, long, long, long, ImageDepth>;
  struct Entry {
    std::shared_ptr<const ElfImage> image;
    std::string path;  ///< the path it was read by (export_elf_tables())
  };
  std::mutex mu;
  std::map<Key, Entry> images;
};

ImageCache::Key cache_key(const FileIdentity& id, ImageDepth d) {
  return ImageCache::Key{id.dev, id.ino, id.size, id.mtime_sec, id.mtime_nsec, id.ctime_sec, id.ctime_nsec, d};
}

/// The last ElfImage::serial given (a fork child goes on from its parent's).
std::atomic<std::uint64_t> g_serials{0};

}  // namespace

std::shared_ptr<const ElfImage> load_elf_image(int fd, const std::string& path, const struct stat& st,
                                               ImageDepth depth) {
  ImageCache& c = fork_fresh<ImageCache>();
  const FileIdentity id = FileIdentity::of(st);
  {
    std::lock_guard<std::mutex> g(c.mu);
    // (The deeper image answers for the shallower one.)
    if (auto it = c.images.find(cache_key(id, ImageDepth::with_debug_file)); it != c.images.end())
      return it->second.image;
    if (depth == ImageDepth::file_tables)
      if (auto it = c.images.find(cache_key(id, ImageDepth::file_tables)); it != c.images.end())
        return it->second.image;
  }
  std::shared_ptr<ElfImage> img = read_image(path, fd, depth);
  img->dev = st.st_dev;
  img->ino = st.st_ino;
  std::lock_guard<std::mutex> g(c.mu);
  img->serial = g_serials.fetch_add(1, std::memory_order_relaxed) + 1;
  if (c.images.size() >= 64) c.images.clear();
  // (Both depths, when nothing was left out or there was nothing to leave.)
  if (depth == ImageDepth::with_debug_file || !img->debug_deferred)
    c.images.insert_or_assign(cache_key(id, ImageDepth::with_debug_file), ImageCache::Entry{img, path});
  if (depth == ImageDepth::file_tables)
    c.images.insert_or_assign(cache_key(id, ImageDepth::file_tables), ImageCache::Entry{img, path});
  return img;
}

FileIdentity FileIdentity::of(const struct stat& st) noexcept {
  return FileIdentity{st.st_dev,          st.st_ino,          st.st_size,          st.st_mtim.tv_sec,
                      st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

std::vector<CachedImage> cached_images() {
  ImageCache& c = fork_fresh<ImageCache>();
  std::lock_guard<std::mutex> g(c.mu);
  std::vector<CachedImage> out;
  for (const auto& [key, e] : c.images) {
    const ImageDepth depth = std::get<7>(key);
    const std::shared_ptr<const ElfImage>& image = e.image;  // (clang 14: no capture of a structured binding)
    auto same = std::find_if(out.begin(), out.end(), [&](const CachedImage& o) { return o.image == image; });
    if (same != out.end()) {
      same->depths |= 1u << static_cast<unsigned>(depth);
      continue;
    }
    const FileIdentity id{std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key),
                          std::get<4>(key), std::get<5>(key), std::get<6>(key)};
    out.push_back({id, e.path, 1u << static_cast<unsigned>(depth), e.image});
  }
  return out;
}

bool adopt_image(const FileIdentity& id, const std::string& path, unsigned depths, std::shared_ptr<ElfImage> img) {
  ImageCache& c = fork_fresh<ImageCache>();
  std::lock_guard<std::mutex> g(c.mu);
  for (ImageDepth d : {ImageDepth::file_tables, ImageDepth::with_debug_file})
    if ((depths & (1u << static_cast<unsigned>(d))) && c.images.count(cache_key(id, d))) return false;
  img->dev = id.dev;
  img->ino = id.ino;
  img->serial = g_serials.fetch_add(1, std::memory_order_relaxed) + 1;
  if (c.images.size() >= 64) c.images.clear();
  for (ImageDepth d : {ImageDepth::file_tables, ImageDepth::with_debug_file})
    if (depths & (1u << static_cast<unsigned>(d))) c.images.insert_or_assign(cache_key(id, d), ImageCache::Entry{img, path});
  return true;
}

}  // namespace uprobe::detail

namespace uprobe {

void defer_elfutils() noexcept { detail::g_elfutils_deferred.store(true, std::memory_order_relaxed); }

}  // namespace uprobe
