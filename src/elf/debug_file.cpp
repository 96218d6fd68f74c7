// SPDX-License-Identifier: MIT
// The separate debug file of an image (debug_file.hpp): its build-id and
// path, and debug_file_refines(), the scan of its function bounds that says
// whether the file's own tables settle a function (elf_info.cpp's
// function_at()) without loading the debug file's symbols.
#include "debug_file.hpp"

#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "elf_image.hpp"
#include "fork_fresh.hpp"
#include "func_index.hpp"

namespace uprobe::detail {

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

/// Where the debug file of build-id `id` (build_id_hex()) would be: its
/// name in the system's debug directory; "" for no build-id.
std::string debug_file_path(const std::string& id) {
  if (id.empty()) return {};
  return "/usr/lib/debug/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
}

namespace {

/// The function bounds (file offset, size) of the debug file's .symtab of an
/// image (debug_file_refines()): its sized STT_FUNC / STT_GNU_IFUNC symbols
/// in an executable segment of the image. `ok` false when the file is not
/// the debug file of the image's build-id, or unreadable.
struct DebugBounds {
  std::uint64_t serial = 0;
  bool ok = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> funcs;
};

DebugBounds read_debug_bounds(const ElfImage& img) {
  DebugBounds b;
  b.serial = img.serial;
  const int fd = ::open(img.deferred_debug_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return b;
  // libelf finds the .symtab (it reads the headers only); its entries are
  // then streamed through a small buffer rather than read whole into fresh
  // memory (libc's: 240 KB, ~60 page faults), the raw Elf64_Sym layout of an
  // ELFCLASS64 file of this machine's byte order (checked).
  std::uint64_t sym_off = 0, sym_size = 0;
  std::string unready;  // (no elfutils: no bounds, as an unreadable file)
  if (Elf* d = libelf_ready(unready) ? elf_begin(fd, ELF_C_READ, nullptr) : nullptr) {
    GElf_Ehdr eh;
    if (elf_kind(d) == ELF_K_ELF && gelf_getehdr(d, &eh) && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
        eh.e_ident[EI_DATA] == ELFDATA2LSB && eh.e_machine == EM_X86_64 && build_id_hex(d) == img.deferred_build_id) {
      for (Elf_Scn* scn = elf_nextscn(d, nullptr); scn; scn = elf_nextscn(d, scn)) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB && sh.sh_entsize == sizeof(Elf64_Sym)) {
          sym_off = sh.sh_offset, sym_size = sh.sh_size - sh.sh_size % sizeof(Elf64_Sym);
          b.ok = true;
          break;
        }
      }
    }
    elf_end(d);
  }
  SegmentFinder segment_of(img);
  if (b.ok) b.funcs.reserve(static_cast<std::size_t>(sym_size / sizeof(Elf64_Sym) / 2));  // (its untouched part: no page)
  Elf64_Sym buf[512];
  for (std::uint64_t at = 0; b.ok && at < sym_size;) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buf, sym_size - at));
    const ssize_t got = ::pread(fd, buf, want, static_cast<off_t>(sym_off + at));
    if (got <= 0 || static_cast<std::size_t>(got) % sizeof(Elf64_Sym) != 0) {
      b.ok = false;  // (truncated meanwhile: the caller reads the image, which says so)
      break;
    }
    for (std::size_t i = at == 0 ? 1 : 0; i < static_cast<std::size_t>(got) / sizeof(Elf64_Sym); ++i) {
      const Elf64_Sym& sym = buf[i];
      const unsigned type = ELF64_ST_TYPE(sym.st_info);
      if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym.st_size == 0 || sym.st_shndx == SHN_UNDEF ||
          sym.st_shndx == SHN_ABS || sym.st_shndx == SHN_COMMON)
        continue;
      const LoadSegment* seg = segment_of(sym.st_value);
      if (!seg || !seg->executable()) continue;
      b.funcs.emplace_back(sym.st_value - seg->vaddr + seg->offset, sym.st_size);
    }
    at += static_cast<std::uint64_t>(got);
  }
  ::close(fd);
  return b;
}

/// The debug bounds read, the last few images' (fork_fresh(): a fork child
/// starts afresh).
struct DebugBoundsCache {
  std::mutex mu;
  std::vector<std::shared_ptr<const DebugBounds>> kept;
};

}  // namespace

namespace {

/// The debug bounds of `img`: the cached ones, else read now and cached.
std::shared_ptr<const DebugBounds> bounds_of(const ElfImage& img) {
  DebugBoundsCache& c = fork_fresh<DebugBoundsCache>();
  {
    std::lock_guard<std::mutex> g(c.mu);
    for (const auto& k : c.kept)
      if (k->serial == img.serial) return k;
  }
  auto b = std::make_shared<const DebugBounds>(read_debug_bounds(img));
  std::lock_guard<std::mutex> g(c.mu);
  if (c.kept.size() >= 8) c.kept.erase(c.kept.begin());
  c.kept.push_back(b);
  return b;
}

}  // namespace

void read_debug_bounds_of(const ElfImage& img) {
  if (img.debug_deferred) bounds_of(img);
}

bool debug_file_refines(const ElfImage& img, const FuncSym& fn, std::uint64_t off) {
  const std::shared_ptr<const DebugBounds> b = bounds_of(img);
  if (!b->ok) return true;
  for (const auto& [start, size] : b->funcs) {
    if (off < start || off - start >= size) continue;  // (no overflow: off >= start)
    if (size < fn.size || (size == fn.size && start != fn.file_offset)) return true;
  }
  return false;
}

bool cached_debug_bounds(const ElfImage& img, bool& ok, std::vector<std::pair<std::uint64_t, std::uint64_t>>& funcs) {
  DebugBoundsCache& c = fork_fresh<DebugBoundsCache>();
  std::lock_guard<std::mutex> g(c.mu);
  for (const auto& k : c.kept)
    if (k->serial == img.serial) {
      ok = k->ok;
      funcs = k->funcs;
      return true;
    }
  return false;
}

void adopt_debug_bounds(const ElfImage& img, bool ok, std::vector<std::pair<std::uint64_t, std::uint64_t>> funcs) {
  auto b = std::make_shared<DebugBounds>();
  b->serial = img.serial;
  b->ok = ok;
  b->funcs = std::move(funcs);
  DebugBoundsCache& c = fork_fresh<DebugBoundsCache>();
  std::lock_guard<std::mutex> g(c.mu);
  for (const auto& k : c.kept)
    if (k->serial == img.serial) return;
  if (c.kept.size() >= 8) c.kept.erase(c.kept.begin());
  c.kept.push_back(std::move(b));
}

}  // namespace uprobe::detail
