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

#include <climits>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "eh_frame.hpp"
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

/// The bytes of the .eh_frame section of the ELF file `fd`, and where it is
/// in the file (0: none).
struct EhFrame {
  std::vector<unsigned char> bytes;
  std::uint64_t file_offset = 0;
};
EhFrame read_eh_frame(int fd) {
  EhFrame out;
  elf_version(EV_CURRENT);
  Elf* e = elf_begin(fd, ELF_C_READ, nullptr);
  std::size_t shstrndx = 0;
  if (!e || elf_getshdrstrndx(e, &shstrndx) != 0) {
    if (e) elf_end(e);
    return out;
  }
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    const char* n = gelf_getshdr(scn, &sh) ? elf_strptr(e, shstrndx, sh.sh_name) : nullptr;
    if (!n || std::strcmp(n, ".eh_frame") != 0) continue;
    if (Elf_Data* d = elf_rawdata(scn, nullptr); d && d->d_buf) {
      const auto* b = static_cast<const unsigned char*>(d->d_buf);
      out.bytes.assign(b, b + d->d_size);
      out.file_offset = sh.sh_offset;
    }
    break;
  }
  elf_end(e);
  return out;
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

// The image's .eh_frame walk (next_cfi_entry(): FDEs read in place, the rest
// by libdw) gives libdw's dwarf_next_cfi() answer entry by entry, on real
// sections and on damaged ones (bits flipped, bytes overwritten, cut short):
// the same result, the same next offset, the same FDE bounds and CIE.
TEST(EhFrame, EntriesAreReadAsLibdwReadsThem) {
  std::mt19937_64 rng(20261203);
  for (const char* path : {"/proc/self/exe", "/usr/lib/x86_64-linux-gnu/libc.so.6"}) {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path;
    const EhFrame eh = read_eh_frame(fd);
    ::close(fd);
    ASSERT_GT(eh.bytes.size(), 64u) << path;
    unsigned char ident[EI_NIDENT] = {ELFMAG0, ELFMAG1, ELFMAG2, ELFMAG3, ELFCLASS64, ELFDATA2LSB, EV_CURRENT};
    std::size_t entries = 0;
    for (int round = 0; round < 200; ++round) {
      std::vector<unsigned char> bytes = eh.bytes;
      std::size_t size = bytes.size();
      if (round % 3 == 1) size = static_cast<std::size_t>(rng() % size);
      for (int k = 0, n = round == 0 ? 0 : 1 + static_cast<int>(rng() % 8); k < n && size > 0; ++k) {
        const std::size_t at = static_cast<std::size_t>(rng() % size);
        const unsigned flip = 1u << (rng() % 8);
        bytes[at] = static_cast<unsigned char>(round % 2 ? rng() : bytes[at] ^ flip);
      }
      Elf_Data data{};
      data.d_buf = bytes.data();
      data.d_type = ELF_T_BYTE;
      data.d_size = size;
      Dwarf_Off off = 0;
      for (int step = 0; step < 100000; ++step, ++entries) {
        Dwarf_Off ours_next = 0, libdw_next = 0;
        Dwarf_CFI_Entry ours, libdw;
        std::memset(&ours, 0, sizeof ours);
        std::memset(&libdw, 0, sizeof libdw);
        const char* id = reinterpret_cast<const char*>(ident);
        const int r1 = uprobe::detail::next_cfi_entry(id, &data, off, ours_next, ours);
        const int r2 = dwarf_next_cfi(ident, &data, true, off, &libdw_next, &libdw);
        ASSERT_EQ(r1, r2) << path << " round " << round << " offset " << off;
        if (r1 != 0) break;
        ASSERT_EQ(ours_next, libdw_next) << path << " round " << round << " offset " << off;
        ASSERT_EQ(dwarf_cfi_cie_p(&ours), dwarf_cfi_cie_p(&libdw)) << path << " round " << round << " offset " << off;
        if (!dwarf_cfi_cie_p(&ours)) {
          EXPECT_EQ(ours.fde.CIE_pointer, libdw.fde.CIE_pointer) << path << " round " << round << " offset " << off;
          EXPECT_EQ(ours.fde.start, libdw.fde.start) << path << " round " << round << " offset " << off;
          EXPECT_EQ(ours.fde.end, libdw.fde.end) << path << " round " << round << " offset " << off;
        }
        if (ours_next <= off) break;
        off = ours_next;
      }
    }
    EXPECT_GT(entries, 1000u) << path;
  }
}

// An .eh_frame entry whose length runs past the section ends the walk there:
// the FDEs before it are read, the image is built, its index consistent.
TEST(ElfInfo, EhFrameEntryPastTheSectionEndsTheWalk) {
  const std::vector<char> self = read_all("/proc/self/exe");
  ASSERT_GT(self.size(), 1000u);
  char path[] = "/tmp/uprobe-elfinfo-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, self.data(), self.size()), static_cast<ssize_t>(self.size()));
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  std::string why;
  auto before = uprobe::detail::elf_info(fd, path, st, why);
  ASSERT_NE(before, nullptr) << why;
  ASSERT_GT(before->fde_count, 20u);
  // The entry in the middle of the section (walked to by the lengths).
  const EhFrame eh = read_eh_frame(fd);
  ASSERT_GT(eh.bytes.size(), 64u);
  std::size_t off = 0;
  while (off + 8 < eh.bytes.size() / 2) {
    std::uint32_t len = 0;
    std::memcpy(&len, eh.bytes.data() + off, 4);
    ASSERT_NE(len, 0u);
    ASSERT_NE(len, 0xffffffffu);
    off += 4 + len;
  }
  const std::uint32_t too_long = static_cast<std::uint32_t>(eh.bytes.size());
  ASSERT_EQ(::pwrite(fd, &too_long, 4, static_cast<off_t>(eh.file_offset + off)), 4);
  const struct timespec times[2] = {{1, 0}, {1, 0}};  // a new cache key
  ASSERT_EQ(::futimens(fd, times), 0);
  ASSERT_EQ(::fstat(fd, &st), 0);
  auto after = uprobe::detail::elf_info(fd, path, st, why);
  ::close(fd);
  ::unlink(path);
  ASSERT_NE(after, nullptr) << why;
  EXPECT_GT(after->fde_count, 0u);
  EXPECT_LT(after->fde_count, before->fde_count);
  ASSERT_EQ(after->reach.size(), after->funcs.size());
  for (std::size_t i = 1; i < after->funcs.size(); ++i) {
    const auto &p = after->funcs[i - 1], &f = after->funcs[i];
    ASSERT_TRUE(p.file_offset < f.file_offset || (p.file_offset == f.file_offset && p.size <= f.size)) << i;
    ASSERT_GE(after->reach[i], after->reach[i - 1]) << i;
  }
}

namespace {

/// libc.so.6 as this process loaded it (its canonical path), and whether
/// its debug file is installed (libc6-dbg): the image at
/// ImageDepth::file_tables then leaves it out.
std::string loaded_libc() {
  char buf[PATH_MAX];
  return ::realpath("/lib/x86_64-linux-gnu/libc.so.6", buf) ? std::string(buf) : std::string();
}

std::shared_ptr<const uprobe::detail::ElfInfo> libc_image(uprobe::detail::ImageDepth depth, int& fd,
                                                          struct stat& st) {
  const std::string path = loaded_libc();
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fstat(fd, &st) != 0) return nullptr;
  std::string why;
  return uprobe::detail::elf_info(fd, path, st, why, depth);
}

}  // namespace

// The image at ImageDepth::file_tables of a file with its own .symtab is the
// one image of it (nothing to leave out): the same object at both depths.
TEST(ImageDepth, AFileWithItsOwnSymtabHasOneImage) {
  int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  std::string why;
  const auto own = uprobe::detail::elf_info(fd, "/proc/self/exe", st, why, uprobe::detail::ImageDepth::file_tables);
  ASSERT_NE(own, nullptr) << why;
  EXPECT_TRUE(own->has_symtab);
  EXPECT_FALSE(own->debug_deferred);
  const auto full = uprobe::detail::elf_info(fd, "/proc/self/exe", st, why, uprobe::detail::ImageDepth::with_debug_file);
  EXPECT_EQ(own.get(), full.get());
  ::close(fd);
}

// Debian's libc (no .symtab) with libc6-dbg: the file_tables image has the
// .dynsym symbols only, the with_debug_file image the debug file's too; and
// at the entry of every exported function, and at the middle of it, both
// give the same bounds and name the same alias: the debug file adds names,
// not bounds, there (debug_file_refines() says so for none of them: what
// function_at() then answers from the file's own tables, elf_info.hpp). At an offset inside a function
// only the debug file names, function_at() goes deeper and says which.
TEST(ImageDepth, LibcExportedFunctionsHaveTheSameBoundsWithoutItsDebugFile) {
  using uprobe::detail::ImageDepth;
  int fd = -1;
  struct stat st {};
  const auto own = libc_image(ImageDepth::file_tables, fd, st);
  ASSERT_NE(own, nullptr);
  if (!own->debug_deferred) {
    ::close(fd);
    GTEST_SKIP() << "libc's debug file is not installed (apt-get install libc6-dbg), or libc has a .symtab";
  }
  EXPECT_TRUE(own->debug_file.empty());
  for (const auto& s : own->symbols) ASSERT_TRUE(s.dynamic) << s.name;
  std::string why;
  const auto full = uprobe::detail::elf_info(fd, loaded_libc(), st, why, ImageDepth::with_debug_file);
  ASSERT_NE(full, nullptr) << why;
  EXPECT_NE(own.get(), full.get());
  EXPECT_FALSE(full->debug_file.empty());
  EXPECT_GT(full->symbols.size(), own->symbols.size() + 1000);
  std::size_t checked = 0;
  for (const auto& s : own->symbols) {
    if (s.type != STT_FUNC || !s.executable || s.size == 0) continue;
    for (const std::uint64_t off : {s.offset, s.offset + s.size / 2}) {
      const uprobe::detail::FuncSym* a = own->enclosing_function(off);
      const uprobe::detail::FuncSym* b = full->enclosing_function(off);
      ASSERT_NE(a, nullptr) << s.name;
      ASSERT_NE(b, nullptr) << s.name;
      EXPECT_EQ(std::make_pair(a->file_offset, a->size), std::make_pair(b->file_offset, b->size))
          << s.name << "+" << off - s.offset << ": " << a->display_name() << " against " << b->display_name();
      // The same alias named (messages): not the table order of either depth.
      EXPECT_EQ(a->display_name(), b->display_name()) << s.name << "+" << off - s.offset;
      EXPECT_FALSE(uprobe::detail::debug_file_refines(*own, *a, off)) << s.name << "+" << off - s.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 4000u);
  // __strlen_sse2: a local function (.eh_frame bounds only, in the
  // file_tables image); function_at() answers from the debug file's symbols.
  const uprobe::detail::ElfSymbol* local = nullptr;
  for (const auto& s : full->symbols)
    if (s.name == "__strlen_sse2" && s.size > 0) local = &s;
  ASSERT_NE(local, nullptr);
  const uprobe::detail::FuncSym* shallow = own->enclosing_function(local->offset + 4);
  ASSERT_NE(shallow, nullptr);
  EXPECT_EQ(shallow->source, uprobe::detail::BoundsSource::eh_frame);
  std::shared_ptr<const uprobe::detail::ElfInfo> info = own;
  const uprobe::detail::FuncSym* deep = uprobe::detail::function_at(info, fd, loaded_libc(), st, local->offset + 4);
  ASSERT_NE(deep, nullptr);
  EXPECT_EQ(deep->name, "__strlen_sse2");
  EXPECT_EQ(deep->source, uprobe::detail::BoundsSource::debuginfo);
  EXPECT_EQ(info.get(), full.get()) << "function_at() keeps the deeper image for the caller";
  // An exported function's entry: the file's own tables answer, no deeper image.
  for (const auto& s : own->symbols) {
    if (s.name != "malloc") continue;
    info = own;
    const uprobe::detail::FuncSym* m = uprobe::detail::function_at(info, fd, loaded_libc(), st, s.offset);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->file_offset, s.offset);
    EXPECT_EQ(m->source, uprobe::detail::BoundsSource::dynsym);
    EXPECT_EQ(m->name, "malloc");  // (not __libc_malloc, its alias: named_before())
  }
  // Public names before internal ones, whatever their binding: glibc's weak
  // lseek, getc, socket beside the global __lseek, _IO_getc, __socket.
  for (const char* want : {"lseek", "getc", "socket", "strdup", "fwrite", "system"}) {
    const uprobe::detail::ElfSymbol* e = nullptr;
    for (const auto& s : own->symbols)
      if (s.name == want && s.type == STT_FUNC) e = &s;
    ASSERT_NE(e, nullptr) << want;
    for (const auto& img : {own, full}) {
      const uprobe::detail::FuncSym* f = img->enclosing_function(e->offset + 1);
      ASSERT_NE(f, nullptr) << want;
      EXPECT_EQ(f->name, want);
    }
    EXPECT_EQ(info.get(), own.get());
  }
  ::close(fd);
}
