// SPDX-License-Identifier: MIT
#include "opt_common.hpp"

#include "proc_text.hpp"
#include "punned_range.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <sstream>

namespace opttest {

std::vector<Mapping> read_maps() {
  std::vector<Mapping> out;
  for (const uprobe_test::MapLine& l : uprobe_test::read_maps())
    out.push_back(Mapping{l.start, l.end, l.perms, l.offset, l.path, l.line});
  return out;
}

std::optional<Mapping> mapping_of(std::uint64_t addr) {
  for (const Mapping& m : read_maps())
    if (addr >= m.start && addr < m.end) return m;
  return std::nullopt;
}

std::vector<std::string> rwx_mappings() { return uprobe_test::rwx_mappings(); }

std::vector<std::uint8_t> mem(const void* addr, std::size_t len) {
  const volatile std::uint8_t* p = static_cast<const volatile std::uint8_t*>(addr);
  std::vector<std::uint8_t> v(len);
  for (std::size_t i = 0; i < len; ++i) v[i] = p[i];
  return v;
}

std::vector<std::uint8_t> file_bytes_at(const void* addr, std::size_t len) {
  const auto a = reinterpret_cast<std::uint64_t>(addr);
  auto m = mapping_of(a);
  EXPECT_TRUE(m.has_value()) << "no mapping holds " << hex(a);
  if (!m) return {};
  // The fixtures live in the test executable: read its file through /proc/self/exe.
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  EXPECT_GT(n, 0);
  if (n <= 0) return {};
  exe[n] = 0;
  EXPECT_EQ(m->path, std::string(exe)) << "the mapping at " << hex(a) << " is not the executable";
  std::vector<std::uint8_t> v(len);
  int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  if (fd < 0) return {};
  const std::uint64_t off = m->offset + (a - m->start);
  ssize_t got = ::pread(fd, v.data(), len, static_cast<off_t>(off));
  ::close(fd);
  EXPECT_EQ(got, static_cast<ssize_t>(len)) << "pread /proc/self/exe @" << hex(off);
  if (got != static_cast<ssize_t>(len)) return {};
  return v;
}

uprobe::ProbeMode punned_form_here(const void* site, std::size_t len, uprobe::ProbeMode got,
                                   uprobe::ProbeMode want) {
  if (want != uprobe::ProbeMode::optimized_punned || got != uprobe::ProbeMode::optimized_padded) return want;
  const std::vector<std::uint8_t> file = file_bytes_at(site, 8);
  std::string free_page;
  return uprobe_test::punned_range_taken(reinterpret_cast<std::uint64_t>(site), len, 0, file.data(), free_page)
             ? got
             : want;
}

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::string hex_bytes(const std::vector<std::uint8_t>& v) {
  std::string s;
  char b[4];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(b, sizeof b, "%02x", v[i]);
    if (i) s += ' ';
    s += b;
  }
  return s;
}

std::size_t jump_pad(const void* site) {
  const std::vector<std::uint8_t> b = mem(site, 4);
  std::size_t pad = 0;
  while (pad < 3 && (b[pad] == 0x26 || b[pad] == 0x36 || b[pad] == 0x3e)) ++pad;
  return b[pad] == 0xE9 ? pad : 0;
}

std::uint64_t jump_target(const void* site) {
  const std::size_t pad = jump_pad(site);
  auto b = mem(site, pad + 5);
  if (b[pad] != 0xE9) return 0;
  std::int32_t rel;
  std::memcpy(&rel, b.data() + pad + 1, 4);
  return reinterpret_cast<std::uint64_t>(site) + pad + 5 + static_cast<std::int64_t>(rel);
}

std::string check_jump_into_xol(const void* site) {
  auto b = mem(site, jump_pad(site) + 5);
  if (b[b.size() - 5] != 0xE9)
    return "site " + hex(reinterpret_cast<std::uint64_t>(site)) + " holds " + hex_bytes(b) + ", not e9 rel32";
  const std::uint64_t t = jump_target(site);
  auto m = mapping_of(t);
  if (!m) return "jump target " + hex(t) + " is in no mapping";
  if (m->path.find("libuprobe-xol") == std::string::npos)
    return "jump target " + hex(t) + " is not in XOL memory: " + m->line;
  if (m->perms.size() < 3 || m->perms[0] != 'r' || m->perms[1] != '-' || m->perms[2] != 'x')
    return "XOL mapping of the jump target is not r-x: " + m->line;
  return "";
}

void set_optimize(bool on) {
  uprobe::Config c = uprobe::configuration();
  c.optimize = on;
  uprobe::configure(c);
}

}  // namespace opttest
