// SPDX-License-Identifier: MIT
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "common.hpp"
#include "proc_text.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace usdttest {

std::string canonical(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

std::string self_exe() { return canonical("/proc/self/exe"); }

std::optional<MapsOffset> maps_offset(const void* addr) {
  // (libuprobe's copied pages shown as their files': proc_text.hpp read_maps())
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  for (const uprobe_test::MapLine& m : uprobe_test::read_maps())
    if (a >= m.start && a < m.end && !m.path.empty() && m.path[0] == '/')
      return MapsOffset{canonical(m.path), m.offset + (a - m.start)};
  return std::nullopt;
}

std::uintptr_t load_bias(const void* addr) {
  Dl_info info;
  struct link_map* lm = nullptr;
  if (!dladdr1(addr, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) || !lm) {
    ADD_FAILURE() << "dladdr1 failed";
    return 0;
  }
  return lm->l_addr;
}

std::vector<Seg> main_program_loads() {
  std::vector<Seg> segs;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* data) {
        auto* out = static_cast<std::vector<Seg>*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD) out->push_back({ph.p_offset, ph.p_vaddr, ph.p_filesz, (ph.p_flags & PF_X) != 0});
        }
        return 1;  // the main program only
      },
      &segs);
  return segs;
}

std::vector<std::uint8_t> file_bytes(const std::string& path, std::uint64_t offset, std::size_t len) {
  std::vector<std::uint8_t> b(len);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return {};
  ssize_t n = ::pread(fd, b.data(), len, static_cast<off_t>(offset));
  ::close(fd);
  EXPECT_EQ(n, static_cast<ssize_t>(len)) << path << " at " << offset;
  return b;
}

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

void expect_error(const std::function<void()>& fn, uprobe::Errc code, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no uprobe::Error thrown";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
        << "`" << p << "' not in: " << e.what();
  }
}

}  // namespace usdttest
