// SPDX-License-Identifier: MIT
#include "ld_cache.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string_view>

namespace uptrace {

std::optional<std::string> ld_cache_lookup(const std::string& name) {
  // (One read of the whole file: an istreambuf_iterator copy of its ~40 KB
  // took ~0.1 ms of a bpftrace program's start.)
  std::string c;
  {
    const int fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && st.st_size < (1 << 26)) {
      c.resize(static_cast<std::size_t>(st.st_size));
      std::size_t got = 0;
      while (got < c.size()) {
        const ssize_t n = read(fd, c.data() + got, c.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      c.resize(got);
    }
    close(fd);
  }
  constexpr char kMagic[] = "glibc-ld.so.cache1.1";
  constexpr std::size_t kHeader = 48, kEntry = 24;  // struct cache_file_new, struct file_entry_new
  if (c.size() < kHeader || c.compare(0, sizeof kMagic - 1, kMagic) != 0) return std::nullopt;
  auto u32 = [&](std::size_t at) {
    std::uint32_t v;
    std::memcpy(&v, c.data() + at, sizeof v);
    return v;
  };
  const std::uint32_t nlibs = u32(20);
  if (nlibs > (c.size() - kHeader) / kEntry) return std::nullopt;
  auto str = [&](std::uint32_t off) -> std::string_view {
    if (off >= c.size()) return {};
    const char* b = c.data() + off;
    return {b, strnlen(b, c.size() - off)};
  };
  const std::string prefix = name + ".so";
  for (std::uint32_t i = 0; i < nlibs; ++i) {
    const std::size_t e = kHeader + i * kEntry;
    const std::uint32_t flags = u32(e);
    // FLAG_ELF_LIBC6 with FLAG_X8664_LIB64: "(libc6,x86-64)"
    if ((flags & 0xff) != 0x03 || (flags & 0xff00) != 0x0300) continue;
    if (str(u32(e + 4)).substr(0, prefix.size()) == prefix) return std::string(str(u32(e + 8)));
  }
  return std::string();
}

std::string ld_cache_path(const std::string& name) {
  if (name.rfind("lib", 0) != 0 || name.find('/') != std::string::npos) return {};
  static std::map<std::string, std::string> memo;
  if (auto it = memo.find(name); it != memo.end()) return it->second;
  // (The cache read in place: `ldconfig -p` through popen() cost ~2 ms of
  // every bpftrace program's start.)
  if (std::optional<std::string> direct = ld_cache_lookup(name)) return memo[name] = *direct;
  std::string found;
  for (const char* ldconfig : {"/sbin/ldconfig", "/usr/sbin/ldconfig"}) {
    if (access(ldconfig, X_OK) != 0) continue;
    std::FILE* f = popen((std::string(ldconfig) + " -p 2>/dev/null").c_str(), "re");
    if (!f) break;
    char line[4096];
    while (found.empty() && std::fgets(line, sizeof line, f)) {
      // "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"
      std::string l(line);
      const auto open = l.find(" ("), arrow = l.find(") => ");
      if (open == std::string::npos || arrow == std::string::npos) continue;
      std::size_t b = 0;
      while (b < l.size() && std::isspace(static_cast<unsigned char>(l[b]))) ++b;
      const std::string soname = l.substr(b, open - b), flags = l.substr(open + 2, arrow - open - 2);
      if (soname.rfind(name + ".so", 0) != 0 || flags.find("x86-64") == std::string::npos) continue;
      found = l.substr(arrow + 5);
      while (!found.empty() && (found.back() == '\n' || found.back() == ' ')) found.pop_back();
    }
    pclose(f);
    break;
  }
  return memo[name] = found;
}

}  // namespace uptrace
