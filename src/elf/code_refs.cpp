// SPDX-License-Identifier: MIT
/// @file code_refs.cpp
/// Code addresses stored in an ELF file's data (code_refs.hpp): read with
/// libelf from the relocation sections, or from the load segments' bytes.

#include "code_refs.hpp"

#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "fork_fresh.hpp"


namespace uprobe::detail {
namespace {

bool in_code(const ElfImage& img, std::uint64_t vaddr) {
  for (const LoadSegment& s : img.loads)
    if (s.executable() && vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz) return true;
  return false;
}

/// The RELATIVE relocations' addends that lie in code (ET_DYN).
bool relocated_refs(Elf* e, const ElfImage& img, bool (*is_relative)(std::uint32_t), std::vector<std::uint64_t>& out,
                    std::string& why) {
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) continue;
    if (sh.sh_type == SHT_REL || sh.sh_type == SHT_RELR) {
      why = std::string("the file has ") + (sh.sh_type == SHT_REL ? "SHT_REL" : "SHT_RELR") +
            " relocations, whose stored code addresses are not read";
      return false;
    }
    if (sh.sh_type != SHT_RELA || sh.sh_entsize == 0) continue;
    Elf_Data* d = elf_getdata(scn, nullptr);
    if (!d) continue;
    const std::size_t n = sh.sh_size / sh.sh_entsize;
    for (std::size_t i = 0; i < n; ++i) {
      GElf_Rela r;
      if (!gelf_getrela(d, static_cast<int>(i), &r)) break;
      const auto addend = static_cast<std::uint64_t>(r.r_addend);
      if (is_relative(static_cast<std::uint32_t>(GELF_R_TYPE(r.r_info))) && in_code(img, addend))
        out.push_back(addend);
    }
  }
  return true;
}

/// Every aligned quadword of the load segments' file bytes that lies in
/// code (ET_EXEC: addresses are stored as they are).
bool stored_refs(int fd, const ElfImage& img, std::vector<std::uint64_t>& out, std::string& why) {
  std::vector<std::uint64_t> buf(8192);
  for (const LoadSegment& s : img.loads) {
    std::uint64_t first = (s.vaddr + 7) & ~std::uint64_t{7};  // the first aligned address
    for (std::uint64_t a = first; a + 8 <= s.vaddr + s.filesz;) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), (s.vaddr + s.filesz - a) / 8));
      const ssize_t got = ::pread(fd, buf.data(), want * 8, static_cast<off_t>(s.offset + (a - s.vaddr)));
      if (got <= 0) {
        why = "cannot read the file's load segments";
        return false;
      }
      const std::size_t words = static_cast<std::size_t>(got) / 8;
      for (std::size_t i = 0; i < words; ++i)
        if (in_code(img, buf[i])) out.push_back(buf[i]);
      if (words == 0) break;
      a += words * 8;
    }
  }
  return true;
}

}  // namespace

std::shared_ptr<const std::vector<std::uint64_t>> data_code_refs(int fd, const std::string& path,
                                                                 const ElfImage& img,
                                                                 bool (*is_relative)(std::uint32_t type),
                                                                 std::string& why) {
  // Per image (ElfImage::serial: the file's content as read), not per
  // (device, inode): a file rewritten in place is a new image.
  struct Cache {
    std::mutex mu;
    std::map<std::uint64_t, std::shared_ptr<const std::vector<std::uint64_t>>> refs;
  };
  Cache& c = fork_fresh<Cache>();
  std::lock_guard<std::mutex> lock(c.mu);
  const std::uint64_t key = img.serial;
  if (auto it = c.refs.find(key); it != c.refs.end()) return it->second;
  if (c.refs.size() >= 64) c.refs.clear();  // (as the image cache: images of files long unloaded)
  auto refs = std::make_shared<std::vector<std::uint64_t>>();
  bool ok = false;
  if (img.type == ET_EXEC) {
    ok = stored_refs(fd, img, *refs, why);
  } else {
    std::string unready;
    if (!libelf_ready(unready)) {
      why = "cannot read " + path + " as ELF: " + unready;
      return nullptr;
    }
    Elf* e = elf_begin(fd, ELF_C_READ, nullptr);
    if (!e) {
      why = "cannot read " + path + " as ELF: " + elf_errmsg(-1);
      return nullptr;
    }
    ok = relocated_refs(e, img, is_relative, *refs, why);
    elf_end(e);
  }
  if (!ok) return nullptr;
  std::sort(refs->begin(), refs->end());
  refs->erase(std::unique(refs->begin(), refs->end()), refs->end());
  c.refs[key] = refs;
  return refs;
}

}  // namespace uprobe::detail
