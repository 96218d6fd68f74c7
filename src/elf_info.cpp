// SPDX-License-Identifier: MIT
#include "elf_info.hpp"

#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace uprobe::detail {

const ExecSegment* ElfInfo::exec_segment(std::uint64_t off) const noexcept {
  for (const ExecSegment& s : exec)
    if (off >= s.offset && off < s.offset + s.filesz) return &s;
  return nullptr;
}

const FuncSym* ElfInfo::enclosing_function(std::uint64_t off) const noexcept {
  // funcs is sorted by file_offset; symbols may nest or alias, so scan the
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

namespace {

using CacheKey = std::tuple<dev_t, ino_t, off_t, long, long>;

std::shared_ptr<ElfInfo> read_elf(int fd, std::string& why) {
  if (elf_version(EV_CURRENT) == EV_NONE) {
    why = "libelf initialisation failed";
    return nullptr;
  }
  Elf* e = elf_begin(fd, ELF_C_READ, nullptr);
  if (!e) {
    why = std::string("not readable as ELF: ") + elf_errmsg(-1);
    return nullptr;
  }
  auto info = std::make_shared<ElfInfo>();
  GElf_Ehdr eh;
  if (elf_kind(e) != ELF_K_ELF || !gelf_getehdr(e, &eh) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_machine != EM_X86_64) {
    why = "not an x86-64 ELF file";
    elf_end(e);
    return nullptr;
  }
  std::size_t nph = 0;
  elf_getphdrnum(e, &nph);
  for (std::size_t i = 0; i < nph; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(e, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
      info->exec.push_back({ph.p_offset, ph.p_filesz, ph.p_vaddr});
  }
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM) || !sh.sh_entsize)
      continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data) continue;
    std::size_t n = sh.sh_size / sh.sh_entsize;
    for (std::size_t i = 0; i < n; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
      const int type = GELF_ST_TYPE(sym.st_info);
      if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym.st_size == 0 || sym.st_shndx == SHN_UNDEF) continue;
      for (const ExecSegment& s : info->exec) {
        if (sym.st_value >= s.vaddr && sym.st_value < s.vaddr + s.filesz) {
          const char* name = elf_strptr(e, sh.sh_link, sym.st_name);
          info->funcs.push_back({name ? name : "", sym.st_value - s.vaddr + s.offset, sym.st_size});
          break;
        }
      }
    }
  }
  elf_end(e);
  // Sorted by (file_offset, size). The keys are sorted, not the symbols
  // (moving thousands of names was most of a cold attach's ELF cost): the
  // same std::sort on the same comparisons gives the same order, aliases
  // included.
  struct Key {
    std::uint64_t file_offset, size;
    std::size_t index;
  };
  std::vector<Key> keys;
  keys.reserve(info->funcs.size());
  for (std::size_t i = 0; i < info->funcs.size(); ++i)
    keys.push_back({info->funcs[i].file_offset, info->funcs[i].size, i});
  std::sort(keys.begin(), keys.end(),
            [](const Key& a, const Key& b) { return std::tie(a.file_offset, a.size) < std::tie(b.file_offset, b.size); });
  std::vector<FuncSym> sorted;
  sorted.reserve(keys.size());
  for (const Key& k : keys) sorted.push_back(std::move(info->funcs[k.index]));
  info->funcs = std::move(sorted);
  info->reach.reserve(info->funcs.size());
  std::uint64_t reach = 0;
  for (const FuncSym& f : info->funcs) {
    const std::uint64_t end = f.file_offset + f.size < f.file_offset ? ~std::uint64_t{0} : f.file_offset + f.size;
    reach = std::max(reach, end);
    info->reach.push_back(reach);
  }
  return info;
}

}  // namespace

std::shared_ptr<const ElfInfo> elf_info(int fd, const std::string& /*path*/, const struct stat& st, std::string& why) {
  static auto& cache = *new std::map<CacheKey, std::shared_ptr<ElfInfo>>;  // never destroyed (elf_image.cpp)
  CacheKey key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto info = read_elf(fd, why);
  if (info) {
    if (cache.size() > 256) cache.clear();
    cache.emplace(key, info);
  }
  return info;
}

}  // namespace uprobe::detail
