// SPDX-License-Identifier: MIT
// The registry's ELF reader (src/elf/elf_info.cpp) on files with hostile symbol
// tables: a copy of this test's own executable whose function symbol has a
// size that makes start + size wrap around 2^64 (found by tests/fuzz
// fuzz_stapsdt). The function must still be found by the offsets it covers.

#include <fcntl.h>
#include <gelf.h>
#include <gtest/gtest.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "elf_info.hpp"

extern "C" __attribute__((noinline, used)) int elfinfo_fixture_fn(int x) {
  asm volatile("");
  return x * 3 + 1;
}

namespace {

std::vector<char> read_all(const char* path) {
  std::vector<char> buf;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return buf;
  char tmp[65536];
  for (ssize_t n; (n = ::read(fd, tmp, sizeof tmp)) > 0;) buf.insert(buf.end(), tmp, tmp + n);
  ::close(fd);
  return buf;
}

struct SymbolPlace {
  std::uint64_t size_field = 0;  ///< file offset of st_size
  std::uint64_t file_offset = 0; ///< file offset of the function's first byte
  std::uint64_t size = 0;
};

/// Where `name`'s .symtab entry and code are in the ELF file `fd`.
SymbolPlace find_symbol(int fd, const char* name) {
  SymbolPlace out;
  elf_version(EV_CURRENT);
  Elf* e = elf_begin(fd, ELF_C_READ, nullptr);
  if (!e) return out;
  std::size_t nph = 0;
  elf_getphdrnum(e, &nph);
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_SYMTAB) continue;
    Elf_Data* d = elf_getdata(scn, nullptr);
    for (std::size_t i = 0; d && i < sh.sh_size / sh.sh_entsize; ++i) {
      GElf_Sym s;
      if (!gelf_getsym(d, static_cast<int>(i), &s)) continue;
      const char* n = elf_strptr(e, sh.sh_link, s.st_name);
      if (!n || std::string(n) != name) continue;
      out.size_field = sh.sh_offset + i * sh.sh_entsize + 16;  // Elf64_Sym.st_size
      out.size = s.st_size;
      for (std::size_t k = 0; k < nph; ++k) {
        GElf_Phdr ph;
        if (gelf_getphdr(e, static_cast<int>(k), &ph) && ph.p_type == PT_LOAD && s.st_value >= ph.p_vaddr &&
            s.st_value < ph.p_vaddr + ph.p_filesz)
          out.file_offset = s.st_value - ph.p_vaddr + ph.p_offset;
      }
    }
  }
  elf_end(e);
  return out;
}

TEST(ElfInfo, FunctionWithWrappingSizeIsFound) {
  ASSERT_EQ(elfinfo_fixture_fn(2), 7);
  const std::vector<char> self = read_all("/proc/self/exe");
  ASSERT_GT(self.size(), 1000u);
  char path[] = "/tmp/uprobe-elfinfo-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, self.data(), self.size()), static_cast<ssize_t>(self.size()));
  const SymbolPlace place = find_symbol(fd, "elfinfo_fixture_fn");
  ASSERT_NE(place.size_field, 0u) << "no .symtab entry for the fixture";
  ASSERT_NE(place.file_offset, 0u);
  ASSERT_GT(place.size, 1u);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  std::string why;
  auto before = uprobe::detail::elf_info(fd, path, st, why);
  ASSERT_NE(before, nullptr) << why;
  const uprobe::detail::FuncSym* f = before->enclosing_function(place.file_offset + 1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->name, "elfinfo_fixture_fn");

  // st_size such that file_offset + size wraps to a small number.
  const std::uint64_t huge = 0 - place.file_offset + 0x13;
  ASSERT_EQ(::pwrite(fd, &huge, 8, static_cast<off_t>(place.size_field)), 8);
  const struct timespec times[2] = {{1, 0}, {1, 0}};  // a new cache key
  ASSERT_EQ(::futimens(fd, times), 0);
  ASSERT_EQ(::fstat(fd, &st), 0);
  auto after = uprobe::detail::elf_info(fd, path, st, why);
  ASSERT_NE(after, nullptr) << why;
  ASSERT_NE(after, before);
  for (std::uint64_t off : {place.file_offset, place.file_offset + 1, place.file_offset + place.size - 1}) {
    const uprobe::detail::FuncSym* g = after->enclosing_function(off);
    ASSERT_NE(g, nullptr) << "offset " << off;
    EXPECT_EQ(g->name, "elfinfo_fixture_fn") << "offset " << off;
    EXPECT_EQ(g->size, huge);
  }
  EXPECT_EQ(after->enclosing_function(place.file_offset - 1) == nullptr ||
                after->enclosing_function(place.file_offset - 1)->name != "elfinfo_fixture_fn",
            true);
  ::close(fd);
  ::unlink(path);
}

// The function index of real files: sorted by (file_offset, size), reach[i]
// the running maximum of the ends, and every function found again at its
// start with bounds no wider than its own. /usr/bin/true (stripped, a few
// .dynsym symbols and many FDEs whose starts no symbol covers) once read
// past `reach` while its FDEs were being added.
TEST(ElfInfo, FunctionIndexIsConsistent) {
  for (const char* path : {"/proc/self/exe", "/usr/bin/true", "/usr/lib/x86_64-linux-gnu/libc.so.6"}) {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path;
    struct stat st;
    ASSERT_EQ(::fstat(fd, &st), 0);
    std::string why;
    auto info = uprobe::detail::elf_info(fd, path, st, why);
    ::close(fd);
    ASSERT_NE(info, nullptr) << path << ": " << why;
    ASSERT_EQ(info->reach.size(), info->funcs.size()) << path;
    ASSERT_GT(info->funcs.size(), 10u) << path;
    std::uint64_t reach = 0;
    std::size_t fdes = 0, symbol_entries = 0;
    const uprobe::detail::FuncSym* last_symbol = nullptr;
    for (std::size_t i = 0; i < info->funcs.size(); ++i) {
      const auto& f = info->funcs[i];
      if (i) {
        const auto& p = info->funcs[i - 1];
        ASSERT_TRUE(p.file_offset < f.file_offset || (p.file_offset == f.file_offset && p.size <= f.size))
            << path << " index " << i;
      }
      if (f.source != uprobe::detail::BoundsSource::eh_frame) {
        // A symbol's entry: after the one before it by (bounds, source,
        // symbol_index), strictly, and that symbol's own bounds and name.
        if (last_symbol) {
          const auto& p = *last_symbol;
          EXPECT_TRUE(std::tie(p.file_offset, p.size, p.source, p.symbol_index) <
                      std::tie(f.file_offset, f.size, f.source, f.symbol_index))
              << path << " index " << i;
        }
        last_symbol = &f;
        ASSERT_LT(f.symbol_index, info->symbols.size()) << path << " index " << i;
        const auto& sym = info->symbols[f.symbol_index];
        EXPECT_EQ(sym.name, f.name) << path << " index " << i;
        EXPECT_EQ(sym.offset, f.file_offset) << path << " index " << i;
        EXPECT_EQ(sym.size, f.size) << path << " index " << i;
        ++symbol_entries;
      }
      reach = std::max(reach, f.file_offset + f.size);
      ASSERT_EQ(info->reach[i], reach) << path << " index " << i;
      const auto* g = info->enclosing_function(f.file_offset);
      ASSERT_NE(g, nullptr) << path << " index " << i;
      EXPECT_LE(g->size, f.size) << path << " index " << i;
      if (f.source == uprobe::detail::BoundsSource::eh_frame) {
        ++fdes;
        EXPECT_TRUE(f.name.empty());
        EXPECT_EQ(g, &f) << path << ": an FDE is added only where no symbol holds its start";
      }
    }
    EXPECT_LE(fdes, info->fde_count) << path;
    // Every sized function symbol in the file once (the index is a
    // permutation of them, the FDEs merged in).
    std::size_t sized = 0;
    for (const auto& sym : info->symbols)
      sized += (sym.type == STT_FUNC || sym.type == STT_GNU_IFUNC) && sym.size != 0 && sym.in_file && sym.executable;
    EXPECT_EQ(symbol_entries, sized) << path;
    if (std::string(path) == "/usr/bin/true") {
      EXPECT_GT(fdes, 10u) << "stripped: its bounds are FDEs";
    }
  }
}

}  // namespace
