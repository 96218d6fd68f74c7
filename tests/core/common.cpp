// SPDX-License-Identifier: MIT
#include "common.hpp"

#include "proc_text.hpp"

#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace coretest {

namespace {
std::vector<std::uint8_t> read_file(const std::string& path) {
  std::vector<std::uint8_t> v;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return v;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    v.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < v.size()) {
      ssize_t n = ::read(fd, v.data() + got, v.size() - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    v.resize(got);
  }
  ::close(fd);
  return v;
}
}  // namespace

std::optional<ElfSym> elf_symbol(const std::string& path, const std::string& name) {
  std::vector<std::uint8_t> f = read_file(path);
  if (f.size() < sizeof(Elf64_Ehdr)) return std::nullopt;
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return std::nullopt;
  auto shdr = [&](unsigned i) {
    Elf64_Shdr s;
    std::memcpy(&s, f.data() + eh.e_shoff + std::size_t(i) * eh.e_shentsize, sizeof s);
    return s;
  };
  auto phdr = [&](unsigned i) {
    Elf64_Phdr p;
    std::memcpy(&p, f.data() + eh.e_phoff + std::size_t(i) * eh.e_phentsize, sizeof p);
    return p;
  };
  for (unsigned type : {unsigned(SHT_SYMTAB), unsigned(SHT_DYNSYM)}) {
    for (unsigned i = 0; i < eh.e_shnum; ++i) {
      Elf64_Shdr sh = shdr(i);
      if (sh.sh_type != type) continue;
      Elf64_Shdr str = shdr(sh.sh_link);
      for (std::uint64_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
        Elf64_Sym sym;
        std::memcpy(&sym, f.data() + sh.sh_offset + k * sizeof(Elf64_Sym), sizeof sym);
        if (sym.st_name == 0 || sym.st_shndx == SHN_UNDEF) continue;
        const char* nm = reinterpret_cast<const char*>(f.data() + str.sh_offset + sym.st_name);
        if (name != nm) continue;
        for (unsigned j = 0; j < eh.e_phnum; ++j) {
          Elf64_Phdr ph = phdr(j);
          if (ph.p_type == PT_LOAD && sym.st_value >= ph.p_vaddr && sym.st_value < ph.p_vaddr + ph.p_filesz) {
            return ElfSym{sym.st_value, sym.st_size, sym.st_value - ph.p_vaddr + ph.p_offset};
          }
        }
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

std::string self_exe() {
  char buf[PATH_MAX];
  if (!realpath("/proc/self/exe", buf)) return {};
  return buf;
}

std::vector<std::uint8_t> file_bytes(const std::string& path, std::uint64_t offset, std::size_t len) {
  std::vector<std::uint8_t> v(len);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << "open " << path;
  if (fd < 0) return {};
  ssize_t n = ::pread(fd, v.data(), len, static_cast<off_t>(offset));
  ::close(fd);
  EXPECT_EQ(n, static_cast<ssize_t>(len)) << "pread " << path << " @" << offset;
  if (n != static_cast<ssize_t>(len)) return {};
  return v;
}

std::vector<std::uint8_t> mem_bytes(const void* addr, std::size_t len) {
  const volatile std::uint8_t* p = static_cast<const volatile std::uint8_t*>(addr);
  std::vector<std::uint8_t> v(len);
  for (std::size_t i = 0; i < len; ++i) v[i] = p[i];
  return v;
}

/// Every mapping (libuprobe's copied pages shown as their files': proc_text.hpp read_maps()).
static std::vector<Mapping> all_mappings() {
  std::vector<Mapping> out;
  for (const uprobe_test::MapLine& l : uprobe_test::read_maps()) out.push_back(Mapping{l.start, l.end, l.perms, l.offset, l.path});
  return out;
}

std::optional<Mapping> mapping_of(const void* addr) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  for (const auto& m : all_mappings())
    if (a >= m.start && a < m.end) return m;
  return std::nullopt;
}

MappingSnapshot snapshot_mapping(const void* addr) {
  MappingSnapshot s;
  auto m = mapping_of(addr);
  EXPECT_TRUE(m.has_value());
  if (!m) return s;
  s.map = *m;
  s.bytes = mem_bytes(reinterpret_cast<const void*>(m->start), m->end - m->start);
  return s;
}

std::string diff_snapshot(const MappingSnapshot& before) {
  auto now = mapping_of(reinterpret_cast<const void*>(before.map.start));
  if (!now) return "mapping vanished";
  std::ostringstream os;
  if (now->start != before.map.start || now->end != before.map.end || now->perms != before.map.perms)
    os << "mapping changed: " << hex(before.map.start) << "-" << hex(before.map.end) << " " << before.map.perms
       << " -> " << hex(now->start) << "-" << hex(now->end) << " " << now->perms << "; ";
  auto bytes = mem_bytes(reinterpret_cast<const void*>(before.map.start), before.bytes.size());
  std::size_t diffs = 0, first = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != before.bytes[i]) {
      if (diffs++ == 0) first = i;
    }
  if (diffs)
    os << diffs << " byte(s) differ, first at " << hex(before.map.start + first) << ": "
       << hex(before.bytes[first]) << " -> " << hex(bytes[first]);
  return os.str();
}

namespace {
bool snapshot_worthy(const Mapping& m) {
  return m.perms.size() >= 3 && m.perms[0] == 'r' && m.perms[2] == 'x' && m.path != "[vsyscall]" &&
         m.path != "[vvar]";
}
}  // namespace

ExecSnapshot snapshot_exec() {
  ExecSnapshot s;
  for (const Mapping& m : all_mappings()) {
    if (!snapshot_worthy(m)) continue;
    MappingSnapshot ms;
    ms.map = m;
    ms.bytes.resize(m.end - m.start);
    std::memcpy(ms.bytes.data(), reinterpret_cast<const void*>(m.start), ms.bytes.size());
    s.maps.push_back(std::move(ms));
  }
  return s;
}

std::string diff_exec(const ExecSnapshot& before) {
  std::ostringstream os;
  std::vector<Mapping> now;
  for (const Mapping& m : all_mappings())
    if (snapshot_worthy(m)) now.push_back(m);
  if (now.size() != before.maps.size()) os << "executable mappings: " << before.maps.size() << " -> " << now.size() << "; ";
  for (const Mapping& m : now) {
    bool found = false;
    for (const MappingSnapshot& b : before.maps)
      if (b.map.start == m.start && b.map.end == m.end && b.map.perms == m.perms) {
        found = true;
        if (std::memcmp(b.bytes.data(), reinterpret_cast<const void*>(m.start), b.bytes.size()) != 0) {
          std::string d = diff_snapshot(b);
          os << m.path << ": " << d << "; ";
        }
      }
    if (!found) os << "new executable mapping " << hex(m.start) << "-" << hex(m.end) << " " << m.perms << " " << m.path << "; ";
  }
  return os.str();
}

std::string hex_bytes(const std::vector<std::uint8_t>& v) {
  std::string s;
  char b[4];
  for (auto c : v) {
    std::snprintf(b, sizeof b, "%02x ", c);
    s += b;
  }
  if (!s.empty()) s.pop_back();
  return s;
}

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

bool names_offset(const std::string& text, std::uint64_t off) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  auto has_token = [&](const std::string& tok) {
    for (std::size_t p = lower.find(tok); p != std::string::npos; p = lower.find(tok, p + 1)) {
      bool left_ok = p == 0 || !std::isalnum(static_cast<unsigned char>(lower[p - 1]));
      std::size_t e = p + tok.size();
      bool right_ok = e >= lower.size() || !std::isxdigit(static_cast<unsigned char>(lower[e]));
      if (left_ok && right_ok) return true;
    }
    return false;
  };
  char h[24];
  std::snprintf(h, sizeof h, "0x%llx", static_cast<unsigned long long>(off));
  return has_token(std::to_string(off)) || has_token(h);
}

}  // namespace coretest

namespace {

/// tests/core is the int3 suite: probes at function entries and inside
/// functions trap, as they did before entry and window optimization existed. The runner's Mode::entry_opt and
/// tests/opt/entry_test.cpp cover optimized function entries.
class Int3PathEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    uprobe::Config c = uprobe::configuration();
    c.optimize_entries = false;
    c.optimize_windows = false;
    uprobe::configure(c);
  }
};

[[maybe_unused]] testing::Environment* const g_int3_env = testing::AddGlobalTestEnvironment(new Int3PathEnvironment);

}  // namespace
